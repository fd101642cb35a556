"""Preflight of a host for one arm: checks as data, each PASS, FAIL or SKIP with its reason.

The checks are a table (``CHECKS``) of small functions over a ``Context``. A context holds the arm
(or none) and *observations* of the host, gathered lazily and once: the Docker engine, GPUs, free
space, the Ray cluster. The rules that judge observations are pure functions, so they are tested
with made-up observations as well as on this host. Example::

    report = run_doctor(Context(arm=load_arm("G10"), workspace=Path("ws")))
    [c.line() for c in report.checks]   # ['PASS docker.engine: Docker Engine 20.10.24 (API 1.41)', ...]
    report.passed                       # False on a host without GPUs

Exit code of ``kit doctor``: 1 when any check FAILs, else 0. SKIP is never a failure; its reason
says why the check does not apply (a smoke arm needs no GPU; no Ray address was given).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, TextIO

from kit import __version__
from kit.model.documents import schema_id
from kit.model.errors import BadInput

DOCTOR_SCHEMA = schema_id("doctor")
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
GiB = 1 << 30
MIN_DOCKER = (20, 10)


# --- what each engine needs from the host ------------------------------------------------------

@dataclass(frozen=True)
class Needs:
    shm_bytes: int
    shm_reason: str
    disk_bytes: int
    disk_reason: str


ENGINE_NEEDS: dict[str, Needs] = {
    "smoke": Needs(
        1 * GiB, "the smoke run's Ray object store and torch workers share memory through /dev/shm",
        2 * GiB, "run dirs and a CPU image of about 1 GiB"),
    "vime": Needs(
        64 * GiB, "NCCL's shared-memory transport between 8 ranks and Ray's object store "
                  "(the reference head used a 200 GB store) live in /dev/shm",
        100 * GiB, "Qwen3-8B HF checkpoint (~16 GiB), its torch_dist conversion (~16 GiB), "
                   "run dirs with logs and weight audits"),
}

# Minimum Linux driver of each CUDA toolkit (NVIDIA CUDA release notes, "toolkit driver version").
MIN_DRIVER_BY_CUDA: dict[tuple[int, int], str] = {
    (11, 8): "520.61.05", (12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03",
    (12, 3): "545.23.06", (12, 4): "550.54.14", (12, 5): "555.42.02", (12, 6): "560.28.03",
    (12, 8): "570.26", (12, 9): "575.51.03", (13, 0): "580.65.06",
}


def min_driver_for_cuda(major: int, minor: int) -> str | None:
    """``min_driver_for_cuda(12, 8) == "570.26"``; an unlisted minor takes the nearest lower one."""
    known = [k for k in MIN_DRIVER_BY_CUDA if k[0] == major and k <= (major, minor)]
    return MIN_DRIVER_BY_CUDA[max(known)] if known else None


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:4])


# --- result ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    name: str
    status: str
    reason: str
    details: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.status} {self.name}: {self.reason}"

    def to_json(self) -> dict:
        out = {"name": self.name, "status": self.status, "reason": self.reason}
        if self.details:
            out["details"] = self.details
        return out


@dataclass(frozen=True)
class ArmSpec:
    """What doctor needs of an arm: its resolved document and its stack's document and identity."""

    name: str
    document: dict
    stack_name: str
    stack_document: dict
    stack_sha256: str

    @property
    def engine(self) -> str:
        return self.document["engine"]

    @property
    def gpus(self) -> int:
        return int(self.document["topology"]["gpus"])


def load_arm(name: str) -> ArmSpec:
    """The arm from the catalog of manifests (``kit.catalog.Catalog.default().arm(name)``)."""
    from kit.model.catalog import Catalog

    arm = Catalog.default().arm(name)
    return ArmSpec(arm.name if hasattr(arm, "name") else name, arm.document,
                   arm.stack.name, arm.stack.document, arm.stack.sha256)


# --- observations ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str
    compute_cap: str = ""


