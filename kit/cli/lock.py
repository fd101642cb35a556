"""`kit lock`: resolve each stack × platform into a hash lock under manifests/, or check for drift."""

from __future__ import annotations

import time

import click

from kit.cli._output import emit_json
from kit.model.errors import BadInput
from kit.build.resolve import Unreachable, default_find_links, resolve_lock
from kit.model.catalog import Catalog
from kit.model.documents import replace_document
from kit.model.lock import lock_differences, lock_file_name, lock_rule_problems, lock_sha256, platform_kind


@click.command(name="lock", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("stacks", nargs=-1, metavar="[STACK]...")
@click.option("--platform", "platforms", multiple=True, metavar="P",
              help="Only this platform (cuda, rocm, cpu, cuda-debian …). Repeatable. Default: every platform "
                   "of the stack except ROCm ones, whose index is named instead.")
@click.option("--check", is_flag=True, help="Re-resolve and compare with the committed locks; write nothing. "
              "Exit 1 on drift, 2 when the index cannot be reached.")
@click.option("--index", metavar="URL", help="Package index to resolve against (default: uv's, PyPI).")
@click.option("--extra-index", metavar="URL", help="A second index (with --index for ROCm torch).")
@click.option("--find-links", "find_links", multiple=True, metavar="DIR",
              help="Local wheel directory. Default: $PIP_FIND_LINKS (this host's pip configuration).")
@click.option("--json", "as_json", is_flag=True, help="Print one rlk-kit/lock-report/v1 document.")
def command(stacks, platforms, check, index, extra_index, find_links, as_json):
    """Hash-lock every distribution of every stack: manifests/lock-<stack>-<platform>.json.

    Each lock holds every package with its exact version and the sha256 of its wheel files for the
    platform's Python and wheel platform, and is judged by the CUDA/ROCm consistency rules (kit
    verify); a lock that fails them is not written. Without STACK: every stack complete enough to
    resolve (abstract layers with Python, platforms and packages included); with --check, every
    committed lock. Exit 0 ok, 1 drift or a rule failed, 2 bad input or no index.

    \b
    Examples:
      kit lock                                  # every stack, every non-ROCm platform
      kit lock vime-g11 --platform cuda
      kit lock --check --json                   # drift against the committed locks
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
                drift = lock_differences(committed[0], lock)
                entry["drift"] = drift
                stale = lock_sha256(committed[0]) != entry["lock_sha256"]
                entry["status"] = "drift" if stale or any(drift.values()) else "ok"
                failed |= entry["status"] != "ok"
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
    report = {"schema": "rlk-kit/lock-report/v1", "check": check, "results": results}
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
            for kind, items in (r.get("drift") or {}).items():
                for item in items:
                    click.echo(f"    {kind}: {item}")
    if unreachable:
        raise click.exceptions.Exit(2)
    if failed:
        raise click.exceptions.Exit(1)


def _complete(catalog, name: str) -> bool:
    """A stack that can be resolved: it (after extends) has platforms, python and packages."""
    try:
        doc = catalog.stack(name).document
    except BadInput:
        return False
    return all(doc.get(k) for k in ("platforms", "python", "packages"))
