"""`kit compare A B`: declared factors versus uncontrolled differences."""

from __future__ import annotations

from pathlib import Path

import click

from kit.cli._output import emit_json
from kit.evidence.compare import PINNED, compare_arms, compare_run_dirs
from kit.model.catalog import Catalog
from kit.model.errors import BadInput


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("a")
@click.argument("b")
@click.option("--key", "public_key", type=click.Path(path_type=Path, dir_okay=False),
              help="Runs: both seals must be signed with this public key (ECDSA P-256 or ed25519 PEM; kit keys new).")
@click.option("--require-signature", is_flag=True, help="Runs: an unsigned seal makes the comparison not controlled.")
@click.option("--accept-gate-sets", is_flag=True, help="Runs: accept verdicts of different gate-set versions as a "
              "declared difference instead of an uncontrolled one.")
@click.option("--require-pinned", is_flag=True, help="Runs: exit 1 unless both ran their stack's pinned lock "
              "(provenance pinned); a same-host comparison is no evidence about the stack.")
@click.option("--json", "as_json", is_flag=True, help="Print one rlk-kit/comparison/v4 document.")
def command(a, b, public_key, require_signature, accept_gate_sets, require_pinned, as_json):
    """Compare two arms (names or files) or two run directories.

    Every differing field of stack and arm (for runs: also observed identity, image, topology and
    workload) is classified as a declared factor or uncontrolled. Runs must have succeeded, been
    sealed and verify now (both are re-hashed), and have been judged by the same gate set: anything
    else makes the comparison not controlled. Each run's trust level (unsigned, signed, trusted)
    is stated, and the provenance of the runs' identity: pinned (both ran the image built from their
    stack's lock, every package and source as locked) or same-host (evidence about these two runs on
    this host, not about the stack).
    Exit 0 when only declared factors differ (and, with --require-pinned, both runs are pinned),
    1 otherwise, 2 for unreadable input.

    \b
    Examples:
      kit compare manifests/G10.json manifests/G11.json     # exit 1: pins and backend uncontrolled
      kit compare native consistency                        # exit 0: only operators differ
      kit compare .workspace/runs/r1 .workspace/runs/r2
      kit compare --key seal.pub .workspace/runs/r1 .workspace/runs/r2
      kit compare --require-pinned .workspace/runs/r1 .workspace/runs/r2   # exit 1: when not both are pinned
    """
    if Path(a).is_dir() or Path(b).is_dir():
        # one run directory makes it a comparison of runs: the other argument must be one too
        for name, value in (("A", a), ("B", b)):
            if not Path(value).is_dir():
                what = "does not exist" if not Path(value).exists() else "is not a directory"
                other = "B" if name == "A" else "A"
                raise BadInput(f"argument {name} ({value}): {what}; {other} is a run directory, so {name} must be "
                               "one too (<workspace>/runs/<run-id>)")
        result = compare_run_dirs(Path(a), Path(b), public_key=public_key, require_signature=require_signature,
                                  accept_gate_sets=accept_gate_sets)
    else:
        if require_pinned:
            raise BadInput("--require-pinned: applies to two run directories (<workspace>/runs/<run-id>); "
                           f"{a} and {b} are arms, which have no observed identity")
        catalog = Catalog.default()
        result = compare_arms(catalog.arm_ref(a), catalog.arm_ref(b))
    if as_json:
        emit_json(result.to_json())
    else:
        verdict = "controlled" if result.controlled else "NOT a controlled comparison"
        click.echo(f"{result.a} vs {result.b}: {verdict}" + (f", {result.provenance}" if result.provenance else ""))
        if result.provenance:
            click.echo(f"  {result.scope()}")
        if result.declared_factors:
            click.echo(f"declared factors: {', '.join(result.declared_factors)}")
        width = max((len(d.path) for d in result.differences), default=4)
        for d in result.differences:
            click.echo(f"  {d.status:<12} {d.path:<{width}}  {_short(d.a)}  ->  {_short(d.b)}")
        for ev in result.evidence:
            click.echo(f"  evidence {ev['trust']:<9} {'verified' if ev['verified'] else 'FAILS kit verify'}  "
                       f"gate set {ev['gate_set_version']}  {ev['run']}")
        for run in result.not_comparable:
            click.echo(f"  not comparable: {run['reason']}")
        for run in result.identity:
            if not run["pinned"]:
                click.echo(f"  not pinned: {run['run']}: {'; '.join(run['reasons'])}")
        for note in result.notes:
            click.echo(f"note: {note}")
        if require_pinned and result.provenance != PINNED:
            click.echo("--require-pinned: the runs are same-host, not pinned: no evidence about the stack")
    if not result.controlled or (require_pinned and result.provenance != PINNED):
        raise click.exceptions.Exit(1)


def _short(value) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."