@dataclass
class Context:
    """The arm, the workspace and the Ray address, plus host observations gathered on first use."""

    arm: ArmSpec | None = None
    workspace: Path | None = None
    ray_address: str | None = None
    progress: TextIO | None = None      # where re-hashing a model or checkpoint reports its progress

    @cached_property
    def docker(self) -> dict:
        """``{"client", "version", "api_version", "runtimes"}`` or ``{"error": ...}``."""
        try:
            import docker

            client = docker.from_env(timeout=20)
            version = client.version()
            info = client.info()
        except Exception as exc:  # docker-py raises several types for "no engine"
            return {"error": _one_line(exc)}
        return {"client": client, "version": version.get("Version", "?"),
                "api_version": version.get("ApiVersion", "?"),
                "runtimes": sorted((info.get("Runtimes") or {}).keys())}

    @cached_property
    def nvidia_runtime(self) -> bool:
        return "nvidia" in self.docker.get("runtimes", [])

    @cached_property
    def rocm_devices(self) -> bool:
        return Path("/dev/kfd").exists() and Path("/dev/dri").is_dir()

    @cached_property
    def gpus(self) -> tuple[list[Gpu], str]:
        """The GPUs the host driver reports, and how they were listed."""
        if shutil.which("nvidia-smi"):
            out = _run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"])
            if out is not None:
                gpus = []
                for row in out.splitlines():
                    parts = [p.strip() for p in row.split(",")]
                    if len(parts) >= 2 and parts[0]:
                        gpus.append(Gpu(parts[0], parts[1], parts[2] if len(parts) > 2 else ""))
                return gpus, "nvidia-smi"
        if self.rocm_devices:
            renders = sorted(Path("/dev/dri").glob("renderD*"))
            driver = Path("/sys/module/amdgpu/version")
            drv = driver.read_text().strip() if driver.exists() else "amdgpu"
            return [Gpu("AMD GPU", drv) for _ in renders], "/dev/dri render nodes"
        return [], "no nvidia-smi and no /dev/kfd"

    @property
    def platform(self) -> str:
        if self.arm is None or self.arm.engine == "smoke":
            return "cpu"
        return "rocm" if self.rocm_devices and not self.nvidia_runtime else "cuda"

    @property
    def disk_path(self) -> Path:
        path = self.workspace if self.workspace is not None else Path.cwd()
        while not path.exists() and path != path.parent:
            path = path.parent  # a workspace not made yet lives on its parent's file system
        return path


def _run(argv: list[str], timeout: float = 15) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


# --- pure rules -----------------------------------------------------------------------------------

def judge_docker(obs: dict) -> Check:
    if "error" in obs:
        return Check("docker.engine", FAIL, f"no Docker engine answers ({obs['error']}); start one "
                     "(`nohup dockerd >/tmp/dockerd.log 2>&1 &` without systemd) or set DOCKER_HOST")
    details = {"version": obs["version"], "api_version": obs["api_version"]}
    if version_tuple(obs["version"])[:2] < MIN_DOCKER:
        return Check("docker.engine", FAIL, f"Docker Engine {obs['version']} is older than "
                     f"{'.'.join(map(str, MIN_DOCKER))} (GPU device requests and shm_size through the API)", details)
    return Check("docker.engine", PASS, f"Docker Engine {obs['version']} (API {obs['api_version']})", details)


def judge_gpu_runtime(arm: ArmSpec | None, nvidia_runtime: bool, rocm_devices: bool, runtimes: list[str]) -> Check:
    name = "gpu.runtime"
    found = ("NVIDIA container runtime" if nvidia_runtime else
             "ROCm devices /dev/kfd and /dev/dri" if rocm_devices else None)
    if arm is not None and arm.engine == "smoke":
        return Check(name, SKIP, f"arm {arm.name} runs the smoke engine on CPU; no GPU runtime needed")
    if found:
        return Check(name, PASS, found, {"runtimes": runtimes})
    if arm is None:
        return Check(name, SKIP, f"no GPU runtime (docker runtimes: {', '.join(runtimes) or 'none'}); "
                     "only smoke arms can run here")
    return Check(name, FAIL, f"arm {arm.name} needs GPUs in containers: no 'nvidia' runtime in docker info "
                 f"Runtimes ({', '.join(runtimes) or 'none'}) and no ROCm devices /dev/kfd, /dev/dri",
                 {"runtimes": runtimes})


