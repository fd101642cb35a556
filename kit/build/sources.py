"""Sources for an image build: find each pinned commit on the host and export it for the context.

The image build never fetches anything: `kit build` finds every stack source here (a ``--source
NAME=PATH`` checkout or bare repository, a fixture made by ``kit.smoke_sources``, or a fetch of the
repository URL into the workspace cache), checks that it is at the pin, and exports the commit as a
deterministic tar plus the raw commit object. Inside the image ``docker/bin/install-source``
rebuilds a one-commit repository from them whose ``git rev-parse HEAD`` is the pin again. Example::

    repo = locate_source(src, {"vime": Path("../vime")}, workspace)
    export = export_commit(repo, src["commit"], workspace / "sources" / "exports")
    export.tar_path, export.commit_time
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from kit.build.plan import CONTEXT_MTIME
from kit.model.errors import BadInput, CheckFailed
import shutil
from kit.build import smoke_sources

_GIT = ["git", "-c", "safe.directory=*", "-c", "core.autocrlf=false"]


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}
    proc = subprocess.run([*_GIT, "-C", str(repo), *args], capture_output=True, env=env)
    if check and proc.returncode != 0:
        raise BadInput(f"{repo}: git {' '.join(args)} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc


@dataclass(frozen=True)
class SourceExport:
    name: str
    commit: str
    tar_path: Path
    commit_object: bytes   # `git cat-file commit <sha>`: hashing it gives the commit SHA back
    commit_time: int       # committer timestamp (seconds)


def parse_source_overrides(values: tuple[str, ...] | list[str]) -> dict[str, Path]:
    """``("vime=../vime",)`` -> ``{"vime": Path("../vime")}``; BadInput naming ``--source`` otherwise."""
    out: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise BadInput(f"--source {value!r}: expected NAME=PATH (for example --source vime=../vime)")
        if name in out:
            raise BadInput(f"--source {name}: given twice")
        out[name] = Path(path)
    return out


def is_bare_repository(repo: Path) -> bool:
    """True for a bare repository; False for a checkout or anything git does not recognise."""
    proc = _git(repo, "rev-parse", "--is-bare-repository", check=False)
    return proc.returncode == 0 and proc.stdout.decode().strip() == "true"


def check_at_pin(name: str, repo: Path, pin: str) -> None:
    """A checkout's HEAD must be the pin and its worktree clean; a bare repository (a mirror, which has
    no worktree to be at a commit) must hold the pin. CheckFailed / BadInput otherwise."""
    if not repo.exists():
        raise BadInput(f"--source {name}={repo}: no such directory")
    if is_bare_repository(repo):
        if _git(repo, "cat-file", "-e", f"{pin}^{{commit}}", check=False).returncode != 0:
            raise CheckFailed(f"source {name}: the bare repository {repo} does not hold the pinned commit {pin}; "
                              f"fetch it there (git -C {repo} fetch ORIGIN {pin})")
        return
    proc = _git(repo, "rev-parse", "--verify", "HEAD^{commit}", check=False)
    if proc.returncode != 0:
        raise BadInput(f"--source {name}={repo}: not a git repository with a commit "
                       f"({proc.stderr.decode(errors='replace').strip()})")
    head = proc.stdout.decode().strip()
    if head != pin:
        raise CheckFailed(f"source {name}: {repo} is at commit {head}, the stack pins {pin}")
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=normal").stdout.decode().strip()
    if dirty:
        first = dirty.splitlines()[0]
        raise BadInput(f"source {name}: {repo} has uncommitted changes ({first!r}, "
                       f"{len(dirty.splitlines())} path(s)); commit or stash them, a build bakes commits only")


def locate_source(src: dict, overrides: dict[str, Path], workspace: Path, *, fetch: bool = True) -> Path | None:
    """The host repository holding a source's pinned commit; None when it is not available (dry run)."""
    name, pin, repository = src["name"], src["commit"], src["repository"]
    if name in overrides:
        repo = overrides[name].resolve()
        check_at_pin(name, repo, pin)
        return repo
    if repository.startswith("fixture:"):

        fixture = repository.split(":", 1)[1]
        repo = workspace / "sources" / "fixtures" / fixture
        if not (repo / ".git").is_dir():
            if repo.exists():
                shutil.rmtree(repo)
            smoke_sources.materialize(fixture, repo)
        check_at_pin(name, repo, pin)
        return repo
    cache = workspace / "sources" / "cache" / f"{name}.git"
    if cache.is_dir() and _git(cache, "cat-file", "-e", f"{pin}^{{commit}}", check=False).returncode == 0:
        return cache
    if not fetch:
        return None
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "HEAD").exists():
        _git(cache, "init", "-q", "--bare")
    proc = _git(cache, "fetch", "-q", "--depth", "1", repository, pin, check=False)
    if proc.returncode != 0:
        raise BadInput(f"source {name}: cannot fetch {pin} from {repository} "
                       f"({proc.stderr.decode(errors='replace').strip()[:300]}); "
                       f"pass a local checkout with --source {name}=PATH")
    return cache


