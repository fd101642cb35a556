"""Doctor's host rules: the Docker engine, the GPU runtime and GPUs, free space, the Ray cluster and the
arm's image. Pure functions over observations (tested with made-up ones) plus the image look-up. Example::

    judge_docker({"version": "20.10.24", "api_version": "1.41"}).status     # 'PASS'
"""


from __future__ import annotations

import re
from pathlib import Path

from kit.adapters import docker as dockerdoor
from kit.adapters.ray import dashboard_version
from kit.build.images import check_image
from kit.build.lookup import find_stack_image, other_input_images
from kit.engines import get_engine
from kit.run.doctor.context import FAIL, MIN_DOCKER, PASS, SKIP, ArmSpec, Check, Context, Gpu, _gib, _one_line, min_driver_for_cuda, version_tuple




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
    if arm is not None and not arm.needs_gpus:
        return Check(name, SKIP, f"arm {arm.name} runs the {arm.engine} engine on CPU; no GPU runtime needed")
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
    if not arm.needs_gpus:
        reason = f"arm {arm.name} runs the {arm.engine} engine on CPU"
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
    needs = get_engine(arm.engine).needs
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
    """Ask the dashboard of a running head for its versions; ``{"error": ...}`` when it does not answer."""
    try:
        body = dashboard_version(address)
    except Exception as exc:
        return {"error": _one_line(exc)}
    return {"jobs_api_version": str(body.get("version")), "ray_version": body.get("ray_version"),
            "ray_commit": body.get("ray_commit")}


# --- images ---------------------------------------------------------------------------------------

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
    ref = dockerdoor.ref_of(image)
    details = {"image": ref, "id": image.id}
    try:
        result = check_image(image.id, arm.stack_document, client=ctx.docker["client"])
    except Exception as exc:
        return Check("image", FAIL, f"{ref}: cannot check against stack {arm.stack_name} ({_one_line(exc)})", details)
    ok, problems = _image_verdict(result)
    if ok:
        return Check("image", PASS, f"{ref} matches stack {arm.stack_name} ({arm.stack_sha256[:12]})", details)
    return Check("image", FAIL, f"{ref} does not match stack {arm.stack_name}: " + "; ".join(problems[:5]), details)


def check_other_images(ctx: Context) -> Check:
    """What the engine still holds of this stack's earlier inputs: never a failure, but where a build's
    disk may go (an image of another revision keeps every layer it does not share)."""
    arm = ctx.arm
    if arm is None or "error" in ctx.docker:
        return Check("image.others", SKIP, "no --arm" if arm is None else "no Docker engine (see docker.engine)")
    client, platform = ctx.docker["client"], ctx.platform
    try:
        chosen = find_stack_image(arm.stack_name, arm.stack_sha256, platform, client)
        others = other_input_images(client, arm.stack_name, platform, chosen.id if chosen is not None else None)
    except Exception as exc:
        return Check("image.others", SKIP, f"cannot list images ({_one_line(exc)})")
    return judge_other_images(arm.stack_name, platform, others)


def judge_other_images(stack_name: str, platform: str, others: list[tuple[str, str, int]]) -> Check:
    """PASS either way; the reason names the images of other inputs and the command that removes them."""
    if not others:
        return Check("image.others", PASS, f"no {platform} images of other inputs of stack {stack_name} on the engine")
    total = sum(size for _, _, size in others)
    refs = [ref for ref, _, _ in others]
    shown = " ".join(refs[:6]) + (f" … ({len(refs) - 6} more)" if len(refs) > 6 else "")
    return Check("image.others", PASS,
                 f"{len(refs)} {platform} image(s) of other inputs of stack {stack_name} hold {_own_size(total)} of "
                 f"their own on the engine (layers shared with other images not counted); a run never picks them: "
                 f"docker image rm {shown}",
                 {"images": [{"ref": ref, "id": image_id, "own_bytes": size} for ref, image_id, size in others],
                  "own_bytes": total})


def _own_size(n: int) -> str:
    return _gib(n) if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"   # a kit layer alone is a few MiB


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


