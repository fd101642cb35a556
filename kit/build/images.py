"""Images: the only module that talks to the Docker engine (docker-py, classic builder).

Collects a build context (sources exported at their pins, patches, the kit, a wheelhouse for cpu),
turns it into a :class:`kit.build_plan.BuildPlan`, builds it with a progress display, writes a
build record, and checks existing images against a stack. Example::

    plan = plan_build(stack, "cpu", workspace=Path(".workspace"))
    result = build_image(plan, workspace=Path(".workspace"))
    check_image(result.tag, stack).matches                  # labels + embedded stack
    verify_image_by_probe(result.tag, stack).differences    # probe in a throwaway container
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from kit.build.plan import (DOCKERFILES, PLATFORMS, REVISION_LABEL, SOURCE_LABEL, BuildPlan,
                            ContextEntry, context_tar, make_plan, patch_context_path, pin_labels,
                            source_problems)
from kit.model.errors import BadInput, CheckFailed
from kit.build.layout import (ENTRYPOINT, LABEL_PREFIX, PROBE_AT_BUILD_PATH, PROBE_COMMAND, PROBE_STACK_ENV,
                              STACK_PATH)

REPO_ROOT = Path(__file__).resolve().parents[2]
_STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
# The user:password part of a remote URL, kept out of the source label.
_URL_USERINFO_RE = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", re.IGNORECASE)
ENGINE_HELP = ("start one with `nohup dockerd >/tmp/dockerd.log 2>&1 &` or scripts/ensure-docker.sh, "
               "or point DOCKER_HOST at a running engine")


# --- engine -----------------------------------------------------------------------------------

def engine():
    """A docker-py client whose engine answers; BadInput (exit 2) saying how to start one otherwise."""
    import docker

    try:
        client = docker.from_env(timeout=600)
        client.ping()
        return client
    except Exception as exc:  # DockerException, connection errors: all mean "no engine"
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise BadInput(f"no Docker engine answers at {where} ({type(exc).__name__}); {ENGINE_HELP}") from None


def _base_id_if_known(client, base_image: str) -> str | None:
    """The local id of a tagged base when an engine answers and holds it (a dry run asks, never needs:
    a short timeout, so an engine that does not answer cannot hold the dry run up)."""
    try:
        if client is None:
            import docker

            client = docker.from_env(timeout=5)
        return base_image_id(client, base_image)
    except Exception:   # no engine, no base, an engine error: the tag is then provisional
        return None


def base_image_id(client, base_image: str, *, stack_name: str = "", platform: str = "") -> str:
    """Local id of the base; BadInput saying how to make or load it when it is missing.

    The build never pulls (``pull=False``): a base named by digest must already be on the engine
    under that digest, as ``docker pull`` leaves it.
    """
    import docker

    try:
        return client.images.get(base_image).id
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:   # e.g. a malformed reference
        raise BadInput(f"base image {base_image}: the engine cannot look it up ({exc.explanation or exc})") from None
    where = f" (stack {stack_name!r}, platform {platform})" if stack_name else ""
    if base_image.startswith("rlk-kit/debian-base"):
        raise BadInput(f"base image {base_image}{where} is not on this engine; make it with docker/make-base-image.sh "
                       "(or scripts/ensure-docker.sh)")
    raise BadInput(f"base image {base_image}{where} is not on this engine and `kit build` never pulls; "
                   f"load it first: `docker pull {base_image}` where a registry is reachable, or on a host "
                   f"without one `docker load -i FILE` of an image saved there with `docker save` after that pull")


# --- stacks -----------------------------------------------------------------------------------

def stack_parts(stack) -> tuple[dict, str, str]:
    """(resolved document, sha256, name) from a kit.stack.Stack or a resolved stack dict."""
    if isinstance(stack, dict):
        from kit.model.documents import sha256_of_document
        from kit.model.stack import stack_identity

        return stack, sha256_of_document(stack_identity(stack)), stack["name"]
    return stack.document, stack.sha256, stack.name


# --- context ----------------------------------------------------------------------------------

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
    from kit.build.sources import export_commit, locate_source
    from kit.model.documents import dumps_pretty, sha256_of_file

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
    from kit.model.catalog import default_manifests_dir

    return default_manifests_dir()


def _patch_field(stack_doc: dict, source_name: str, index: int, manifests_dir: Path) -> tuple[str, str]:
    """(stack file, JSON pointer) where patch ``index`` of a source is written, following ``extends``."""
    from kit.model.catalog import Catalog

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
    from kit.build.sources import _git

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
    from kit.model.catalog import Catalog

    entry = Catalog.load(manifests_dir).lock(stack_name, platform)
    return entry[0] if entry else None


def _wheelhouse_entries(lock: dict, workspace: Path, dry_run: bool, out: CollectedContext) -> list[ContextEntry]:
    """The lock's files, downloaded once by their sha256 (pip --require-hashes --no-deps)."""
    from kit.model.lock import hashed_requirements, lock_sha256, platform_tags

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


