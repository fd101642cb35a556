"""Images: plan, build and record them on the Docker engine (classic builder, through kit.adapters.docker).

Collects a build context (sources exported at their pins, patches, the kit, a wheelhouse for cpu),
turns it into a :class:`kit.build_plan.BuildPlan`, builds it with a progress display, writes a
build record, and checks existing images against a stack. Example::

    plan = plan_build(stack, "cpu", workspace=Path(".workspace"))
    result = build_image(plan, workspace=Path(".workspace"))
    check_image(result.tag, stack).matches                  # labels + embedded stack
    verify_image_by_probe(result.tag, stack).differences    # probe in a throwaway container
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kit import __version__
from kit.adapters import docker as dockerdoor
from kit.adapters.docker import engine
from kit.build.context import CollectedContext, _manifests_dir, collect_context, kit_checkout, stack_lock  # noqa: F401
from kit.build.cuda_debian import PLATFORM as CUDA_DEBIAN
from kit.build.cuda_debian import collect_cuda_debian, sources_check
from kit.build.image_checks import (  # noqa: F401
    ImageCheck,
    ProbeCheck,
    build_time_probe,
    check_image,
    image_conformance_fingerprint,
    image_platform,
    image_stack_name,
    probe_differences,
    read_embedded_stack,
    read_image_file,
    verify_image_by_probe,
)
from kit.build.layout import LABEL_PREFIX, step_cache_ref
from kit.build.plan import PLATFORMS, BuildPlan, context_tar, make_plan, source_problems
from kit.build.provenance import LABEL as PROVENANCE_LABEL
from kit.build.repro_build import find_provenance, recover_provenance, write_reproducible
from kit.build.source_cache import source_cache_problems
from kit.build.wheel_server import bridge_gateway, serve_wheels
from kit.build.wheelhouse import disk_shortfall, wheelhouse_dirs
from kit.model.documents import write_new_document
from kit.model.errors import BadInput, CheckFailed
from kit.model.stack import stack_parts

REPO_ROOT = Path(__file__).resolve().parents[2]
_STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_FROM_RE = re.compile(r"^FROM\s+(?:--\S+\s+)*\S+(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE)
_RESULT_RE = re.compile(r"^ ---> ([0-9a-f]{12,64})$")   # not " ---> Running in …"


def _base_id_if_known(client, base_image: str) -> str | None:
    """The local id of a tagged base when an engine answers and holds it (a dry run asks, never needs:
    a short timeout, so an engine that does not answer cannot hold the dry run up)."""
    try:
        return base_image_id(client or dockerdoor.client(dockerdoor.QUICK_TIMEOUT_S), base_image)
    except Exception:   # no engine, no base, an engine error: the tag is then provisional
        return None


def base_image_id(client, base_image: str, *, stack_name: str = "", platform: str = "") -> str:
    """Local id of the base; BadInput saying how to make or load it when it is missing.

    The build never pulls (``pull=False``): a base named by digest must already be on the engine
    under that digest, as ``docker pull`` leaves it.
    """
    try:
        found = dockerdoor.find_image(client, base_image)
    except dockerdoor.EngineError as exc:   # e.g. a malformed reference
        raise BadInput(f"base image {base_image}: the engine cannot look it up ({exc})") from None
    if found is not None:
        return found.id
    where = f" (stack {stack_name!r}, platform {platform})" if stack_name else ""
    if base_image.startswith("rlk-kit/debian-base"):
        raise BadInput(f"base image {base_image}{where} is not on this engine; make it with docker/make-base-image.sh "
                       "(or scripts/ensure-docker.sh)")
    raise BadInput(f"base image {base_image}{where} is not on this engine and `kit build` never pulls; "
                   f"load it first: `docker pull {base_image}` where a registry is reachable, or on a host "
                   f"without one `docker load -i FILE` of an image saved there with `docker save` after that pull")


# --- stacks -----------------------------------------------------------------------------------

# --- plan and build ---------------------------------------------------------------------------

def plan_build(stack, platform: str, *, workspace: Path, overrides: dict[str, Path] | None = None,
               dry_run: bool = False, client=None, sources_dir: Path | None = None,
               wheel_dirs: list[Path] | None = None, progress=None) -> BuildPlan:
    """The full plan for ``stack`` on ``platform``; no engine needed when ``dry_run``."""

    stack_doc, stack_sha, name = stack_parts(stack)
    if platform not in PLATFORMS:
        raise BadInput(f"unknown platform {platform!r}; accepted: {', '.join(PLATFORMS)}")
    blocking = source_problems(stack_doc, platform)
    if blocking:
        raise BadInput(blocking[0])
    if sources_dir is not None:
        # Every source checked (commit and recomputed tree) before the base, a download or a layer.

        missing = source_cache_problems(stack_doc, sources_dir, sources_check(workspace))
        if missing:
            raise CheckFailed(f"stack {name!r}: {len(missing)} source(s) not buildable from {sources_dir}:\n  "
                              + "\n  ".join(missing))
    base_id = None
    entry = stack_doc["platforms"][platform]
    if not dry_run:
        # Before any source is fetched: a missing base stops the build whatever else is ready.
        local_id = base_image_id(client or engine(), entry["base_image"], stack_name=name, platform=platform)
        if entry.get("unresolved"):
            base_id = local_id   # a tag: its local id enters the inputs and a label
    elif entry.get("unresolved"):
        base_id = _base_id_if_known(client, entry["base_image"])
    served = None
    if platform == CUDA_DEBIAN:   # wheels served to the build, sources from archives
        collected, served = collect_cuda_debian(stack_doc, stack_lock(name, platform, _manifests_dir()), workspace=workspace,
                                                sources_dir=sources_dir, wheel_dirs=wheelhouse_dirs(wheel_dirs or []),
                                                dry_run=dry_run, progress=progress)
    else:
        collected = collect_context(stack_doc, platform, workspace=workspace, overrides=overrides, dry_run=dry_run)
    if dry_run and entry.get("unresolved") and base_id is None:
        collected.notes.append(f"the base {entry['base_image']} is a tag and no engine here holds it: its local id, "
                               "which a build adds to the inputs, is unknown, so this tag and inputs sha256 are "
                               "provisional")
    checkout = kit_checkout()
    plan = make_plan(stack_doc, stack_sha, platform, collected.entries, kit_version=__version__,
                     commit_dates=collected.commit_dates, base_image_id=base_id, extra_problems=collected.problems,
                     notes=collected.notes, served=served)
    return dataclasses.replace(plan, checkout=checkout)


@dataclass
class BuildResult:
    tag: str
    image_id: str
    cached: bool
    steps: int
    durations_s: dict
    record_path: Path | None
    record: dict
    reused: bool = False     # the tag already held an image of these inputs: nothing was sent to the engine
    normalized: object = None   # kit.build.reproduce.NormalizedImage of a reproducible build


def build_image(plan: BuildPlan, *, workspace: Path, client=None, nocache: bool = False, progress=None,
                arm: str | None = None, sources_from: dict[str, str] | None = None,
                plan_s: float | None = None, reproducible: bool = True, load_tag: str | None = None,
                keep_layers: bool = False, write_record: bool = True) -> BuildResult:
    """Build ``plan`` on the engine, stream its log through ``progress(step, total, elapsed, text)``,
    and write the build record. CheckFailed (exit 1) when a build step fails.

    When ``plan.tag`` already names an image whose inputs label equals ``plan.inputs_sha256`` (and
    ``nocache`` is off) the context is not sent at all: the inputs sha256 covers the Dockerfile,
    every build arg, every context file and (unresolved bases) the base's local id, so the engine
    could only answer with the same image. ``plan_s`` (time spent planning) is added to the total.

    ``reproducible`` (the default): the engine's image is left untagged and the kit writes the
    tagged one (:mod:`kit.build.reproduce`), with its provenance; an interrupted build therefore
    never leaves a half-made image under the tag, and the engine's cache still holds every step.
    ``load_tag``/``keep_layers``/``write_record`` serve ``--check-reproducible``'s second build.
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
        label = (existing.labels or {}).get(PROVENANCE_LABEL)
        if label:   # the statement of equal inputs is equal: the one this workspace wrote, or made again here
            found = find_provenance(workspace, label) or recover_provenance(client, plan, existing, workspace=workspace,
                                                                             arm=arm)
            record["provenance"] = {"path": str(found) if found else "", "sha256": label}
        dockerdoor.mark_built(client, existing.id, plan.tag)     # the image a run of this stack now finds first
        return BuildResult(plan.tag, existing.id, True, 0, record["durations_s"], write_build_record(record, workspace),
                           record, reused=True)
    skipped = None
    if reproducible and plan.served:
        skipped = disk_shortfall(plan, workspace)
        if skipped:   # the engine's image is tagged as built (still only once every step succeeded)
            reproducible = False
            if progress:
                progress(0, 0, time.monotonic() - t0, skipped)
    tar = context_tar(plan.context)
    t_context = time.monotonic() - started_here
    network = "none" if plan.platform == "cpu" else None   # the cpu build is hermetic
    serving, served = contextlib.nullcontext(), {}
    if plan.served:   # reached only through the bridge, only while this build runs
        say = (lambda text: progress(0, 0, time.monotonic() - t0, text)) if progress else None
        serving = serve_wheels({n: Path(p) for n, p in plan.served}, host=bridge_gateway(client), progress=say,
                               served=served)
    with serving as proxy:
        # http_proxy: predefined by the engine, so (undeclared) outside every step's cache key.
        extra = {"http_proxy": proxy} if proxy else {}
        step, total, current, image_id, hits, log = _run_build(client, plan, tar, nocache, reproducible, network,
                                                               extra, progress, t0)
    for stage, leaf in stage_leaves(log).items():   # replaced by the next build's, not left dangling
        dockerdoor.retag(client, leaf, step_cache_ref(plan.tag, plan.platform, stage))
    if image_id is None:
        if reproducible:
            raise CheckFailed(f"the engine reported no image id for the build of {plan.tag}")
        image_id = client.images.get(plan.tag).id
    cached = bool(hits) and all(hits.values())
    durations = {"context": round(t_context, 3)}
    if plan_s is not None:
        durations["plan"] = round(plan_s, 3)
    context = {"files": len(plan.context), "bytes": len(tar), "sha256": hashlib.sha256(tar).hexdigest()}
    extra: dict = {}
    normalized = None
    if reproducible:
        # Lazy: kit.build.repro_build imports this module back for its second build.
        t_engine = time.monotonic()
        say = (lambda text: progress(0, total, time.monotonic() - t0, text)) if progress else None
        normalized, extra = write_reproducible(client, plan, image_id, workspace=workspace, tag=load_tag or plan.tag,
                                               arm=arm, keep=keep_layers, progress=say)
        durations["reproducible"] = round(time.monotonic() - t_engine, 3)
        image_id = normalized.image_id
    record = _build_record(plan, client, image_id, started=started, t0=t0, durations=durations, cached=cached,
                           steps=total, context=context, arm=arm, sources_from=sources_from)
    record.update(extra)
    if skipped:
        record["reproducible_skipped"] = skipped
    if plan.served:
        record["wheelhouse"] = {"files": len(plan.served), "served": served["count"], "served_bytes": served["bytes"]}
    record_path = write_build_record(record, workspace) if write_record else None
    if load_tag is None:     # not --check-reproducible's second build, which is named apart
        dockerdoor.mark_built(client, image_id, plan.tag)
    return BuildResult(plan.tag, image_id, cached, total, record["durations_s"], record_path, record,
                       normalized=normalized)