def judge_gpus(arm: ArmSpec | None, gpus: list[Gpu], listed_by: str, platform: str) -> list[Check]:
    """gpu.count, gpu.model and gpu.driver against the arm's topology and stack."""
    if arm is None:
        reason = "no --arm: " + (f"{len(gpus)} GPU(s): {', '.join(sorted({g.name for g in gpus}))}" if gpus
                                 else f"no GPUs ({listed_by})")
        return [Check(n, SKIP, reason) for n in ("gpu.count", "gpu.model", "gpu.driver")]
    if arm.engine == "smoke":
        reason = f"arm {arm.name} runs the smoke engine on CPU"
        return [Check(n, SKIP, reason) for n in ("gpu.count", "gpu.model", "gpu.driver")]
    out = []
    details = {"gpus": [g.__dict__ for g in gpus], "listed_by": listed_by}
    if len(gpus) < arm.gpus:
        out.append(Check("gpu.count", FAIL, f"arm {arm.name} needs {arm.gpus} GPU(s) (topology.gpus); "
                         f"found {len(gpus)} ({listed_by})", details))
    else:
        out.append(Check("gpu.count", PASS, f"{len(gpus)} GPU(s), arm {arm.name} needs {arm.gpus}", details))
    if not gpus:
        out.append(Check("gpu.model", SKIP, "no GPU to inspect (see gpu.count)"))
        out.append(Check("gpu.driver", SKIP, "no GPU to inspect (see gpu.count)"))
        return out
    out.append(_judge_model(arm, gpus, platform))
    out.append(_judge_driver(arm, gpus, platform))
    return out


def _judge_model(arm: ArmSpec, gpus: list[Gpu], platform: str) -> Check:
    entry = (arm.stack_document.get("platforms") or {}).get(platform) or {}
    names = sorted({g.name for g in gpus})
    archs = [a.rstrip("a") for a in entry.get("cuda_arch_list", [])]
    if platform == "cuda" and archs:
        caps = sorted({g.compute_cap for g in gpus})
        bad = [c for c in caps if c not in archs]
        if bad or "" in caps:
            return Check("gpu.model", FAIL, f"{', '.join(names)} with compute capability {', '.join(caps)}; "
                         f"stack {arm.stack_name} is compiled for {', '.join(archs)} (cuda_arch_list)")
        return Check("gpu.model", PASS, f"{', '.join(names)} (compute capability {', '.join(caps)}) in the stack's "
                     f"cuda_arch_list {', '.join(archs)}")
    return Check("gpu.model", PASS, f"{', '.join(names)}; stack {arm.stack_name} names no arch list for {platform}")


def _judge_driver(arm: ArmSpec, gpus: list[Gpu], platform: str) -> Check:
    drivers = sorted({g.driver for g in gpus})
    base = ((arm.stack_document.get("platforms") or {}).get(platform) or {}).get("base_image", "")
    m = re.search(r"cuda:(\d+)\.(\d+)", base)
    if platform != "cuda" or not m:
        return Check("gpu.driver", PASS, f"driver {', '.join(drivers)}; no CUDA toolkit minimum for {platform}")
    major, minor = int(m.group(1)), int(m.group(2))
    need = min_driver_for_cuda(major, minor)
    if need is None:
        return Check("gpu.driver", FAIL, f"no known minimum driver for CUDA {major}.{minor} of the stack's base image")
    old = [d for d in drivers if version_tuple(d) < version_tuple(need)]
    if old:
        return Check("gpu.driver", FAIL, f"driver {', '.join(old)} is older than {need}, the minimum for CUDA "
                     f"{major}.{minor} in stack {arm.stack_name}'s base image")
    return Check("gpu.driver", PASS, f"driver {', '.join(drivers)} >= {need} (CUDA {major}.{minor})")


def judge_space(name: str, arm: ArmSpec | None, path: Path, free: int) -> Check:
    if arm is None:
        return Check(name, SKIP, f"no --arm: {_gib(free)} free at {path}; needs depend on the arm's engine",
                     {"path": str(path), "free_bytes": free})
    needs = ENGINE_NEEDS[arm.engine]
    need, why = (needs.shm_bytes, needs.shm_reason) if name == "host.shm" else (needs.disk_bytes, needs.disk_reason)
    details = {"path": str(path), "free_bytes": free, "needed_bytes": need}
    if free < need:
        return Check(name, FAIL, f"{_gib(free)} free at {path}, a {arm.engine} arm needs {_gib(need)}: {why}", details)
    return Check(name, PASS, f"{_gib(free)} free at {path} (a {arm.engine} arm needs {_gib(need)})", details)