# --- plan and build ---------------------------------------------------------------------------

def plan_build(stack, platform: str, *, workspace: Path, overrides: dict[str, Path] | None = None,
               dry_run: bool = False, client=None) -> BuildPlan:
    """The full plan for ``stack`` on ``platform``; no engine needed when ``dry_run``."""
    from kit import __version__

    stack_doc, stack_sha, name = stack_parts(stack)
    if platform not in PLATFORMS:
        raise BadInput(f"unknown platform {platform!r}; accepted: {', '.join(PLATFORMS)}")
    blocking = source_problems(stack_doc, platform)
    if blocking:
        raise BadInput(blocking[0])
    base_id = None
    entry = stack_doc["platforms"][platform]
    if not dry_run:
        # Before any source is fetched: a missing base stops the build whatever else is ready.
        local_id = base_image_id(client or engine(), entry["base_image"], stack_name=name, platform=platform)
        if entry.get("unresolved"):
            base_id = local_id   # a tag: its local id enters the inputs and a label
    elif entry.get("unresolved"):
        base_id = _base_id_if_known(client, entry["base_image"])
    collected = collect_context(stack_doc, platform, workspace=workspace, overrides=overrides, dry_run=dry_run)
    if dry_run and entry.get("unresolved") and base_id is None:
        collected.notes.append(f"the base {entry['base_image']} is a tag and no engine here holds it: its local id, "
                               "which a build adds to the inputs, is unknown, so this tag and inputs sha256 are "
                               "provisional")
    source_url, revision = kit_checkout()
    return make_plan(stack_doc, stack_sha, platform, collected.entries, kit_version=__version__,
                     commit_dates=collected.commit_dates, base_image_id=base_id, source_url=source_url,
                     revision=revision, extra_problems=collected.problems, notes=collected.notes)


@dataclass(frozen=True)
class BuildResult:
    tag: str
    image_id: str
    cached: bool
    steps: int
    durations_s: dict
    record_path: Path | None
    record: dict
    reused: bool = False     # the tag already held an image of these inputs: nothing was sent to the engine


