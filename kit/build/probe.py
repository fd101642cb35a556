"""Probe: the observed software identity of wherever it runs (host, container, Ray node).

One function, no engine: git HEAD and tree of each baked source, importlib.metadata versions,
Python, torch CUDA/HIP version, hashes of compiled extensions, GPUs, host name. It is the same
code the image runs as its last build step and that `kit run` runs in live containers and on each
Ray node. Example::

    observed = observed_identity(stack_doc)               # schema rlk-kit/probe/v1
    identity_differences(observed, stack_doc)             # [] when every pin holds
    # [("sources.vime.tree", "5c87…", "91ab…")] after a file of vime was edited
    extension_differences(observed, probe_at_build)       # compiled *.so against the build's own probe

Git runs with a temporary index and object directory, so probing never writes into the sources
(they may be read-only) and never depends on the repository's own index.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from kit.adapters.gpus import list_gpus
from kit.build.layout import SOURCES_DIR
import importlib.util
from kit import __version__
from kit.model.documents import sha256_of_document
from kit.model.stack import packages_for, stack_identity
from kit.build.layout import STACK_PATH
from importlib import metadata

BAKED_TREE_FILE = "rlk-baked-tree"   # written into .git/ by docker/bin/install-source
ARCHIVE_COMMIT_FILE = "rlk-archive-commit"   # docker/cuda-debian/install-archive: the archive's pax commit id


def observed_identity(stack: dict | None = None, *, source_roots: dict[str, Path | str] | None = None,
                      include_conformance: bool = True) -> dict:
    """The probe/v1 document of this Python process's environment.

    ``stack`` (a resolved stack document) names the packages and sources to report; without it
    every directory under /opt/rlk/src is reported. ``source_roots`` overrides where sources are.
    """

    # Without a stack, the one baked into the image (if any) says which packages and sources to report.
    names_from = stack if stack is not None else _embedded_stack()
    roots = _source_roots(names_from, source_roots)
    doc = {
        "schema": "rlk-kit/probe/v1",
        "observed_at": _observed_at(),
        "hostname": "" if os.environ.get("SOURCE_DATE_EPOCH") else socket.gethostname(),
        "kit_version": __version__,
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "packages": _package_versions(sorted(_package_names(names_from))),
        "freeze": _freeze(),
        "sources": [_source_identity(name, Path(path)) for name, path in sorted(roots.items())],
        "torch": _torch_identity(),
        "gpus": _gpus(),
    }
    if stack is not None:

        doc["stack"] = {"name": stack.get("name", ""), "sha256": sha256_of_document(stack_identity(stack))}
    if include_conformance:
        doc["conformance_fingerprint"] = _conformance_fingerprint()
    return doc


def identity_differences(observed: dict, stack: dict) -> list[tuple[str, str | None, str | None]]:
    """Every pin of ``stack`` that ``observed`` does not show, as (field, expected, observed).

    Versions compare exactly (no prefix or local-label tolerance). A source's tree is compared with
    the stack's ``tree`` when it names one, else with the tree recorded at build time, else with
    the commit's own tree, so an edited file shows up even when HEAD is unchanged.
    """
    out: list[tuple[str, str | None, str | None]] = []
    found_python = observed.get("python", {}).get("version")
    if stack.get("python") and found_python != stack["python"]:
        out.append(("python", stack["python"], found_python))

    packages = observed.get("packages", {})
    for name, version in sorted(packages_for(stack, observed_platform(observed)).items()):
        if packages.get(name) != version:
            out.append((f"packages.{name}", version, packages.get(name)))
    by_name = {s["name"]: s for s in observed.get("sources", [])}
    for src in stack.get("sources", []):
        name = src["name"]
        obs = by_name.get(name)
        if obs is None or obs.get("head") is None:
            why = (obs or {}).get("error", "not found")
            out.append((f"sources.{name}.commit", src["commit"], None if obs is None else f"unreadable: {why}"))
            continue
        if obs["head"] != src["commit"]:
            out.append((f"sources.{name}.commit", src["commit"], obs["head"]))
        expected_tree = src.get("tree") or obs.get("baked_tree") or obs.get("commit_tree")
        if obs.get("worktree_tree") != expected_tree:
            out.append((f"sources.{name}.tree", expected_tree, obs.get("worktree_tree")))
    return out


def extension_differences(observed: dict, at_build: dict) -> list[tuple[str, str | None, str | None]]:
    """Compiled extensions (``*.so`` under each source) that differ from the probe the image ran as its
    last build step, as (field, at build, now).

    Extensions are build outputs, usually git-ignored, so the source's tree cannot vouch for them;
    the build-time probe can. ``[("sources.rl-kernel.extensions.build/_C.so", "<sha>", None)]`` when
    one was removed, ``(…, None, "<sha>")`` when one was added.
    """
    built = {s["name"]: s.get("extensions") or {} for s in at_build.get("sources", [])}
    out = []
    for src in observed.get("sources", []):
        if src["name"] not in built:
            continue
        then, now = built[src["name"]], src.get("extensions") or {}
        for path in sorted(set(then) | set(now)):
            if then.get(path) != now.get(path):
                out.append((f"sources.{src['name']}.extensions.{path}", then.get(path), now.get(path)))
    return out


def observed_platform(observed: dict) -> str:
    """rocm when torch was built for HIP, cuda when for CUDA, else cpu: which platform's pins apply."""
    torch_id = observed.get("torch") or {}
    if torch_id.get("hip"):
        return "rocm"
    if torch_id.get("cuda"):
        return "cuda"
    return "cpu"