def judge_ray(arm: ArmSpec | None, address: str | None, observed: dict | None) -> Check:
    if not address:
        return Check("ray.cluster", SKIP, "no --ray-address or RAY_ADDRESS: the docker and local runtimes start "
                     "their own Ray head")
    if "error" in observed:
        return Check("ray.cluster", FAIL, f"Ray Jobs API at {address} does not answer ({observed['error']}); "
                     "start a head with --include-dashboard=true or fix the address")
    version = observed.get("ray_version")
    details = {"address": address, **{k: v for k, v in observed.items() if k != "error"}}
    wanted = (arm.stack_document.get("packages") or {}).get("ray") if arm else None
    if wanted and version and version != wanted:
        return Check("ray.cluster", FAIL, f"Ray {version} at {address}; stack {arm.stack_name} pins ray {wanted}",
                     details)
    return Check("ray.cluster", PASS, f"Ray {version or '(version not reported)'} at {address}, Jobs API "
                 f"{observed.get('jobs_api_version', '?')}" + (", matches the stack's pin" if wanted else ""), details)


def observe_ray(address: str) -> dict:
    """Ask the Ray Jobs API of a running head for its versions; ``{"error": ...}`` when it does not answer."""
    try:
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(address)
        jobs_api = client.get_version()
        out: dict[str, Any] = {"jobs_api_version": str(jobs_api)}
        try:  # /api/version also carries the cluster's Ray version
            resp = client._do_request("GET", "/api/version")
            if resp.status_code == 200:
                body = resp.json()
                out["ray_version"] = body.get("ray_version")
                out["ray_commit"] = body.get("ray_commit")
        except Exception:
            pass
        return out
    except Exception as exc:
        return {"error": _one_line(exc)}


# --- images ---------------------------------------------------------------------------------------

def find_stack_image(stack_name: str, stack_sha256: str, platform: str, client=None):
    """The image a run of this stack and platform would use, or None.

    First the Docker runtime's own choice (:meth:`kit.runtimes.docker.DockerRuntime.stack_image`: by the
    labels ``kit build`` sets, the newest), so doctor checks the image the run starts; then, only to
    report it, the newest image of the tag form ``rlk-kit/<stack>:<platform>-<inputs12>``, which finds an
    image of an older revision of the stack for ``check_image`` to name the differences of.
    """
    import docker

    from kit.runtimes.docker import DockerRuntime

    client = client or docker.from_env(timeout=20)
    chosen = DockerRuntime.stack_image(client, stack_sha256, platform)
    if chosen is not None:
        return chosen
    candidates = [image for image in client.images.list(name=f"rlk-kit/{stack_name}")
                  if any(tag.split(":", 1)[-1].startswith(f"{platform}-") for tag in image.tags)]
    return max(candidates, key=DockerRuntime.image_age_key, default=None)


def check_arm_image(ctx: Context) -> Check:
    arm = ctx.arm
    if arm is None:
        return Check("image", SKIP, "no --arm: which image is needed depends on the arm's stack")
    if "error" in ctx.docker:
        return Check("image", FAIL, "no Docker engine to look for the image in (see docker.engine)")
    platform = ctx.platform
    try:
        image = find_stack_image(arm.stack_name, arm.stack_sha256, platform, ctx.docker["client"])
    except Exception as exc:
        return Check("image", FAIL, f"cannot list images ({_one_line(exc)})")
    if image is None:
        return Check("image", FAIL, f"image not built: no rlk-kit/{arm.stack_name}:{platform}-* on the engine; "
                     f"run kit build {platform} --arm {arm.name}")
    from kit.runtimes.docker import DockerRuntime

    ref = DockerRuntime.ref_of(image)
    try:
        from kit.build.images import check_image
    except ImportError:
        return Check("image", FAIL, f"{ref} found, but kit.images.check_image is not available to match it "
                     f"against stack {arm.stack_name}")
    details = {"image": ref, "id": image.id}
    try:
        result = check_image(image.id, arm.stack_document, client=ctx.docker["client"])
    except Exception as exc:
        return Check("image", FAIL, f"{ref}: cannot check against stack {arm.stack_name} ({_one_line(exc)})", details)
    ok, problems = _image_verdict(result)
    if ok:
        return Check("image", PASS, f"{ref} matches stack {arm.stack_name} ({arm.stack_sha256[:12]})", details)
    return Check("image", FAIL, f"{ref} does not match stack {arm.stack_name}: " + "; ".join(problems[:5]), details)


