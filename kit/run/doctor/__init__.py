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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kit import __version__
from kit.build.lookup import find_stack_image
from kit.run.doctor.context import (DOCTOR_SCHEMA, FAIL, PASS, SKIP, ArmSpec, Check, Context, Gpu, _one_line,
                                    free_bytes, load_arm, min_driver_for_cuda)
from kit.run.doctor.host import (check_arm_image, check_other_images, judge_docker, judge_gpu_runtime, judge_gpus,
                                 judge_other_images, judge_ray, judge_space, observe_ray)
from kit.run.doctor.inputs import check_checkpoint, check_model, check_prompt_data
from kit.runtimes.leases import reap_stale

# what callers and tests use; the rules themselves live in context.py, host.py and inputs.py
__all__ = ["DOCTOR_SCHEMA", "FAIL", "PASS", "SKIP", "ArmSpec", "Check", "Context", "Gpu", "Report", "check_arm_image",
           "check_checkpoint", "check_model", "check_other_images", "check_prompt_data", "find_stack_image", "judge_docker",
           "judge_gpu_runtime", "judge_gpus", "judge_other_images", "judge_ray", "judge_space", "load_arm", "min_driver_for_cuda",
           "observe_ray", "run_doctor"]




# --- the table ------------------------------------------------------------------------------------

def _docker_checks(ctx: Context) -> list[Check]:
    return [judge_docker(ctx.docker)]


def _gpu_checks(ctx: Context) -> list[Check]:
    runtime = judge_gpu_runtime(ctx.arm, ctx.nvidia_runtime, ctx.rocm_devices, ctx.docker.get("runtimes", []))
    if ctx.arm is not None and not ctx.arm.needs_gpus:
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


def _leftover_checks(ctx: Context) -> list[Check]:
    """Runs killed with SIGKILL leave a lease naming what they started: doctor stops it (as kit run does)."""
    if ctx.workspace is None:
        return [Check("runs.leftovers", SKIP, "no workspace")]
    reaped = reap_stale(ctx.workspace)
    if not reaped:
        return [Check("runs.leftovers", PASS, "no killed run left anything running")]
    return [Check("runs.leftovers", PASS, "stopped what killed runs left: " + "; ".join(
        f"{run}: {', '.join(stopped) or 'nothing still running'}" for run, stopped in reaped))]


CHECKS: tuple[tuple[str, Callable[[Context], list[Check]]], ...] = (
    ("leftovers", _leftover_checks),
    ("docker", _docker_checks),
    ("gpu", _gpu_checks),
    ("space", _space_checks),
    ("ray", _ray_checks),
    ("image", lambda ctx: [check_arm_image(ctx), check_other_images(ctx)]),
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
