"""`kit lock`: resolve each stack × platform into a hash lock under manifests/, or check for drift."""

from __future__ import annotations

import time
from pathlib import Path

import click

from kit.cli._output import emit_json
from kit.model.errors import BadInput
from kit.build.resolve import Unreachable, default_find_links, resolve_lock
from kit.model.catalog import Catalog
from kit.model.documents import replace_document, sha256_of_file
from kit.model.lock import (index_drift, local_wheel_problems, lock_file_name, lock_rule_problems, lock_sha256,
                            pinned_requirements, platform_kind, served_problems)


@click.command(name="lock", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("stacks", nargs=-1, metavar="[STACK]...")
@click.option("--platform", "platforms", multiple=True, metavar="P",
              help="Only this platform (cuda, rocm, cpu, cuda-debian …). Repeatable. Default: every platform "
                   "of the stack except ROCm ones, whose index is named instead.")
@click.option("--check", is_flag=True, help="Check the committed locks; write nothing. Exit 1 when a lock no longer "
              "installs (a locked version or file no longer served, a sha256 changed, a locally built wheel that "
              "differs); newer releases a resolver would now pick are listed as drift. 2 when the index cannot be reached.")
@click.option("--strict", is_flag=True, help="With --check: drift fails too (exit 1).")
@click.option("--index", metavar="URL", help="Package index to resolve against (default: uv's, PyPI).")
@click.option("--extra-index", metavar="URL", help="A second index (with --index for ROCm torch).")
@click.option("--find-links", "find_links", multiple=True, metavar="DIR",
              help="Local wheel directory. Default: $PIP_FIND_LINKS (this host's pip configuration).")
@click.option("--json", "as_json", is_flag=True, help="Print one rlk-kit/lock-report/v2 document.")
def command(stacks, platforms, check, strict, index, extra_index, find_links, as_json):
    """Hash-lock every distribution of every stack: manifests/lock-<stack>-<platform>.json.

    Each lock holds every package with its exact version and the sha256 of its wheel files for the
    platform's Python and wheel platform, and is judged by the CUDA/ROCm consistency rules (kit
    verify); a lock that fails them is not written. Without STACK: every stack complete enough to
    resolve (abstract layers with Python, platforms and packages included); with --check, every
    committed lock. Exit 0 ok (with --check: every lock still installs as locked, drift listed), 1 a lock
    that no longer installs, drift with --strict, or a rule failed; 2 bad input or no index.

    \b
    Examples:
      kit lock                                  # every stack, every non-ROCm platform
      kit lock vime-g11 --platform cuda
      kit lock --check                          # does every committed lock still install? (drift listed)
      kit lock --check --strict --json          # drift fails too
      kit lock smoke --find-links /opt/wheels
    """

    catalog = Catalog.default()
    if check and not stacks:   # the committed locks, each against its stack
        names = sorted({stack for stack, _ in catalog.lock_docs})
        platforms = platforms or tuple(sorted({p for _, p in catalog.lock_docs}))
    else:
        names = list(stacks) or [n for n in sorted(catalog.stack_docs) if _complete(catalog, n)]
    links = list(find_links) or default_find_links()
    results, failed, unreachable = [], False, []
    for name in names:
        doc = catalog.stack(name).document
        wanted = [p for p in platforms if p in doc.get("platforms", {}) and (not check or stacks or catalog.lock(name, p))]
        wanted = wanted if platforms else [p for p in sorted(doc.get("platforms", {})) if platform_kind(p) != "rocm"]
        for platform in wanted:
            entry = {"stack": name, "platform": platform, "file": str(catalog.directory / lock_file_name(name, platform))}
            committed = catalog.lock(name, platform)
            if check and committed is None:
                entry.update(status="missing", message=f"no committed lock; run `kit lock {name} --platform {platform}`")
                failed = True
                results.append(entry)
                continue
            started = time.monotonic()
            try:
                lock = resolve_lock(doc, platform, index=index, extra_index=extra_index, find_links=links,
                                    progress=None if as_json else lambda m: click.echo(m, err=True))
            except Unreachable as exc:
                entry.update(status="unreachable", message=str(exc))
                unreachable.append(str(exc))
                results.append(entry)
                continue
            entry.update(seconds=round(time.monotonic() - started, 2), packages=len(lock["packages"]),
                         lock_sha256=lock_sha256(lock))
            problems = lock_rule_problems(lock, doc)
            if check:
                try:
                    entry.update(check_committed(committed[0], lock, doc, platform, strict=strict, index=index,
                                                 extra_index=extra_index, find_links=links))
                except Unreachable as exc:
                    entry.update(status="unreachable", message=str(exc))
                    unreachable.append(str(exc))
                failed |= entry["status"] in ("broken", "drift") and (entry["status"] == "broken" or strict)
            elif not problems:   # a lock that fails the rules is never written (fail closed)
                if committed and committed[0].get("note"):
                    lock["note"] = committed[0]["note"]   # a human's note survives a re-lock
                replace_document(entry["file"], lock, expected="lock")
                entry["status"] = "written"
            if problems:
                entry["status"] = "rules-failed"
                entry["problems"] = [f"{p}: {m}" for p, m in problems]
                failed = True
            results.append(entry)
    report = {"schema": "rlk-kit/lock-report/v2", "check": check, "strict": strict, "results": results}
    if as_json:
        emit_json(report)
    else:
        for r in results:
            head = f"{r['status'].upper():12} {r['stack']} {r['platform']}"
            if "packages" in r:
                head += f": {r['packages']} packages, lock {r['lock_sha256'][:12]} in {r['seconds']} s"
            click.echo(head)
            for line in r.get("problems", []) + ([r["message"]] if "message" in r else []):
                click.echo(f"    {line}")
            for line in r.get("not_served", []):
                click.echo(f"    not served as locked: {line}")
            for line in r.get("notes", []):
                click.echo(f"    note: {line}")
            for kind, items in (r.get("drift") or {}).items():
                for item in items:
                    click.echo(f"    {kind}: {item}")
    if unreachable:
        raise click.exceptions.Exit(2)
    if failed:
        raise click.exceptions.Exit(1)


def check_committed(committed: dict, fresh: dict, stack_doc: dict, platform: str, *, strict: bool, index, extra_index,
                    find_links: list[str]) -> dict:
    """How a committed lock stands against the index today: ``broken`` when it no longer installs as
    locked, ``drift`` when a resolver would now pick other versions (fails only with --strict), else ``ok``."""
    drift = index_drift(committed, fresh)
    problems, notes = local_wheel_problems(committed, _supplied_wheels(find_links))
    not_served = []
    if any(drift.values()):   # the fresh resolution differs: are the locked versions and files still served?
        served = resolve_lock(stack_doc, platform, index=index, extra_index=extra_index, find_links=find_links,
                              requirements=pinned_requirements(committed))
        not_served = served_problems(committed, served)
    status = "broken" if problems or not_served else "drift" if any(drift.values()) else "ok"
    out = {"status": status, "drift": drift, "not_served": not_served + problems, "notes": notes}
    if status == "drift":
        out["message"] = ("every locked file is still served as locked: the lock installs; a resolver would now pick "
                          "the versions listed" + (" (--strict: fails)" if strict else ""))
    return out


def _supplied_wheels(find_links: list[str]) -> dict[str, str]:
    """File name -> sha256 of every wheel in the --find-links directories (locally built ones are checked by it)."""
    out = {}
    for link in find_links:
        root = Path(link.removeprefix("file://"))
        if root.is_dir():
            for wheel in sorted(root.glob("*-linux_*.whl")):
                out.setdefault(wheel.name, sha256_of_file(wheel))
    return out


def _complete(catalog, name: str) -> bool:
    """A stack that can be resolved: it (after extends) has platforms, python and packages."""
    try:
        doc = catalog.stack(name).document
    except BadInput:
        return False
    return all(doc.get(k) for k in ("platforms", "python", "packages"))