def _image_verdict(result) -> tuple[bool, list[str]]:
    """Read check_image's answer (kit.images.ImageCheck: matches, differences)."""
    if isinstance(result, bool):
        return result, ([] if result else ["labels or embedded stack differ"])
    if isinstance(result, (list, tuple)):
        return not result, [str(p) for p in result]
    problems = next((getattr(result, a) for a in ("differences", "problems", "mismatches") if hasattr(result, a)), [])
    ok = next((getattr(result, a) for a in ("matches", "ok", "passed") if hasattr(result, a)), not problems)
    return bool(ok), [_difference(p) for p in problems]


def _difference(item) -> str:
    if isinstance(item, (tuple, list)) and len(item) == 3:  # kit.images: (label or field, expected, found)
        return f"{item[0]} expected {item[1]!r}, found {item[2]!r}"
    return str(item)


# --- workspace inputs -----------------------------------------------------------------------------

def _workspace_input_guard(ctx: Context, name: str, needed: str, builtin: str) -> Check | None:
    """SKIP without an arm or on the smoke engine (built-in inputs), FAIL without a workspace.

    ``_workspace_input_guard(ctx, "inputs.checkpoint", "a checkpoint is", "model")``
    """
    if ctx.arm is None:
        return Check(name, SKIP, f"no --arm: whether {needed} needed depends on the arm")
    if ctx.arm.engine == "smoke":
        return Check(name, SKIP, f"arm {ctx.arm.name} uses the smoke engine's built-in {builtin}")
    if ctx.workspace is None:
        return Check(name, FAIL, "no workspace: pass --workspace or set KIT_WORKSPACE")
    return None


def arm_input_pin(arm: ArmSpec | None, field: str) -> str | None:
    """The hash the arm's lock pins for one input (its ``inputs`` object), None when it pins none."""
    return ((arm.document.get("inputs") or {}).get(field)) if arm is not None else None


def check_prompt_data(ctx: Context) -> Check:
    name = "inputs.prompt_data"
    skipped = _workspace_input_guard(ctx, name, "prompt data are", "prompts")
    if skipped:
        return skipped
    from kit.inputs.files import HashCache, hash_file_cached
    from kit.inputs.prepare import PUBLISHED_OUTPUT_SHA256, Workspace, read_provenance

    ws = Workspace(ctx.workspace)
    if not ws.data_provenance.exists() or not ws.data.exists():
        return Check(name, FAIL, f"{ws.data} or its provenance is missing; run kit prepare --workspace {ws.root}")
    try:
        doc = read_provenance(ws.data_provenance, "dataset")
        cache = HashCache(ws.hash_cache)
        actual = hash_file_cached(ws.data, cache)
        cache.save()
    except BadInput as exc:
        return Check(name, FAIL, str(exc))
    details = {"path": str(ws.data), "sha256": actual, "provenance": str(ws.data_provenance)}
    if actual != doc["output_sha256"]:
        return Check(name, FAIL, f"{ws.data} has sha256 {actual}, its provenance says {doc['output_sha256']}: "
                     "changed after kit prepare", details)
    pin = arm_input_pin(ctx.arm, "prompt_data_sha256")
    if pin is not None:   # the lock decides, whatever kit prepare accepted
        if actual == pin:
            return Check(name, PASS, f"{ws.data.name} sha256 {actual[:12]}... as arm {ctx.arm.name} pins "
                         "(inputs.prompt_data_sha256)", details)
        return Check(name, FAIL, f"{ws.data.name} sha256 {actual} is not the {pin} arm {ctx.arm.name} pins "
                     f"(inputs.prompt_data_sha256); prepare the data from the published source", details)
    if actual == PUBLISHED_OUTPUT_SHA256:
        return Check(name, PASS, f"{ws.data.name} sha256 {actual[:12]}... equals the published DAPO-Math-17k "
                     "conversion", details)
    if doc.get("accepted_new_hash"):
        return Check(name, PASS, f"{ws.data.name} sha256 {actual[:12]}... is NOT the published "
                     f"{PUBLISHED_OUTPUT_SHA256[:12]}...; accepted with --accept-new-hash at prepare time "
                     "(recorded in its provenance)", details)
    return Check(name, FAIL, f"{ws.data.name} sha256 {actual} from {doc['source']} differs from the published "
                 f"{PUBLISHED_OUTPUT_SHA256} that vime arms expect; prepare from the published source or pass "
                 "--accept-new-hash to kit prepare", details)


