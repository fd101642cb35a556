"""`kit probe`: print the observed software identity of wherever it runs."""

from __future__ import annotations

from pathlib import Path

import click

from kit.model.errors import BadInput, CheckFailed
from kit.model.documents import dumps_pretty, read_json_file, require_valid
from kit.build.probe import identity_differences, observed_identity
from kit.build.installed import installed_differences, installed_versions, record_differences, source_distributions


@click.command(name="probe")
@click.option("--check-stack", "check_stack", type=click.Path(dir_okay=False, path_type=Path),
              help="A resolved stack document (e.g. /opt/rlk/stack.json); exit 1 if any pin differs.")
@click.option("--check-lock", "check_lock", type=click.Path(dir_okay=False, path_type=Path),
              help="A lock document (e.g. /opt/rlk/lock.json); exit 1 if any installed distribution or "
                   "installed file differs from it.")
@click.option("--source-root", "source_roots", multiple=True, metavar="NAME=PATH",
              help="Where a source is checked out (default /opt/rlk/src/NAME). Repeatable.")
@click.option("--no-conformance", is_flag=True, help="Skip the kernel-conformance fingerprint.")
@click.option("--json", "as_json", is_flag=True, help="Print the probe/v1 document.")
def command(check_stack, check_lock, source_roots, no_conformance, as_json):
    """Report git HEADs and trees of the baked sources, package versions, Python, torch, GPUs.

    \b
    Examples:
      kit probe --json                                   # inside an image
      kit probe --check-stack /opt/rlk/stack.json        # last step of every image build
      kit probe --check-stack stack.json --source-root vime=../vime --json   # exit 1 on a host: its python and pins are not the stack's
      kit probe --check-stack /opt/rlk/stack.json --check-lock /opt/rlk/lock.json
    """

    stack = None
    if check_stack is not None:
        stack = require_valid(read_json_file(check_stack), str(check_stack), "stack")
        if "extends" in stack:
            raise BadInput(f"{check_stack}: a resolved stack is needed (it still 'extends' {stack['extends']!r})")
    roots = None
    if source_roots:
        roots = {}
        for item in source_roots:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise BadInput(f"--source-root {item!r}: expected NAME=PATH")
            roots[name] = Path(path)
    observed = observed_identity(stack, source_roots=roots, include_conformance=not no_conformance)
    differences = identity_differences(observed, stack) if stack is not None else []
    if check_lock is not None:

        lock = require_valid(read_json_file(check_lock), str(check_lock), "lock")
        differences += (installed_differences(lock, installed_versions(), source_distributions())
                        + record_differences())
    if stack is not None or check_lock is not None:
        observed["differences"] = [{"field": f, "expected": e, "observed": o} for f, e, o in differences]
    if as_json:
        click.echo(dumps_pretty(observed), nl=False)
    else:
        click.echo(f"host {observed['hostname']}  python {observed['python']['version']}")
        for name, version in observed["packages"].items():
            click.echo(f"  {name:24} {version}")
        for src in observed["sources"]:
            state = "clean" if src["clean"] else ("modified" if src["clean"] is False else src.get("error", "?"))
            click.echo(f"  source {src['name']:17} {src['head']}  {state}")
        if observed["torch"]:
            t = observed["torch"]
            click.echo(f"  torch {t.get('version')} cuda={t.get('cuda')} hip={t.get('hip')}")
        if "conformance_fingerprint" in observed:
            fp = observed["conformance_fingerprint"]
            click.echo(f"  conformance fingerprint {fp if isinstance(fp, str) else 'MISSING: ' + str(fp.get('error'))}")
    if differences:
        shown = "; ".join(f"{f}: expected {e}, observed {o}" for f, e, o in differences)
        against = " and ".join(str(p) for p in (check_stack, check_lock) if p is not None)
        raise CheckFailed(f"{len(differences)} pin(s) differ from {against}: {shown}")
