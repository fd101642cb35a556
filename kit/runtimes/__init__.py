"""Runtimes: where a run's job executes — in this process (local), in the arm's container (docker),
or on an existing Ray cluster (ray). One interface, so ``kit.run`` never knows Docker or Ray.

Every runtime goes through the same verbs, all defined on :class:`Runtime` (no caller probes for one):
``preflight`` (start where the job will run and prove its software identity: may start a container or a
Ray head), ``describe`` (what the probe found, as the manifest records it), ``submit``, ``attach`` (to a job
submitted earlier: ``kit run --attach``), ``follow`` (stream the engine's log lines until a terminal job
status), ``job_status``, ``job_info``, ``stop_job`` and ``close`` (stop what preflight started).
Example::

    rt = make_runtime("docker", arm=arm, image="rlk-kit/smoke:cpu-0123456789ab", workspace=ws)
    rt.preflight(); rt.submit(spec); status = rt.follow(emit=print, should_stop=lambda: False); rt.close()
"""

from __future__ import annotations

from kit.model.errors import BadInput
from kit.runtimes.base import JobSpec, RayJobRuntime, Runtime, free_port, gpu_info, host_info
from kit.runtimes.docker import DockerRuntime
from kit.runtimes.local import LocalRuntime
from kit.runtimes.local_ray import LocalRayRuntime
from kit.runtimes.ray import RayRuntime

__all__ = ["JobSpec", "RayJobRuntime", "Runtime", "free_port", "gpu_info", "host_info", "make_runtime"]


def make_runtime(kind: str, **kw) -> Runtime:
    if kind == "local" and kw.get("ray_head"):
        return LocalRayRuntime(**kw)
    if kind == "local":
        return LocalRuntime(**kw)
    if kind == "docker":
        return DockerRuntime(**kw)
    if kind == "ray":
        return RayRuntime(**kw)
    raise BadInput(f"--runtime {kind!r}: accepted local, docker, ray")