# --- pieces -----------------------------------------------------------------------------------

def _package_names(stack: dict | None) -> set[str]:
    names = set((stack or {}).get("packages", {}))
    for entry in (stack or {}).get("platforms", {}).values():
        names |= set(entry.get("packages", {}))
    return names


def _embedded_stack() -> dict | None:

    try:
        return json.loads(Path(STACK_PATH).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _observed_at() -> str:
    """Now; in a reproducible build step (SOURCE_DATE_EPOCH set, as the kit's Dockerfiles set it for
    the probe they bake in) the build's epoch instead, and no host name: the build container's name
    is random, and both would make the image's bytes depend on when and where it was built."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = datetime.fromtimestamp(int(epoch), tz=timezone.utc) if epoch and epoch.isdigit() else datetime.now(timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _source_roots(stack: dict | None, given: dict[str, Path | str] | None) -> dict[str, Path | str]:
    if given is not None:
        return dict(given)
    base = Path(SOURCES_DIR)
    if stack is not None:
        return {s["name"]: base / s["name"] for s in stack.get("sources", [])}
    if not base.is_dir():
        return {}
    return {p.name: p for p in sorted(base.iterdir()) if p.is_dir()}


def _package_versions(names: list[str]) -> dict[str, str | None]:

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _freeze() -> list[str]:

    seen = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return sorted(seen.values(), key=str.lower)


def _git(repo: Path, *args: str, env: dict | None = None) -> str:
    full = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C", **(env or {})}
    proc = subprocess.run(["git", "-c", "safe.directory=*", "-c", "core.autocrlf=false", "-C", str(repo), *args],
                          capture_output=True, env=full, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.decode(errors="replace").strip() or f"git {args[0]} failed")
    return proc.stdout.decode().strip()


def _source_identity(name: str, root: Path) -> dict:
    entry: dict = {"name": name, "path": str(root), "head": None, "commit_tree": None, "worktree_tree": None,
                   "baked_tree": None, "clean": None, "extensions": {}}
    if shutil.which("git") is None:
        entry["error"] = "git is not installed"
        return entry
    if not root.is_dir():
        entry["error"] = f"{root} does not exist"
        return entry
    try:
        git_dir = Path(_git(root, "rev-parse", "--absolute-git-dir"))
        archived = git_dir / ARCHIVE_COMMIT_FILE
        if archived.is_file():   # unpacked from a `git archive` tarball: no commit object, its tree pinned
            entry["head"] = archived.read_text().strip()
            entry["worktree_tree"] = _worktree_tree(root, git_dir, from_head=False)
        else:
            entry["head"] = _git(root, "rev-parse", "--verify", "HEAD^{commit}")
            entry["commit_tree"] = _git(root, "rev-parse", "HEAD^{tree}")
            entry["worktree_tree"] = _worktree_tree(root, git_dir)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        entry["error"] = str(exc)[:500]
        return entry
    baked = git_dir / BAKED_TREE_FILE
    if baked.is_file():
        entry["baked_tree"] = baked.read_text().strip()
    entry["clean"] = entry["worktree_tree"] == (entry["baked_tree"] or entry["commit_tree"])
    entry["extensions"] = _extension_hashes(root)
    return entry


def _worktree_tree(root: Path, git_dir: Path, from_head: bool = True) -> str:
    """Tree id of the files as they are now (tracked + untracked-not-ignored; every file of an
    unpacked archive, ``from_head=False``), without writing to the repo."""
    with tempfile.TemporaryDirectory(prefix="rlk-probe-") as tmp:
        objects = Path(tmp) / "objects"
        objects.mkdir()
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_OBJECT_DIRECTORY": str(objects),
               "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(git_dir / "objects")}
        if from_head:
            _git(root, "read-tree", "HEAD", env=env)
        _git(root, "add", "-A", *([] if from_head else ["-f"]), ".", env=env)
        return _git(root, "write-tree", env=env)


def _extension_hashes(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for fn in sorted(filenames):
            if fn.endswith(".so") or ".so." in fn:
                path = Path(dirpath) / fn
                out[str(path.relative_to(root))] = _sha256(path)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _torch_identity() -> dict | None:

    if importlib.util.find_spec("torch") is None:
        return None
    try:
        import torch
    except Exception as exc:  # a broken torch is itself an observation
        return {"version": None, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"version": torch.__version__, "cuda": getattr(torch.version, "cuda", None),
            "hip": getattr(torch.version, "hip", None), "cuda_available": bool(torch.cuda.is_available())}


def _gpus() -> list[dict]:
    return [{"vendor": g.vendor, "index": g.index, "name": g.name, "driver": g.driver, "uuid": g.uuid}
            for g in list_gpus().devices]


def _conformance_fingerprint():
    """The kernel-conformance fingerprint (64 hex), or ``{"error": why}`` when it cannot be computed.

    Never None: a probe asked for the fingerprint states why it has none (the kernels package is
    not installed, torch is missing, the oracle failed), so its absence is itself an observation.
    """
    try:
        from rlk_kernels.conformance import conformance_fingerprint
    except Exception as exc:  # ImportError, or torch failing to import underneath
        return {"error": f"rlk_kernels.conformance is not importable: {type(exc).__name__}: {exc}"[:300]}
    try:
        return conformance_fingerprint()
    except Exception as exc:  # reported, not hidden: a failing oracle is an observation
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