def build_image(plan: BuildPlan, *, workspace: Path, client=None, nocache: bool = False, progress=None,
                arm: str | None = None, sources_from: dict[str, str] | None = None,
                plan_s: float | None = None) -> BuildResult:
    """Build ``plan`` on the engine, stream its log through ``progress(step, total, elapsed, text)``,
    and write the build record. CheckFailed (exit 1) when a build step fails.

    When ``plan.tag`` already names an image whose inputs label equals ``plan.inputs_sha256`` (and
    ``nocache`` is off) the context is not sent at all: the inputs sha256 covers the Dockerfile,
    every build arg, every context file and (unresolved bases) the base's local id, so the engine
    could only answer with the same image. ``plan_s`` (time spent planning) is added to the total.
    """
    if plan.problems:
        raise CheckFailed("; ".join(plan.problems))
    client = client or engine()
    started_here = time.monotonic()
    t0 = started_here - (plan_s or 0.0)   # the total counts planning too
    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    existing = None if nocache else _image_of_inputs(client, plan)
    if existing is not None:
        durations = {"lookup": round(time.monotonic() - started_here, 3)}
        if plan_s is not None:
            durations["plan"] = round(plan_s, 3)
        record = _build_record(plan, client, existing.id, started=started, t0=t0, durations=durations,
                               cached=True, steps=0, context=None, arm=arm, sources_from=sources_from)
        return BuildResult(plan.tag, existing.id, True, 0, record["durations_s"], write_build_record(record, workspace),
                           record, reused=True)
    tar = context_tar(plan.context)
    t_context = time.monotonic() - started_here
    network = "none" if plan.platform == "cpu" else None   # the cpu build is hermetic
    stream = client.api.build(fileobj=io.BytesIO(tar), custom_context=True, dockerfile=plan.dockerfile,
                              tag=plan.tag, buildargs=plan.build_args, labels=plan.labels, rm=True, forcerm=True,
                              nocache=nocache, pull=False, decode=True, network_mode=network)
    step, total, current, image_id = 0, 0, "", None
    hits: dict[int, bool] = {}
    log: list[str] = []
    for chunk in stream:
        if "error" in chunk:
            tail = "".join(log[-15:]).strip()
            reason = _failure_reason(log, chunk["error"])
            tail = "\n".join(tail.splitlines()[-(40 if os.environ.get("KIT_BUILD_VERBOSE") else 6):])
            raise CheckFailed(f"build of {plan.tag} failed at step {step}/{total} ({current[:80]}): {reason}\n{tail}")
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
        text = chunk.get("stream", "")
        if not text:
            continue
        log.append(text)
        for line in text.splitlines():
            m = _STEP_RE.match(line)
            if m:
                step, total, current = int(m.group(1)), int(m.group(2)), m.group(3)
                # Only steps that make layers can miss the cache (ARG/FROM print no "Using cache").
                hits[step] = not current.split(" ", 1)[0].upper() in ("RUN", "COPY", "ADD")
                if progress:
                    progress(step, total, time.monotonic() - t0, current)
            elif "Using cache" in line and step:
                hits[step] = True
    if image_id is None:
        image_id = client.images.get(plan.tag).id
    cached = bool(hits) and all(hits.values())
    durations = {"context": round(t_context, 3)}
    if plan_s is not None:
        durations["plan"] = round(plan_s, 3)
    context = {"files": len(plan.context), "bytes": len(tar), "sha256": hashlib.sha256(tar).hexdigest()}
    record = _build_record(plan, client, image_id, started=started, t0=t0, durations=durations, cached=cached,
                           steps=total, context=context, arm=arm, sources_from=sources_from)
    record_path = write_build_record(record, workspace)
    return BuildResult(plan.tag, image_id, cached, total, record["durations_s"], record_path, record)


def _image_of_inputs(client, plan: BuildPlan):
    """The image ``plan.tag`` names when its labels say it was built from exactly these inputs by
    a checkout of this origin.

    Equal inputs alone are not enough: the source label (the checkout's origin) is not an input, and
    an image made from another checkout would carry someone else's. Every label of the plan but the
    revision must match, and a source label the plan leaves out must be absent too. The revision
    may differ: it says which commit built the image, which stays true, and a new commit that leaves
    the inputs alone (a README edit) must not give equal contents a new image id.
    """
    import docker

    try:
        image = client.images.get(plan.tag)
    except docker.errors.ImageNotFound:
        return None
    found = image.labels or {}
    same = (found.get(f"{LABEL_PREFIX}.inputs.sha256") == plan.inputs_sha256
            and found.get(f"{LABEL_PREFIX}.stack.sha256") == plan.stack_sha256
            and all(found.get(key) == value for key, value in plan.labels.items() if key != REVISION_LABEL)
            and found.get(SOURCE_LABEL) == plan.labels.get(SOURCE_LABEL))
    return image if same else None


def _build_record(plan: BuildPlan, client, image_id: str, *, started: str, t0: float, durations: dict, cached: bool,
                  steps: int, context: dict | None, arm: str | None, sources_from: dict[str, str] | None) -> dict:
    image = client.images.get(image_id)
    version = client.version()
    record = {
        "schema": "rlk-kit/build-record/v1",
        "tag": plan.tag,
        "image_id": image_id,
        "platform": plan.platform,
        "stack": {"name": plan.stack_name, "sha256": plan.stack_sha256},
        "inputs_sha256": plan.inputs_sha256,
        "dockerfile": plan.dockerfile,
        "build_args": plan.build_args,
        "labels": image.labels or {},
        "base_image": {"ref": plan.base_image, "unresolved": plan.base_unresolved, "id": plan.base_image_id},
        "sources": [{"name": n, "commit": plan.build_args.get(f"{n.upper().replace('-', '_')}_COMMIT", ""), "from": f}
                    for n, f in sorted((sources_from or {}).items())],
        "engine": {"version": version.get("Version", ""), "api_version": version.get("ApiVersion", ""),
                   "os": version.get("Os", ""), "arch": version.get("Arch", "")},
        "started_at": started,
        "cached": cached,
        "steps": steps,
        "image_size_bytes": int(image.attrs.get("Size", 0)),
        # What the in-image probe computed at build time, in the image's own environment.
        "conformance_fingerprint": image_conformance_fingerprint(client, image_id),
    }
    if context is not None:
        record["context"] = context
    if arm:
        record["arm"] = arm
    record["durations_s"] = {**durations, "total": round(time.monotonic() - t0, 3)}
    return record