def select_checkpoint(ws, arm: ArmSpec, platform: str | None = None) -> tuple[Path | None, dict | None, str]:
    """The converted checkpoint this arm would use (:func:`kit.prepare.select_checkpoint`)."""
    from kit.inputs.prepare import select_checkpoint as select

    return select(ws, arm.stack_name, arm.stack_sha256, platform)


def check_checkpoint(ctx: Context) -> Check:
    name = "inputs.checkpoint"
    arm = ctx.arm
    skipped = _workspace_input_guard(ctx, name, "a checkpoint is", "model")
    if skipped:
        return skipped
    from kit.inputs.files import hash_tree, tree_sha256
    from kit.inputs.prepare import Workspace

    ws = Workspace(ctx.workspace)
    where, doc, note = select_checkpoint(ws, arm, ctx.platform)
    if doc is None:
        return Check(name, FAIL, f"no torch_dist checkpoint converted with stack {arm.stack_name} "
                     f"({arm.stack_sha256[:12]}) in {ws.root / 'checkpoints'}; run kit prepare --workspace "
                     f"{ws.root} --model PATH --convert-checkpoint --arm {arm.name}")
    try:
        actual = tree_sha256(hash_tree(ws.root / doc["output"], ws.hash_cache, progress=ctx.progress))
    except BadInput as exc:
        return Check(name, FAIL, str(exc), {"provenance": str(where)})
    if actual != doc["tree_sha256"]:
        return Check(name, FAIL, f"{doc['output']} tree sha256 {actual} differs from its provenance "
                     f"{doc['tree_sha256']}", {"provenance": str(where)})
    return Check(name, PASS, f"{doc['output']} tree sha256 {actual[:12]}... as converted "
                 f"(model {doc['model_tree_sha256'][:12]}...){note}", {"provenance": str(where)})


def select_model(ws, arm: ArmSpec, platform: str | None = None) -> tuple[list[tuple[Path, dict]], str]:
    """The model provenance(s) the arm's inputs name, and how they were chosen.

    The model is the one the arm's checkpoint (:func:`select_checkpoint`) was converted from; without
    such a checkpoint, every model provenance of the workspace (usually one) is checked.
    """
    from kit.inputs.prepare import read_provenance

    _, checkpoint, _ = select_checkpoint(ws, arm, platform)
    if checkpoint is not None:
        path = ws.model_provenance(checkpoint["model_tree_sha256"])
        return [(path, read_provenance(path, "model"))] if path.exists() else [], (
            f"the model of checkpoint {checkpoint['output']}")
    found = []
    for path in sorted(ws.provenance_dir.glob("model-*.json")):
        found.append((path, read_provenance(path, "model")))
    return found, "no checkpoint of this stack names one; every hashed model of the workspace"


def compare_model_files(recorded: dict[str, str], observed: dict[str, str]) -> list[str]:
    """Per-file differences between a model provenance and a re-hash, one line each, sorted."""
    out = [f"{n}: missing" for n in sorted(set(recorded) - set(observed))]
    out += [f"{n}: not in the provenance" for n in sorted(set(observed) - set(recorded))]
    out += [f"{n}: sha256 {observed[n][:12]}... differs from {recorded[n][:12]}..."
            for n in sorted(set(recorded) & set(observed)) if recorded[n] != observed[n]]
    return sorted(out)


