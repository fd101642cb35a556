"""The build context of an image: everything its Dockerfile COPYs, each file with its identity.

Sources exported at their pins, patches by sha256, the kit's own source, the host wheelhouse
(cpu). Example::

    collected = collect_context(stack_doc, "cpu", workspace=Path(".workspace"))
    [entry.path for entry in collected.entries]     # ["docker/Dockerfile.cpu", "stack.json", …]
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kit.build.plan import DOCKERFILES, ContextEntry, patch_context_path
from kit.build.sources import _git, export_commit, locate_source
from kit.model.catalog import Catalog, default_manifests_dir
from kit.model.documents import dumps_pretty, sha256_of_file
from kit.model.errors import BadInput
from kit.model.lock import hashed_requirements, install_files, lock_sha256, platform_kind, platform_tags

REPO_ROOT = Path(__file__).resolve().parents[2]
# The user:password part of a remote URL, kept out of the source label.
_URL_USERINFO_RE = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", re.IGNORECASE)


@dataclass
class CollectedContext:
    entries: list[ContextEntry] = field(default_factory=list)
    commit_dates: dict[str, int] = field(default_factory=dict)
    sources_from: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def collect_context(stack_doc: dict, platform: str, *, workspace: Path, overrides: dict[str, Path] | None = None,
                    manifests_dir: Path | None = None, dry_run: bool = False) -> CollectedContext:
    """Everything the Dockerfile COPYs, with identities; fetches/exports sources unless ``dry_run``."""

    overrides = dict(overrides or {})
    manifests_dir = manifests_dir or _manifests_dir()
    out = CollectedContext()
    for rel in (DOCKERFILES[platform], "docker/bin/install-source", "docker/bin/entrypoint"):
        out.entries.append(ContextEntry.of_bytes(rel, (REPO_ROOT / rel).read_bytes(), 0o755 if "/bin/" in rel else 0o644))
    out.entries.append(ContextEntry.of_bytes("stack.json", dumps_pretty(stack_doc).encode()))
    # The lock enters the context (so the inputs sha256 and the tag) by its bytes: one changed hash, a new tag.
    lock = stack_lock(stack_doc["name"], platform, manifests_dir)
    if lock is not None:
        out.entries.append(ContextEntry.of_bytes("lock.json", dumps_pretty(lock).encode()))
        if platform_kind(platform) in ("cuda", "rocm"):   # what Dockerfile.cuda/.rocm install, and nothing else
            for name, text in install_files(lock).items():
                out.entries.append(ContextEntry.of_bytes(f"lock/{name}", text.encode()))
    elif platform_kind(platform) in ("cuda", "rocm"):
        out.problems.append(f"stack {stack_doc['name']!r} has no lock for {platform} in {manifests_dir}, and a "
                            f"{platform} image installs from its lock only; run `kit lock {stack_doc['name']} "
                            f"--platform {platform}` and commit the lock")
    else:
        out.notes.append(f"stack {stack_doc['name']!r} has no lock for {platform} in {manifests_dir}; "
                         f"run `kit lock {stack_doc['name']} --platform {platform}`")
    names = {s["name"] for s in stack_doc.get("sources", [])}
    for name in sorted(set(overrides) - names):
        raise BadInput(f"--source {name}: the stack {stack_doc['name']!r} has no source {name!r}; "
                       f"it has: {', '.join(sorted(names))}")
    for src in stack_doc.get("sources", []):
        name, commit = src["name"], src["commit"]
        # Patches first: they are host files named by the stack, checked whether or not the source
        # is fetched yet, so a dry run lists (and hashes) the same context as the build.
        for i, patch in enumerate(src.get("patches", [])):
            path = manifests_dir / patch["path"]
            if not path.is_file():
                stack_file, pointer = _patch_field(stack_doc, name, i, manifests_dir)
                raise BadInput(f"{stack_file}: {pointer}: patch file {path} is missing (source {name} pins it "
                               f"by sha256 {patch['sha256']}); put the patch there or change the stack")
            found = sha256_of_file(path)
            if found != patch["sha256"]:
                out.problems.append(f"source {name}: patch {path} has sha256 {found}, the stack pins {patch['sha256']}")
            out.entries.append(ContextEntry(patch_context_path(name, i, patch["path"]), 0o644, f"sha256:{found}",
                                            file=str(path)))
        repo = locate_source(src, overrides, workspace, fetch=not dry_run)
        if repo is None:
            out.entries.append(ContextEntry(f"sources/{name}/tree.tar", 0o644, f"git-commit:{commit}"))
            out.entries.append(ContextEntry(f"sources/{name}/commit", 0o644, f"git-commit:{commit}"))
            out.notes.append(f"source {name}: {commit} is not fetched yet ({src['repository']}); "
                             "its context files are listed by commit")
            continue
        export = export_commit(repo, commit, workspace / "sources" / "exports", name)
        out.sources_from[name] = str(repo)
        out.commit_dates[name] = export.commit_time
        out.entries.append(ContextEntry(f"sources/{name}/tree.tar", 0o644, f"git-commit:{commit}",
                                        file=str(export.tar_path)))
        # The raw object hashes to the commit, so it is identified by the commit too.
        out.entries.append(ContextEntry(f"sources/{name}/commit", 0o644, f"git-commit:{commit}",
                                        data=export.commit_object))
    out.entries.append(ContextEntry.of_bytes("patches/.keep", b""))
    out.entries.extend(_kit_source_entries())
    if platform == "cpu":
        if lock is None:
            raise BadInput(f"stack {stack_doc['name']!r}: a cpu image installs from its lock only, and "
                           f"{manifests_dir} has none; run `kit lock {stack_doc['name']} --platform cpu`")
        out.entries.extend(_wheelhouse_entries(lock, workspace, dry_run, out))
    return out


def _manifests_dir() -> Path:

    return default_manifests_dir()


def _patch_field(stack_doc: dict, source_name: str, index: int, manifests_dir: Path) -> tuple[str, str]:
    """(stack file, JSON pointer) where patch ``index`` of a source is written, following ``extends``."""

    fallback = (f"stack {stack_doc.get('name')!r}", f"sources[name={source_name}]/patches/{index}/path")
    try:
        catalog = Catalog.load(manifests_dir)
    except BadInput:
        return fallback

    def find(name: str, seen: tuple = ()) -> tuple[str, str] | None:
        entry = catalog.stack_docs.get(name)
        if entry is None or name in seen:
            return None
        raw, file = entry
        for i, src in enumerate(raw.get("sources", [])):
            if src.get("name") == source_name:   # a layer's source replaces its parents' whole
                return (file, f"/sources/{i}/patches/{index}/path") if len(src.get("patches", [])) > index else None
        parents = raw.get("extends", [])
        for parent in reversed([parents] if isinstance(parents, str) else list(parents)):
            found = find(parent, seen + (name,))
            if found:
                return found
        return None

    return find(stack_doc.get("name", "")) or fallback


def kit_checkout() -> tuple[str | None, str | None]:
    """(origin URL, revision) of the kit's own checkout; None for each when unknown.

    The revision is ``git rev-parse HEAD``, with ``-dirty`` when tracked or untracked (not ignored)
    files differ from it; the URL loses any user:password part.
    """

    def git(*args: str) -> str | None:
        try:
            proc = _git(REPO_ROOT, *args, check=False)
        except OSError:   # no git at all
            return None
        return proc.stdout.decode(errors="replace").strip() if proc.returncode == 0 else None

    head = git("rev-parse", "--verify", "HEAD^{commit}")
    if not head:
        return None, None
    url = git("remote", "get-url", "origin") or None
    if url:
        url = _URL_USERINFO_RE.sub(r"\1", url)
    status = git("status", "--porcelain", "--untracked-files=normal")
    return url, head + ("-dirty" if status is None or status else "")


def _kit_source_entries() -> list[ContextEntry]:
    """The kit's own source (pyproject, kit/, kernels/): tracked and untracked-not-ignored files."""
    proc = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-co", "--exclude-standard", "-z", "kit", "kernels"],
                          capture_output=True)
    if proc.returncode == 0:
        rels = sorted({p for p in proc.stdout.decode().split("\0") if p and (REPO_ROOT / p).is_file()})
    else:  # not a checkout (an sdist): walk, skipping caches
        rels = sorted(str(p.relative_to(REPO_ROOT)) for d in ("kit", "kernels") for p in (REPO_ROOT / d).rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts)
    out = []
    for rel in ["pyproject.toml", "README.md", *rels]:
        path = REPO_ROOT / rel
        if path.is_file():
            out.append(ContextEntry.of_bytes(f"kit-src/{rel}", path.read_bytes()))
    return out


