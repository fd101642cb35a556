"""The build context of the ``cuda-debian`` platform: a CUDA image on the kit's own Debian base.

No registry is needed: the base is made locally (docker/make-base-image.sh), the CUDA user space
is the lock's ``nvidia-*-cu12`` wheels, and the driver comes from the host at run time. The
context holds what is small (Dockerfile, scripts, stack, lock, one hash-pinned requirements file
per layer, the source archives, the kit); the wheels are checked here and served to the build
(:mod:`kit.build.wheelhouse`, :mod:`kit.build.wheel_server`). Sources come from a source cache of
``git archive`` tarballs (``--sources DIR``), whose commit and recomputed tree were checked before
this runs; a check is remembered by the archive's sha256, so a second build does not unpack it
again. Example::

    collected, served = collect_cuda_debian(stack_doc, lock, workspace=ws, sources_dir=Path("/src"),
                                            wheel_dirs=[Path("/cache/wheelhouse")])
    [e.path for e in collected.entries]   # ["docker/cuda-debian/Dockerfile", "layers/1-cuda.txt", …]
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kit.build.context import REPO_ROOT, CollectedContext, _kit_source_entries
from kit.build.plan import ContextEntry
from kit.build.source_cache import CachedSource, find_cached, inspect_cached
from kit.build.wheelhouse import StatCache, layer_groups, locate_wheels
from kit.model.documents import dumps_pretty, schema_id
from kit.model.errors import BadInput

PLATFORM = "cuda-debian"
FILES = ("docker/cuda-debian/Dockerfile", "docker/cuda-debian/install-layer", "docker/cuda-debian/install-archive",
         "docker/bin/entrypoint", "docker/bin/install-source")
CHECK_SCHEMA = schema_id("source-check-cache")


class ArchiveChecks:
    """Commit and tree found in an archive, remembered by the archive's sha256 (source-check-cache/v1)."""

    def __init__(self, workspace: Path):
        self.path = workspace / "cache" / "source-checks.json"
        self.hashes = StatCache(workspace / "cache" / "source-hashes.json")
        self.entries: dict[str, dict] = {}
        if self.path.is_file():
            try:
                self.entries = json.loads(self.path.read_text()).get("entries", {})
            except (OSError, ValueError):
                self.entries = {}

    def inspect(self, name: str, path: Path) -> CachedSource:
        if path.is_dir():
            return inspect_cached(name, path)
        digest = self.hashes.sha256(path)
        self.hashes.save()
        known = self.entries.get(digest)
        if known:
            return CachedSource(name, path, known["commit"], known["tree"])
        found = inspect_cached(name, path)
        if found.commit and found.tree:
            self.entries[digest] = {"commit": found.commit, "tree": found.tree}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(dumps_pretty({"schema": CHECK_SCHEMA, "entries": self.entries}))
            os.replace(tmp, self.path)
        return found


def collect_cuda_debian(stack_doc: dict, lock: dict | None, *, workspace: Path, sources_dir: Path | None,
                        wheel_dirs: list[Path], dry_run: bool = False,
                        progress=None) -> tuple[CollectedContext, dict[str, Path]]:
    """(the context, ``{wheel file name: checked path}`` to serve); BadInput naming what is missing."""
    name = stack_doc["name"]
    if lock is None:
        raise BadInput(f"stack {name!r}: a {PLATFORM} image installs from its lock only; run "
                       f"`kit lock {name} --platform {PLATFORM}`")
    out = CollectedContext()
    for rel in FILES:
        out.entries.append(ContextEntry.of_bytes(rel, (REPO_ROOT / rel).read_bytes(), 0o755 if "/Dockerfile" not in rel
                                                 else 0o644))
    out.entries.append(ContextEntry.of_bytes("stack.json", dumps_pretty(stack_doc).encode()))
    out.entries.append(ContextEntry.of_bytes("lock.json", dumps_pretty(lock).encode()))
    for group in layer_groups(lock):
        out.entries.append(ContextEntry.of_bytes(f"layers/{group.name}.txt", group.requirements().encode()))
    out.entries.extend(_source_entries(stack_doc, workspace, sources_dir, out))
    out.entries.extend(_kit_source_entries())
    served: dict[str, Path] = {}
    if not dry_run:
        served = locate_wheels(lock, wheel_dirs, workspace=workspace, progress=progress)
    else:
        out.notes.append(f"dry run: the {len(lock['packages'])} locked distributions are found and checked by sha256 "
                         "when the image is built")
    return out, served


def _source_entries(stack_doc: dict, workspace: Path, sources_dir: Path | None, out: CollectedContext) -> list:
    sources = stack_doc.get("sources", [])
    if not sources:
        return [ContextEntry.of_bytes("sources/sources.txt", b"")]
    if sources_dir is None:
        raise BadInput(f"platform {PLATFORM} bakes sources from a source cache of `git archive` tarballs: give "
                       "--sources DIR (or $KIT_SOURCES)")
    checks = ArchiveChecks(workspace)
    lines, entries = [], []
    for src in sources:
        name = src["name"]
        if src.get("patches"):
            raise BadInput(f"source {name}: platform {PLATFORM} bakes archives unpatched; the stack patches it")
        if not src.get("tree"):
            raise BadInput(f"source {name}: platform {PLATFORM} proves an archive by its git tree; the stack must "
                           "pin sources[].tree")
        path = find_cached(name, sources_dir)
        if path is None or path.is_dir():
            raise BadInput(f"source {name}: {sources_dir} holds no `git archive` tarball {name}-*.tar.gz")
        found = checks.inspect(name, path)
        if found.commit != src["commit"] or found.tree != src["tree"]:
            raise BadInput(f"source {name}: {path} holds commit {found.commit} tree {found.tree}; the stack pins "
                           f"commit {src['commit']} tree {src['tree']}")
        file = f"{name}.tar.gz"
        entries.append(ContextEntry(f"sources/{file}", 0o644, "sha256:" + checks.hashes.sha256(path), file=str(path)))
        lines.append(f"{name} {src['commit']} {src['tree']} {file}\n")
        out.sources_from[name] = str(path)
        out.commit_dates[name] = 0
    entries.append(ContextEntry.of_bytes("sources/sources.txt", "".join(lines).encode()))
    out.commit_dates.clear()   # an archive's date is not read: the epoch stays the fixed one
    return entries


def sources_check(workspace: Path):
    """The cached inspector for :func:`kit.build.source_cache.source_cache_problems`."""
    return ArchiveChecks(workspace).inspect