def _failure_reason(log: list[str], error: str) -> str:
    """The most specific line: an install-source or probe message when the build printed one."""
    for text in reversed(log[-40:]):
        for line in reversed(text.splitlines()):
            if line.startswith("install-source:") or line.startswith("kit:") or "the stack pins" in line:
                return line.strip()
    return error.strip()


def build_time_probe(client, image_id: str) -> dict:
    """The probe document the image wrote as its last build step, or ``{"error": why}``."""
    data = read_image_file(client, image_id, PROBE_AT_BUILD_PATH)
    if data is None:
        return {"error": f"the image has no {PROBE_AT_BUILD_PATH} (not built by this kit's Dockerfiles)"}
    try:
        probe = json.loads(data)
    except ValueError as exc:
        return {"error": f"{PROBE_AT_BUILD_PATH} is not JSON: {exc}"[:300]}
    if not isinstance(probe, dict) or "error" in probe:
        return {"error": f"{PROBE_AT_BUILD_PATH} is not a probe document"}
    return probe


def image_conformance_fingerprint(client, image_id: str):
    """The kernel-conformance fingerprint the in-image probe recorded at build time.

    A 64-hex string, or ``{"error": why}`` when the image holds none: a missing fingerprint is
    stated, never left out.
    """
    probe = build_time_probe(client, image_id)
    if "error" in probe:
        return probe
    if "conformance_fingerprint" not in probe:
        return {"error": f"{PROBE_AT_BUILD_PATH} carries no conformance_fingerprint (probe run with --no-conformance)"}
    return probe["conformance_fingerprint"]


def write_build_record(record: dict, workspace: Path) -> Path:
    from kit.model.documents import write_new_document

    directory = workspace / "builds"
    directory.mkdir(parents=True, exist_ok=True)
    safe = record["tag"].replace("/", "_").replace(":", "_")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return write_new_document(directory / f"{safe}-{stamp}.json", record, expected="build-record")


# --- checks of existing images ---------------------------------------------------------------

@dataclass(frozen=True)
class ImageCheck:
    """Whether an image carries a stack: ``differences`` are (label or field, expected, found)."""

    matches: bool
    differences: list[tuple[str, str | None, str | None]]
    image_id: str = ""


def check_image(image_ref_or_id: str, stack, *, client=None) -> ImageCheck:
    """Compare an image's labels and embedded stack document with ``stack`` (no container is run)."""
    import docker

    stack_doc, stack_sha, _ = stack_parts(stack)
    client = client or engine()
    try:
        image = client.images.get(image_ref_or_id)
    except docker.errors.ImageNotFound:
        raise BadInput(f"image {image_ref_or_id!r} is not on this engine; build it with `kit build`") from None
    found = image.labels or {}
    platform = found.get("dev.rlk-kit.platform")
    differences: list[tuple[str, str | None, str | None]] = []
    if platform not in stack_doc.get("platforms", {}):
        differences.append(("dev.rlk-kit.platform", "|".join(sorted(stack_doc.get("platforms", {}))), platform))
    else:
        for key, value in sorted(pin_labels(stack_doc, stack_sha, platform).items()):
            if found.get(key) != value:
                differences.append((key, value, found.get(key)))
        expected_keys = set(pin_labels(stack_doc, stack_sha, platform))
        for key in sorted(found):
            if (key.startswith("dev.rlk-kit.package.") or key.startswith("dev.rlk-kit.source.")) and key not in expected_keys:
                differences.append((key, None, found[key]))
    embedded = read_embedded_stack(client, image.id)
    if embedded is None:
        differences.append((STACK_PATH, stack_sha, None))
    else:
        _, embedded_sha, _ = stack_parts(embedded)
        if embedded_sha != stack_sha:
            differences.append((f"{STACK_PATH} sha256", stack_sha, embedded_sha))
    return ImageCheck(not differences, differences, image.id)


def read_embedded_stack(client, image_id: str) -> dict | None:
    """The stack document baked at /opt/rlk/stack.json, read from a created (never started) container."""
    data = read_image_file(client, image_id, STACK_PATH)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def read_image_file(client, image_id: str, path: str) -> bytes | None:
    """The bytes of one regular file of an image (None when absent), from a created, never started container."""
    container = client.containers.create(image_id, command=["true"])
    try:
        try:
            chunks, _ = container.get_archive(path)
        except Exception:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.getmembers()[0]
            handle = tar.extractfile(member) if member.isfile() else None
            return handle.read() if handle is not None else None
    finally:
        container.remove(force=True)