def stack_lock(stack_name: str, platform: str, manifests_dir: Path) -> dict | None:
    """The committed lock of a stack's platform (manifests/lock-<stack>-<platform>.json), or None."""

    entry = Catalog.load(manifests_dir).lock(stack_name, platform)
    return entry[0] if entry else None


def _wheelhouse_entries(lock: dict, workspace: Path, dry_run: bool, out: CollectedContext) -> list[ContextEntry]:
    """The lock's files, downloaded once by their sha256 (pip --require-hashes --no-deps)."""

    reqs = hashed_requirements(lock)
    key = lock_sha256(lock)[:16]
    directory = workspace / "wheelhouse" / key
    sums = directory / "SHA256SUMS"
    if not sums.is_file():
        if dry_run:
            out.notes.append(f"wheelhouse {directory} is not downloaded yet; the inputs sha256 will change when it is")
            return [ContextEntry("wheelhouse/", 0o755, "pending:" + key)]
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "requirements.lock").write_text(reqs)
        py = lock["target"]["python"].split(".")
        platforms = [a for tag in platform_tags(lock["target"]["python_platform"]) for a in ("--platform", tag)]
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                               "--only-binary=:all:", "--python-version", f"{py[0]}.{py[1]}", *platforms,
                               "--dest", str(directory), "-r", str(directory / "requirements.lock")],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise BadInput(f"pip download into {directory} failed: {proc.stderr.strip()[-800:]}")
        lines = []
        for wheel in sorted(directory.glob("*.whl")):
            lines.append(f"{hashlib.sha256(wheel.read_bytes()).hexdigest()}  {wheel.name}\n")
        sums.write_text("".join(lines))
    entries = []
    for line in sums.read_text().splitlines():
        digest, name = line.split("  ", 1)
        entries.append(ContextEntry(f"wheelhouse/{name}", 0o644, f"sha256:{digest}", file=str(directory / name)))
    entries.append(ContextEntry.of_bytes("wheelhouse/requirements.lock", reqs.encode()))
    return entries

