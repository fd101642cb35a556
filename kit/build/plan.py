"""Build plan: everything `kit build` hands the engine, computed from a stack without an engine.

Pure functions over a resolved stack document and a list of context entries: the Dockerfile to use,
its build args, the image labels, the inputs sha256 (over the context listing and the build args)
and the tag ``rlk-kit/<stack>:<platform>-<12 hex>``. The deterministic tar of the context is made
here too, so a rebuild with nothing changed sends the engine the same bytes. Example::

    plan = make_plan(stack_doc, stack_sha256, "cuda", entries, kit_version="0.1.0")
    plan.build_args["TORCH_CUDA_ARCH_LIST"]          # "9.0"
    plan.tag                                        # "rlk-kit/vime-g10:cuda-3f0c…"

Source trees enter the inputs by their git commit (a content hash already): the tar made from a
commit is a function of the commit, so a plan made before the sources are fetched has the same
inputs sha256 as the build that fetches them.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass
from datetime import datetime, timezone

from kit.model.documents import canonical_json
from kit.model.lock import INSTALL_EXTRAS, lock_sha256
from kit.model.errors import CheckFailed
from kit.build.layout import LABEL_PREFIX
from kit.model.stack import packages_for
from kit.model.buildability import buildability_findings

PLATFORMS = ("cuda", "rocm", "cpu", "cuda-debian")
DOCKERFILES = {"cuda": "Dockerfile.cuda", "rocm": "Dockerfile.rocm", "cpu": "docker/Dockerfile.cpu",
               "cuda-debian": "docker/cuda-debian/Dockerfile"}
# The static Dockerfiles take one set of build args per source name (no loops in a Dockerfile).
BAKED_SOURCES = ("rl-kernel", "vime", "megatron-lm")
# The CUDA/ROCm images install their lock only: kit/build/context.py renders it into lock/*.lock
# (kit.model.lock.install_files), so no package pin is a build arg there. Every pin, the build tools
# and uv included, lives in manifests/ (stack-kit-tools.json, stack-vime-base.json) and in the lock.
# Fixed mtime of every context member (2024-01-01T00:00:00Z); the engine never sees wall-clock time.
CONTEXT_MTIME = 1704067200
ROCM_TORCH_INDEX = "https://download.pytorch.org/whl/rocm{major_minor}"
_ROCM_TAG_RE = re.compile(r":(\d+)\.(\d+)(?:\.\d+)?")
_DIGEST_RE = re.compile(r"@(sha256:[0-9a-f]{64})$")


@dataclass(frozen=True)
class ContextEntry:
    """One file of the build context: its bytes (or where to read them) and its identity.

    ``digest`` is ``sha256:<hex>`` of the bytes, or ``git-commit:<sha>`` for a source tree whose
    tar is a function of that commit (it may not be fetched yet in a dry run).
    """

    path: str
    mode: int
    digest: str
    data: bytes | None = None
    file: str | None = None      # host path to read the bytes from at tar time

    @staticmethod
    def of_bytes(path: str, data: bytes, mode: int = 0o644) -> "ContextEntry":
        return ContextEntry(path, mode, "sha256:" + hashlib.sha256(data).hexdigest(), data=data)

    def listing(self) -> dict:
        size = len(self.data) if self.data is not None else None
        return {"path": self.path, "mode": f"{self.mode:04o}", "digest": self.digest, "size": size}


@dataclass(frozen=True)
class BuildPlan:
    platform: str
    stack_name: str
    stack_sha256: str
    dockerfile: str
    build_args: dict[str, str]
    labels: dict[str, str]
    context: tuple[ContextEntry, ...]
    inputs_sha256: str
    tag: str
    base_image: str
    base_unresolved: bool
    base_image_id: str | None = None
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    # Files served to the build instead of sent in its context (cuda-debian's wheels): (name, path).
    served: tuple[tuple[str, str], ...] = ()
    # The kit checkout the plan was made from, (origin URL, commit[-dirty]), read when the kit's
    # files were: not an input, so in the build record only (not in the plan document or labels).
    checkout: tuple[str | None, str | None] = (None, None)

    def to_json(self) -> dict:
        """The rlk-kit/build-plan/v2 document (``kit build --dry-run --json``)."""
        return {
            "schema": "rlk-kit/build-plan/v2",
            "platform": self.platform,
            "stack": {"name": self.stack_name, "sha256": self.stack_sha256},
            "dockerfile": self.dockerfile,
            "base_image": {"ref": self.base_image, "unresolved": self.base_unresolved, "id": self.base_image_id},
            "build_args": dict(sorted(self.build_args.items())),
            "labels": dict(sorted(self.labels.items())),
            "context": [e.listing() for e in self.context],
            "inputs_sha256": self.inputs_sha256,
            "tag": self.tag,
            "notes": list(self.notes),
            "problems": list(self.problems),
        }


def arg_prefix(source_name: str) -> str:
    """``arg_prefix("megatron-lm") == "MEGATRON_LM"``."""
    return source_name.upper().replace("-", "_").replace(".", "_")


def requirement(name: str, version: str) -> str:
    """``requirement("ray", "2.57.0") == "ray[default]==2.57.0"``."""
    extra = INSTALL_EXTRAS.get(name)
    return f"{name}[{extra}]=={version}" if extra else f"{name}=={version}"


def base_digest(base_image: str) -> str | None:
    m = _DIGEST_RE.search(base_image)
    return m.group(1) if m else None


def patch_context_path(source_name: str, index: int, patch_path: str) -> str:
    """Where patch ``index`` of a source sits in the context: ``patches/vime/0-vime.patch``."""
    return f"patches/{source_name}/{index}-{patch_path.rsplit('/', 1)[-1]}"


def source_problems(stack_doc: dict, platform: str) -> list[str]:
    """What stops this stack from being built on this platform (empty when nothing does)."""
    problems = []
    platforms = stack_doc.get("platforms", {})
    if platform not in PLATFORMS:
        problems.append(f"unknown platform {platform!r}; accepted: {', '.join(PLATFORMS)}")
    elif platform not in platforms:
        problems.append(f"stack {stack_doc.get('name')!r} has no base image for platform {platform!r}; "
                        f"it names: {', '.join(sorted(platforms)) or 'none'}")
    names = [s["name"] for s in stack_doc.get("sources", [])]
    unknown = [n for n in names if n not in BAKED_SOURCES]
    if unknown and platform != "cuda-debian":   # cuda-debian bakes any source archive (sources.txt)
        problems.append(f"the Dockerfiles bake the sources {', '.join(BAKED_SOURCES)}; "
                        f"stack {stack_doc.get('name')!r} also names {', '.join(unknown)}")
    return problems


def site_supplies(stack_doc: dict, platform: str) -> list[str]:
    """What a site building from a clean clone must bring: sources by commit, the base, wheels no index has.

    One ``supply:`` line each, so the plan (text and --json notes) lists them before any build.
    """
    out = []
    for src in stack_doc.get("sources", []):
        out.append(f"supply: source {src['name']} {src['repository']} at commit {src['commit']}"
                   + (f" (tree {src['tree']})" if src.get("tree") else "")
                   + f"; give it with --sources DIR (a git archive {src['name']}-*.tar.gz or a checkout "
                   f"{src['name']}/) or --source {src['name']}=PATH, else the build fetches it")
    entry = stack_doc.get("platforms", {}).get(platform) or {}
    if entry.get("base_image"):
        how = "by digest" if base_digest(entry["base_image"]) else "a tag without a digest: pin it before a build"
        out.append(f"supply: base image {entry['base_image']} ({how}; pulled unless the engine has it)")
    te = packages_for(stack_doc, platform).get("transformer-engine")
    if te and platform == "cuda-debian":
        out.append(f"supply: wheel transformer-engine-torch {te}, built locally (docker/build-te-wheel.sh, "
                   "docs/cuda-image.md) and given with --wheelhouse DIR: no index carries it")
    elif te and platform == "cuda":
        out.append(f"supply: nothing for transformer-engine-torch {te}: the image compiles its sdist against "
                   "the locked torch (see any buildability problem)")
    return out


def build_args(stack_doc: dict, platform: str) -> dict[str, str]:
    """The Dockerfile's build args for a resolved stack: every pin the image is made from."""

    entry = stack_doc["platforms"][platform]
    packages = packages_for(stack_doc, platform)
    args = {
        "BASE_IMAGE": entry["base_image"],
        "PYTHON_VERSION": stack_doc["python"],
    }
    if platform == "cpu":
        args["PACKAGES"] = " ".join(requirement(n, v) for n, v in sorted(packages.items()))
    by_name = {s["name"]: s for s in stack_doc["sources"]}
    for name in BAKED_SOURCES:
        src = by_name.get(name, {})
        prefix = arg_prefix(name)
        args[f"{prefix}_COMMIT"] = src.get("commit", "")
        args[f"{prefix}_TREE"] = src.get("tree", "")
        args[f"{prefix}_PATCHES"] = " ".join(
            f"{p['sha256']}:{patch_context_path(name, i, p['path']).split('/', 2)[2]}"
            for i, p in enumerate(src.get("patches", [])))
    if platform == "cuda":
        args["TORCH_CUDA_ARCH_LIST"] = ";".join(entry.get("cuda_arch_list", []))
    if platform == "rocm":
        args["PYTORCH_ROCM_ARCH"] = ";".join(entry.get("gfx_targets", []))
        args["TORCH_INDEX_URL"] = rocm_torch_index(entry["base_image"])
    return args