def image_stack_name(image_ref: str, *, client=None) -> str:
    """The stack an image says it holds (its ``dev.rlk-kit.stack.name`` label); BadInput when it says none."""
    import docker

    client = client or engine()
    try:
        image = client.images.get(image_ref)
    except docker.errors.ImageNotFound:
        raise BadInput(f"image {image_ref!r} is not on this engine; build it with `kit build`") from None
    name = (image.labels or {}).get(f"{LABEL_PREFIX}.stack.name")
    if not name:
        raise BadInput(f"image {image_ref!r} has no {LABEL_PREFIX}.stack.name label (not built by `kit build`); "
                       "name the stack it must hold with --arm A or --stack S")
    return name


@dataclass(frozen=True)
class ProbeCheck:
    """Result of running the probe inside an image and comparing it with a stack."""

    matches: bool
    differences: list[tuple[str, str | None, str | None]]
    observed: dict


def verify_image_by_probe(image_ref: str, stack, *, client=None, timeout_s: int = 300) -> ProbeCheck:
    """Run ``kit probe --json`` in a throwaway container of ``image_ref`` and compare it with ``stack``.

    ``verify_image_by_probe("rlk-kit/smoke:cpu-…", catalog.stack("smoke")).differences`` lists
    e.g. ``("sources.rl-kernel.tree", "<expected>", "<observed>")`` after a baked file was edited.
    """
    import docker

    from kit.model.documents import require_valid

    stack_doc, _, _ = stack_parts(stack)
    client = client or engine()
    try:
        client.images.get(image_ref)
    except docker.errors.ImageNotFound:
        raise BadInput(f"image {image_ref!r} is not on this engine; build it with `kit build`") from None
    # The kit's entrypoint, whatever the image's default became (a committed container may have
    # changed it): it puts the stack's venv first on PATH, which is what the probe must observe.
    container = client.containers.create(image_ref, command=PROBE_COMMAND, entrypoint=[ENTRYPOINT],
                                         network_mode="none", environment={PROBE_STACK_ENV: json.dumps(stack_doc)})
    try:
        try:
            container.start()
        except docker.errors.APIError as exc:
            reason = exc.explanation or str(exc)
            raise BadInput(f"image {image_ref!r} cannot run the kit probe (is it an image `kit build` made? "
                           f"it needs {ENTRYPOINT}): {reason}") from None
        status = container.wait(timeout=timeout_s)
        out = container.logs(stdout=True, stderr=False)
        if status.get("StatusCode") not in (0, 1):
            err = container.logs(stdout=False, stderr=True).decode(errors="replace").strip()[-500:]
            raise CheckFailed(f"probe in {image_ref} exited {status.get('StatusCode')}: {err}")
    finally:
        container.remove(force=True)
    from kit.model.documents import parse_json_bytes

    observed = require_valid(parse_json_bytes(out, f"probe output of {image_ref}"), f"probe output of {image_ref}", "probe")
    differences = probe_differences(client, image_ref, observed, stack_doc)
    return ProbeCheck(not differences, differences, observed)


def image_platform(client, image: str) -> str:
    """The platform an image was built for, from its dev.rlk-kit.platform label ("" when unlabelled)."""
    try:
        return (client.images.get(image).labels or {}).get(f"{LABEL_PREFIX}.platform", "")
    except Exception:   # an engine error here leaves the lock comparison to the build-time check
        return ""


def probe_differences(client, image: str, observed: dict, stack_doc: dict) -> list[tuple[str, str | None, str | None]]:
    """What a probe inside a container of ``image`` shows against the stack's pins, and its compiled
    extensions against the image's build-time probe (the only record of those build outputs)."""
    from kit.build.probe import extension_differences, identity_differences

    differences = identity_differences(observed, stack_doc)
    lock = stack_lock(stack_doc["name"], image_platform(client, image), _manifests_dir())
    if lock is not None:
        from kit.build.installed import freeze_entries, installed_differences

        differences += installed_differences(lock, freeze_entries(observed.get("freeze", [])))
    at_build = build_time_probe(client, image)
    if "error" in at_build:
        differences.append(("probe_at_build", PROBE_AT_BUILD_PATH, at_build["error"]))
    else:
        differences += extension_differences(observed, at_build)
    return differences