def stage_leaves(log: list[str]) -> dict[str, str]:
    """{stage name: image id of its last step} for every stage of a multi-stage build but the last,
    read off the classic builder's log. They are the engine's cache of those stages (a later build
    reuses them); the engine keeps them untagged, so without a step-cache ref each cold build would
    leave its own copy behind (about 1.6 GB of venv for the smoke stack)."""
    leaves: dict[str, str] = {}
    stage, current, index = None, None, 0
    for line in "".join(log).splitlines():
        step = _STEP_RE.match(line)
        if step:
            origin = _FROM_RE.match(step.group(3))
            if origin:
                if stage is not None and current:
                    leaves[stage] = current
                stage, current, index = origin.group(1) or f"stage{index}", None, index + 1
            continue
        result = _RESULT_RE.match(line)
        if result:
            current = result.group(1)
    return leaves


def _run_build(client, plan: BuildPlan, tar: bytes, nocache: bool, reproducible: bool, network, extra_args: dict,
               progress, t0: float):
    """Send the context and follow the engine's stream: (step, total, current, image id, cache hits, log)."""
    stream = client.api.build(fileobj=io.BytesIO(tar), custom_context=True, dockerfile=plan.dockerfile,
                              tag=None if reproducible else plan.tag, buildargs={**plan.build_args, **extra_args},
                              labels=plan.labels, rm=True, forcerm=True, nocache=nocache, pull=False, decode=True,
                              network_mode=network)
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
                hits[step] = current.split(" ", 1)[0].upper() not in ("RUN", "COPY", "ADD")
                if progress:
                    progress(step, total, time.monotonic() - t0, current)
            elif "Using cache" in line and step:
                hits[step] = True
    return step, total, current, image_id, hits, log