def rocm_torch_index(base_image: str) -> str:
    """The PyTorch wheel index matching the ROCm release of the base tag (rocm/...:6.3.4 -> rocm6.3)."""
    m = _ROCM_TAG_RE.search(base_image.split("@", 1)[0].rsplit("/", 1)[-1])
    return ROCM_TORCH_INDEX.format(major_minor=f"{m.group(1)}.{m.group(2)}") if m else ""


def created_timestamp(commit_dates: dict[str, int]) -> str | None:
    """``org.opencontainers.image.created``: the newest source commit date, so it derives from inputs."""
    if not commit_dates:
        return None
    return datetime.fromtimestamp(max(commit_dates.values()), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def labels(stack_doc: dict, stack_sha256: str, platform: str, *, inputs_sha256: str, kit_version: str,
           kit_source_sha256: str | None = None, created: str | None = None,
           base_image_id: str | None = None) -> dict[str, str]:
    """OCI labels plus one kit label per pin: every value is a function of the build's inputs.

    Which checkout ran the build (its origin URL and commit) is not: two clones of the same inputs
    must give the same image id. The build record holds that (``checkout``), not the image.
    """
    entry = stack_doc["platforms"][platform]
    p = LABEL_PREFIX
    out = {
        "org.opencontainers.image.version": kit_version,
        "org.opencontainers.image.base.name": entry["base_image"],
        "org.opencontainers.image.title": f"rlk-kit {stack_doc['name']} ({platform})",
        f"{p}.stack.name": stack_doc["name"],
        f"{p}.stack.sha256": stack_sha256,
        f"{p}.inputs.sha256": inputs_sha256,
        f"{p}.platform": platform,
        f"{p}.python": stack_doc["python"],
    }
    if kit_source_sha256:
        # The kit files baked into the image (kit-src/ of the context), whatever commit they are at.
        out[f"{p}.kit.source-sha256"] = kit_source_sha256
    digest = base_digest(entry["base_image"])
    if digest:
        out["org.opencontainers.image.base.digest"] = digest
    else:
        out[f"{p}.base.unresolved"] = "true"
        if base_image_id:
            # No registry digest exists (docker/make-base-image.sh): the local image id stands in.
            out[f"{p}.base.id"] = base_image_id
    if created:
        out["org.opencontainers.image.created"] = created

    for name, version in packages_for(stack_doc, platform).items():
        out[f"{p}.package.{name}"] = version
    for src in stack_doc["sources"]:
        out[f"{p}.source.{src['name']}.commit"] = src["commit"]
        out[f"{p}.source.{src['name']}.repository"] = src["repository"]
        if "tree" in src:
            out[f"{p}.source.{src['name']}.tree"] = src["tree"]
        if src.get("patches"):
            out[f"{p}.source.{src['name']}.patches"] = ",".join(x["sha256"] for x in src["patches"])
    if "cuda_arch_list" in entry:
        out[f"{p}.cuda-arch-list"] = ";".join(entry["cuda_arch_list"])
    if "gfx_targets" in entry:
        out[f"{p}.gfx-targets"] = ";".join(entry["gfx_targets"])
    return out


# Kit labels that depend on the build's context and base, not on the stack.
BUILD_LABELS = (f"{LABEL_PREFIX}.inputs.sha256", f"{LABEL_PREFIX}.kit.source-sha256", f"{LABEL_PREFIX}.base.id")


# Labels that a stack determines; the rest (inputs, created) depend on the build context.
def pin_labels(stack_doc: dict, stack_sha256: str, platform: str) -> dict[str, str]:
    """The labels an image of this stack must carry whatever context it was built from."""
    full = labels(stack_doc, stack_sha256, platform, inputs_sha256="", kit_version="")
    return {k: v for k, v in full.items() if k.startswith(LABEL_PREFIX + ".") and k not in BUILD_LABELS
            or k in ("org.opencontainers.image.base.name", "org.opencontainers.image.base.digest")}


def inputs_sha256(dockerfile: str, args: dict[str, str], context: list[ContextEntry] | tuple[ContextEntry, ...],
                  base_image_id: str | None) -> str:
    """sha256 over the Dockerfile name, build args, context listing and (unresolved bases) the local base id."""
    doc = {
        "dockerfile": dockerfile,
        "build_args": dict(sorted(args.items())),
        "context": [[e.path, e.mode, e.digest] for e in sorted(context, key=lambda e: e.path)],
        "base_image_id": base_image_id,
    }
    return hashlib.sha256(canonical_json(doc)).hexdigest()


def image_tag(stack_name: str, platform: str, inputs: str) -> str:
    """``rlk-kit/<stack>:<platform>-<12 hex>``; repository names are lowercase."""
    return f"rlk-kit/{stack_name.lower()}:{platform}-{inputs[:12]}"


def make_plan(stack_doc: dict, stack_sha256: str, platform: str, context: list[ContextEntry], *,
              kit_version: str, commit_dates: dict[str, int] | None = None, base_image_id: str | None = None,
              extra_problems: list[str] | None = None, notes: list[str] | None = None,
              served: dict | None = None) -> BuildPlan:
    """Assemble the plan. ``context`` must already hold the Dockerfile, scripts, stack and sources."""
    problems = source_problems(stack_doc, platform) + list(extra_problems or [])
    if problems and (platform not in PLATFORMS or platform not in stack_doc.get("platforms", {})):
        raise ValueError(problems[0])
    # Known-incompatible pins (kit/model/buildability.v1.json): a build of them fails hours in, so the plan refuses them.
    problems += [f.text() for f in buildability_findings(stack_doc, platform)]
    entry = stack_doc["platforms"][platform]
    args = build_args(stack_doc, platform)
    dockerfile = DOCKERFILES[platform]
    ctx = tuple(sorted(context, key=lambda e: e.path))
    inputs = inputs_sha256(dockerfile, args, ctx, base_image_id)
    kit_sha = hashlib.sha256(canonical_json([[e.path, e.digest] for e in ctx if e.path.startswith("kit-src/")])).hexdigest()
    lab = labels(stack_doc, stack_sha256, platform, inputs_sha256=inputs, kit_version=kit_version,
                 kit_source_sha256=kit_sha, created=created_timestamp(commit_dates or {}),
                 base_image_id=base_image_id)
    lock_entry = next((e for e in ctx if e.path == "lock.json" and e.data is not None), None)
    if lock_entry is not None:
        lab[f"{LABEL_PREFIX}.lock.sha256"] = lock_sha256(json.loads(lock_entry.data))
    all_notes = list(notes or []) + site_supplies(stack_doc, platform)
    if entry.get("unresolved"):
        all_notes.append(f"base {entry['base_image']} is unresolved (a tag, not a digest)"
                         + (f": {entry['note']}" if entry.get("note") else ""))

    if platform == "rocm" and any("+" not in v for n, v in packages_for(stack_doc, platform).items() if n == "torch"):
        all_notes.append("rocm: torch from the ROCm wheel index reports a local version (+rocmX.Y); the in-image "
                         "probe compares versions exactly, so a stack built for rocm must pin that form")
    if platform == "rocm" and "transformer-engine" in packages_for(stack_doc, platform):
        all_notes.append("rocm: Transformer Engine has no ROCm wheel on PyPI; Dockerfile.rocm builds the pinned "
                         "version with NVTE_USE_ROCM=1, which needs ROCm TE sources of that version")
    vllm = packages_for(stack_doc, platform).get("vllm")
    if platform == "rocm" and vllm and "rocm" not in vllm:
        all_notes.append(f"rocm: vllm {vllm} from PyPI is a CUDA build; an image of this plan has no ROCm vLLM, so "
                         "its rollout engines cannot start on AMD GPUs. Pin a ROCm build of vLLM for this "
                         "platform (platforms.rocm.packages) from an index that carries one")
    return BuildPlan(platform=platform, stack_name=stack_doc["name"], stack_sha256=stack_sha256,
                     dockerfile=dockerfile, build_args=args, labels=lab, context=ctx, inputs_sha256=inputs,
                     tag=image_tag(stack_doc["name"], platform, inputs), base_image=entry["base_image"],
                     base_unresolved=bool(entry.get("unresolved")), base_image_id=base_image_id,
                     notes=tuple(all_notes), problems=tuple(problems),
                     served=tuple(sorted((n, str(p)) for n, p in (served or {}).items())))


def context_tar(entries: list[ContextEntry] | tuple[ContextEntry, ...], read=lambda path: open(path, "rb").read()) -> bytes:
    """A deterministic tar: sorted paths, fixed mtime, uid/gid 0, explicit parent directories.

    Same entries, same bytes: the engine's COPY cache then hits on a rebuild.
    """
    buf = io.BytesIO()
    dirs: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in sorted(entries, key=lambda e: e.path):
            parts = e.path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    tar.addfile(_tarinfo(d, tarfile.DIRTYPE, 0o755, 0))
            data = e.data if e.data is not None else read(e.file)
            if e.data is None and e.digest.startswith("sha256:"):
                # A file read from disk (a wheel, say) must still be the bytes its digest (and so the
                # inputs sha256 and the tag) promised when the plan was made.
                found = hashlib.sha256(data).hexdigest()
                if found != e.digest.removeprefix("sha256:"):
                    raise CheckFailed(f"{e.file}: sha256 {found} is not the {e.digest.removeprefix('sha256:')} "
                                      f"recorded for {e.path}; the file changed after it was listed. Remove it "
                                      "(its directory is downloaded again) or restore it")
            tar.addfile(_tarinfo(e.path, tarfile.REGTYPE, e.mode, len(data)), io.BytesIO(data))
    return buf.getvalue()


def _tarinfo(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = CONTEXT_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info