def export_commit(repo: Path, commit: str, out_dir: Path, name: str = "") -> SourceExport:
    """Export ``commit`` as ``<out_dir>/<commit>.tar`` (made once; a function of the commit only)."""
    commit_object = _git(repo, "cat-file", "commit", commit).stdout
    commit_time = _committer_time(commit_object)
    out_dir.mkdir(parents=True, exist_ok=True)
    tar_path = out_dir / f"{commit}.tar"
    if not tar_path.exists():
        data = _tree_tar(repo, commit, name or str(repo))
        tmp = tar_path.with_name(f".{tar_path.name}.{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(tar_path)
    return SourceExport(name, commit, tar_path, commit_object, commit_time)


def _committer_time(commit_object: bytes) -> int:
    for line in commit_object.split(b"\n"):
        if line.startswith(b"committer "):
            return int(line.rsplit(b" ", 2)[1])
        if not line:
            break
    raise BadInput("commit object without a committer line")


def _tree_tar(repo: Path, commit: str, label: str) -> bytes:
    """Blob contents and modes straight from the object database: no attributes, filters or checkout."""
    listing = _git(repo, "ls-tree", "-r", "-z", "--full-tree", commit).stdout.split(b"\0")
    entries = []
    for raw in listing:
        if not raw:
            continue
        meta, path = raw.split(b"\t", 1)
        mode, kind, sha = meta.decode().split()
        if kind == "commit":
            raise BadInput(f"source {label}: {path.decode()} is a submodule (gitlink); "
                           "sources with submodules are not supported, pin the submodule as its own source")
        entries.append((path.decode("utf-8", "surrogateescape"), mode, sha))
    blobs = _cat_blobs(repo, [sha for _, _, sha in entries])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, mode, sha in sorted(entries):
            info = tarfile.TarInfo(path)
            info.mtime = CONTEXT_MTIME
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            data = blobs[sha]
            if mode == "120000":
                info.type = tarfile.SYMTYPE
                info.linkname = data.decode("utf-8", "surrogateescape")
                info.mode = 0o777
                tar.addfile(info)
            else:
                info.mode = 0o755 if mode == "100755" else 0o644
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _cat_blobs(repo: Path, shas: list[str]) -> dict[str, bytes]:
    unique = sorted(set(shas))
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    proc = subprocess.run([*_GIT, "-C", str(repo), "cat-file", "--batch"], input="".join(s + "\n" for s in unique).encode(),
                          capture_output=True, env=env, check=True)
    out, pos = {}, 0
    data = proc.stdout
    for sha in unique:
        nl = data.index(b"\n", pos)
        header = data[pos:nl].decode().split()
        size = int(header[2])
        out[sha] = data[nl + 1:nl + 1 + size]
        pos = nl + 1 + size + 1
    return out
