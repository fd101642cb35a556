"""A local source cache (``--sources DIR``): `git archive` tarballs or checkouts, checked before any layer.

An archive ``<name>-<anything>.tar.gz`` (or ``.tar``) holds its commit id in the pax global header
(``git get-tar-commit-id``); its tree hash is recomputed from the unpacked files (``git add -A;
git write-tree``), so an archive renamed, repacked or edited is seen. A directory ``<name>`` is a
checkout or bare repository. :func:`source_cache_problems` names, for every source of a stack,
what is missing or different, so a build stops before its first layer. Example::

    problems = source_cache_problems(stack_doc, Path("/work/shared/sources"))
    # ["source rl-kernel: pinned at d2173e8…; /…/rl-kernel-202f0e30.tar.gz holds commit 202f0e30… (tree bd7e22b5…)", …]
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C", "GIT_AUTHOR_NAME": "kit", "GIT_AUTHOR_EMAIL": "kit@localhost",
            "GIT_COMMITTER_NAME": "kit", "GIT_COMMITTER_EMAIL": "kit@localhost"}


@dataclass(frozen=True)
class CachedSource:
    name: str
    path: Path
    commit: str | None     # from the pax header (archive) or HEAD (checkout)
    tree: str | None       # recomputed from the files


def _git(cwd: Path, *args: str, stdin: bytes | None = None) -> str:
    proc = subprocess.run(["git", "-c", "safe.directory=*", "-c", "core.autocrlf=false", *args], cwd=cwd, input=stdin,
                          capture_output=True, env={**os.environ, **_GIT_ENV})
    return proc.stdout.decode().strip() if proc.returncode == 0 else ""


def archive_commit(path: Path) -> str | None:
    """The commit id `git archive` wrote into the pax global header; None when there is none."""
    try:
        with tarfile.open(path, "r:*") as tar:
            member = tar.next()
            comment = (tar.pax_headers or {}).get("comment") or (member.pax_headers.get("comment") if member else None)
    except (OSError, tarfile.TarError):
        return None
    return comment.strip() if comment and len(comment.strip()) == 40 else None


def archive_tree(path: Path) -> str | None:
    """The git tree hash of an archive's files (unpacked into a scratch repository)."""
    with tempfile.TemporaryDirectory(prefix="kit-tree-") as tmp:
        root = Path(tmp)
        try:
            with tarfile.open(path, "r:*") as tar:
                tar.extractall(root, filter="tar")
        except (OSError, tarfile.TarError):
            return None
        entries = [p for p in root.iterdir()]
        # `git archive --prefix=name/` puts everything under one directory: the tree is its contents.
        work = entries[0] if len(entries) == 1 and entries[0].is_dir() and not (root / ".git").exists() else root
        _git(work, "init", "-q")
        _git(work, "add", "-A", "-f")
        return _git(work, "write-tree") or None


def find_cached(name: str, cache: Path) -> Path | None:
    """``cache/<name>`` (checkout) or ``cache/<name>-*.tar.gz`` / ``.tar`` (archive); None when absent."""
    if (cache / name).is_dir():
        return cache / name
    for pattern in (f"{name}-*.tar.gz", f"{name}-*.tgz", f"{name}-*.tar", f"{name}.tar.gz"):
        found = sorted(cache.glob(pattern))
        if found:
            return found[0]
    return None


def inspect_cached(name: str, path: Path) -> CachedSource:
    if path.is_dir():
        return CachedSource(name, path, _git(path, "rev-parse", "HEAD") or None,
                            _git(path, "rev-parse", "HEAD^{tree}") or None)
    return CachedSource(name, path, archive_commit(path), archive_tree(path))


def source_cache_problems(stack_doc: dict, cache: Path, inspect=inspect_cached) -> list[str]:
    """One line per source that is missing, or whose commit or tree differs from the pin.

    ``inspect(name, path)`` may remember what it found (kit.build.cuda_debian.ArchiveChecks).
    """
    problems = []
    for src in stack_doc.get("sources", []):
        name, pin, tree_pin = src["name"], src["commit"], src.get("tree")
        if src.get("patches"):
            tree_pin = None   # the pinned tree is the patched one; the commit's own tree is checked in the image
        path = find_cached(name, cache)
        if path is None:
            problems.append(f"source {name}: no archive or checkout of {src['repository']} at {pin} in {cache} "
                            f"(looked for {name}/ and {name}-*.tar.gz); put one there or pass --source {name}=PATH")
            continue
        found = inspect(name, path)
        wrong = []
        if found.commit != pin:
            wrong.append(f"holds commit {found.commit or 'unknown (no pax commit header)'}")
        if tree_pin and found.tree != tree_pin:
            wrong.append(f"has tree {found.tree}, the stack pins tree {tree_pin}")
        elif found.commit != pin and found.tree:
            wrong.append(f"tree {found.tree}")
        if wrong:
            problems.append(f"source {name}: the stack pins commit {pin}; {path} " + ", ".join(wrong))
    return problems