def _image_of_inputs(client, plan: BuildPlan):
    """The image ``plan.tag`` names when its labels say it was built from exactly these inputs.

    Every label is a function of the inputs, so an image built from another clone or another commit
    of the kit with equal inputs is the same image (same id) and is reused as it is.
    """
    image = dockerdoor.find_image(client, plan.tag)
    if image is None:
        return None
    found = image.labels or {}
    same = (found.get(f"{LABEL_PREFIX}.inputs.sha256") == plan.inputs_sha256
            and found.get(f"{LABEL_PREFIX}.stack.sha256") == plan.stack_sha256
            and all(found.get(key) == value for key, value in plan.labels.items()))
    return image if same else None


def _build_record(plan: BuildPlan, client, image_id: str, *, started: str, t0: float, durations: dict, cached: bool,
                  steps: int, context: dict | None, arm: str | None, sources_from: dict[str, str] | None) -> dict:
    image = client.images.get(image_id)
    version = client.version()
    record = {
        "schema": "rlk-kit/build-record/v4",
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
        # Which checkout ran the build: not an input, so not in the image (two clones give one id).
        "checkout": dict(zip(("source", "revision"), plan.checkout)),
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
            if line.startswith(("install-source:", "install-archive:", "install-layer:", "kit:")) \
                    or "the stack pins" in line:
                return line.strip()
    return error.strip()

def write_build_record(record: dict, workspace: Path) -> Path:

    directory = workspace / "builds"
    directory.mkdir(parents=True, exist_ok=True)
    safe = record["tag"].replace("/", "_").replace(":", "_")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return write_new_document(directory / f"{safe}-{stamp}.json", record, expected="build-record")