def check_model(ctx: Context) -> Check:
    """Re-hash the Hugging Face model the workspace's provenance names (per file, cached) and compare."""
    name = "inputs.model"
    arm = ctx.arm
    skipped = _workspace_input_guard(ctx, name, "a Hugging Face model is", "model")
    if skipped:
        return skipped
    from kit.inputs.files import hash_tree, tree_sha256
    from kit.inputs.prepare import Workspace

    ws = Workspace(ctx.workspace)
    try:
        models, chosen = select_model(ws, arm, ctx.platform)
    except BadInput as exc:
        return Check(name, FAIL, str(exc))
    if not models:
        return Check(name, FAIL, f"no hashed Hugging Face model in {ws.provenance_dir} ({chosen}); run kit prepare "
                     f"--workspace {ws.root} --no-dataset --model PATH")
    passed = []
    for where, doc in models:
        model_dir = Path(doc["path"])
        details = {"provenance": str(where), "path": str(model_dir)}
        if not model_dir.is_dir():
            return Check(name, FAIL, f"{model_dir} (hashed in {where.name}) is gone", details)
        try:
            observed = hash_tree(model_dir, ws.hash_cache, progress=ctx.progress)
        except BadInput as exc:
            return Check(name, FAIL, str(exc), details)
        differences = compare_model_files(doc["files"], observed)
        if differences:
            shown = "; ".join(differences[:4]) + (f" and {len(differences) - 4} more" if len(differences) > 4 else "")
            return Check(name, FAIL, f"{model_dir} changed since kit prepare hashed it ({where.name}): {shown}",
                         {**details, "differences": differences})
        passed.append((model_dir, tree_sha256(observed)))
    pin = arm_input_pin(arm, "model_tree_sha256")
    if pin is not None and all(tree != pin for _, tree in passed):
        shown = ", ".join(f"{d} tree sha256 {t}" for d, t in passed)
        return Check(name, FAIL, f"{shown}: not the {pin} arm {arm.name} pins (inputs.model_tree_sha256)",
                     {"provenance": [str(w) for w, _ in models]})
    shown = ", ".join(f"{d} tree sha256 {t[:12]}..." for d, t in passed)
    return Check(name, PASS, f"{shown}: every file hashes as recorded ({chosen})",
                 {"provenance": [str(w) for w, _ in models]})


# --- the table ------------------------------------------------------------------------------------

def _docker_checks(ctx: Context) -> list[Check]:
    return [judge_docker(ctx.docker)]


def _gpu_checks(ctx: Context) -> list[Check]:
    runtime = judge_gpu_runtime(ctx.arm, ctx.nvidia_runtime, ctx.rocm_devices, ctx.docker.get("runtimes", []))
    if ctx.arm is not None and ctx.arm.engine == "smoke":
        return [runtime] + judge_gpus(ctx.arm, [], "", "cpu")
    gpus, listed_by = ctx.gpus
    return [runtime] + judge_gpus(ctx.arm, gpus, listed_by, ctx.platform)


def _space_checks(ctx: Context) -> list[Check]:
    shm = Path("/dev/shm")
    out = []
    if shm.is_dir():
        out.append(judge_space("host.shm", ctx.arm, shm, free_bytes(shm)))
    else:
        out.append(Check("host.shm", FAIL, "/dev/shm does not exist"))
    out.append(judge_space("host.disk", ctx.arm, ctx.disk_path, free_bytes(ctx.disk_path)))
    return out


def _ray_checks(ctx: Context) -> list[Check]:
    address = ctx.ray_address
    return [judge_ray(ctx.arm, address, observe_ray(address) if address else None)]


CHECKS: tuple[tuple[str, Callable[[Context], list[Check]]], ...] = (
    ("docker", _docker_checks),
    ("gpu", _gpu_checks),
    ("space", _space_checks),
    ("ray", _ray_checks),
    ("image", lambda ctx: [check_arm_image(ctx)]),
    ("inputs", lambda ctx: [check_prompt_data(ctx), check_model(ctx), check_checkpoint(ctx)]),
)


@dataclass(frozen=True)
class Report:
    arm: ArmSpec | None
    workspace: Path | None
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    def to_json(self) -> dict:
        counts = {s.lower(): sum(c.status == s for c in self.checks) for s in (PASS, FAIL, SKIP)}
        return {
            "schema": DOCTOR_SCHEMA,
            "created_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "kit_version": __version__,
            "arm": None if self.arm is None else {"name": self.arm.name, "engine": self.arm.engine,
                                                   "stack": {"name": self.arm.stack_name,
                                                             "sha256": self.arm.stack_sha256}},
            "workspace": None if self.workspace is None else str(self.workspace),
            "checks": [c.to_json() for c in self.checks],
            "counts": counts,
            "passed": self.passed,
        }


def run_doctor(ctx: Context) -> Report:
    checks: list[Check] = []
    for group, fn in CHECKS:
        try:
            checks.extend(fn(ctx))
        except Exception as exc:  # one broken probe must not hide the other checks
            checks.append(Check(group, FAIL, f"check crashed: {type(exc).__name__}: {_one_line(exc)}"))
    return Report(ctx.arm, ctx.workspace, tuple(checks))
