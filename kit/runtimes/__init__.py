"""Runtimes: where a run's job executes — in this process (local), in the arm's container (docker),
or on an existing Ray cluster (ray). One interface, so ``kit.run`` never knows Docker or Ray.

Every runtime goes through the same verbs: ``preflight`` (prove the software identity where the job
will run; may start a container or a Ray head), ``describe`` (what the manifest records), ``submit``,
``follow`` (stream the engine's log lines until a terminal job status), ``stop_job`` and ``close``.
Example::

    rt = make_runtime("docker", arm=arm, image="rlk-kit/smoke:cpu-0123456789ab", workspace=ws)
    rt.preflight(); rt.submit(spec); status = rt.follow(emit=print, should_stop=lambda: False); rt.close()
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass(frozen=True)
class JobSpec:
    """What to run: a shell entrypoint and its runtime environment, as the Jobs API takes them."""

    submission_id: str
    entrypoint: str
    argv: list[str]
    env_vars: dict[str, str]
    working_dir: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)


class Runtime:
    kind = "abstract"

    def preflight(self) -> None:
        """Check (and for container runtimes start) where the job will run; raise on any mismatch."""

    def describe(self) -> dict:
        """Manifest sections: runtime, image, observed_identity, identity_differences, host, gpus, ray_cluster."""
        return {"runtime": {"kind": self.kind}, "image": None, "observed_identity": None, "identity_differences": [],
                "host": host_info(), "gpus": gpu_info(), "ray_cluster": None}

    def job_argv(self, plan: dict, host_run_dir: str) -> list[str]:
        return list(plan["command"]["argv"])

    def submit(self, spec: JobSpec) -> None:
        raise NotImplementedError

    def follow(self, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> str:
        """Stream the job's own output lines to ``emit`` until a terminal status; return it."""
        raise NotImplementedError

    def stop_job(self) -> None:
        """Ask the job to stop (Ctrl-C, SIGTERM)."""

    def close(self) -> None:
        """Release what preflight started (container, Ray head). Always called."""


class RayJobRuntime(Runtime):
    """A runtime whose job is a Ray job (docker: the head inside the container; ray: an existing cluster)."""

    job: "RayJob | None" = None

    def follow(self, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> str:
        return self.job.follow(emit, should_stop)

    def stop_job(self) -> None:
        if self.job:
            self.job.stop()

    def job_info(self) -> dict:
        return self.job.info() if self.job else {}

    def job_status(self) -> str | None:
        """The job's current status (``kit run --detach`` records it); None when the cluster does not answer."""
        try:
            return self.job.status() if self.job else None
        except Exception:
            return None


def make_runtime(kind: str, **kw) -> Runtime:
    if kind == "local" and kw.get("ray_head"):
        from kit.runtimes.local_ray import LocalRayRuntime
        return LocalRayRuntime(**kw)
    if kind == "local":
        from kit.runtimes.local import LocalRuntime
        return LocalRuntime(**kw)
    if kind == "docker":
        from kit.runtimes.docker import DockerRuntime
        return DockerRuntime(**kw)
    if kind == "ray":
        from kit.runtimes.ray import RayRuntime
        return RayRuntime(**kw)
    from kit.model.errors import BadInput
    raise BadInput(f"--runtime {kind!r}: accepted local, docker, ray")


# --- host facts -------------------------------------------------------------------------------------

def host_info() -> dict:
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "machine": platform.machine()}


def gpu_info() -> dict:
    """GPUs and driver from nvidia-smi (or rocm-smi); none found is an empty list, not an error."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30).stdout
            devices = []
            for line in out.strip().splitlines():
                idx, name, mem, driver = [p.strip() for p in line.split(",")]
                devices.append({"index": int(idx), "name": name, "memory_mib": int(float(mem)), "driver": driver})
            return {"devices": devices, "driver": devices[0]["driver"] if devices else None, "source": "nvidia-smi"}
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    if shutil.which("rocm-smi"):
        try:
            out = subprocess.run(["rocm-smi", "--showproductname", "--showdriverversion"], capture_output=True, text=True,
                                 timeout=30).stdout
            return {"devices": [{"rocm_smi": out.strip()[:2000]}], "driver": None, "source": "rocm-smi"}
        except (OSError, subprocess.SubprocessError):
            pass
    return {"devices": [], "driver": None, "source": "none found"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the Ray Jobs API, shared by the docker and ray runtimes ---------------------------------------------

class RayJob:
    """One job on a cluster through ``JobSubmissionClient``: submit, stream logs, terminal status, stop.

    The log is polled with ``get_job_logs`` and only the new tail is emitted, so a dashboard that
    restarts or a slow reader never duplicates or drops lines. A cluster that stops answering for
    ``lost_after_s`` is reported as ``LOST`` (the job's fate is unknown: never counted as success).
    """

    def __init__(self, address: str, *, lost_after_s: float = 10.0, poll_s: float = 0.5,
                 alive: Callable[[], bool] | None = None):
        from ray.job_submission import JobSubmissionClient

        quiet_ray_sdk_logs()
        self.address = address
        self.alive = alive
        self.client = JobSubmissionClient(address)
        self.lost_after_s = lost_after_s
        self.poll_s = poll_s
        self.submission_id: str | None = None
        self._seen = 0
        self._partial = ""

    @classmethod
    def existing(cls, address: str, submission_id: str, **kw) -> "RayJob":
        """A job submitted earlier (``kit run --detach``), followed by its submission id."""
        job = cls(address, **kw)
        job.submission_id = submission_id
        return job

    def status(self) -> str:
        return str(self.client.get_job_status(self.submission_id).value)

    def submit(self, spec: JobSpec) -> str:
        quiet_ray_sdk_logs()     # packaging modules are imported lazily, on the first upload
        runtime_env: dict = {"env_vars": dict(spec.env_vars)}
        if spec.working_dir:
            runtime_env["working_dir"] = spec.working_dir
        self.submission_id = self.client.submit_job(entrypoint=spec.entrypoint, submission_id=spec.submission_id,
                                                    runtime_env=runtime_env, metadata=dict(spec.metadata))
        return self.submission_id

    def _drain(self, emit: Callable[[str], None], final: bool = False) -> None:
        text = self.client.get_job_logs(self.submission_id)
        if len(text) < self._seen:
            # The job log got shorter: Ray restarted it. Read it again from the start; any step record
            # it repeats then fails the steps-once gate, which is right: the log no longer vouches
            # that each step ran once.
            self._seen = 0
        new = text[self._seen:]
        self._seen = len(text)
        buf = self._partial + new
        lines = buf.split("\n")
        self._partial = lines.pop()
        for line in lines:
            emit(line)
        if final and self._partial:
            emit(self._partial)
            self._partial = ""

    def follow(self, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> str:
        last_ok = time.monotonic()
        stopping = False
        while True:
            if should_stop() and not stopping:
                stopping = True
                self.stop()
            try:
                status = str(self.client.get_job_status(self.submission_id).value)
                self._drain(emit)
                last_ok = time.monotonic()
            except Exception:
                if time.monotonic() - last_ok > self.lost_after_s or (self.alive is not None and not self.alive()):
                    if self._partial:
                        emit(self._partial)
                    return "LOST"
                time.sleep(self.poll_s)
                continue
            if status in TERMINAL:
                try:
                    self._drain(emit, final=True)
                except Exception:
                    pass
                return status
            time.sleep(self.poll_s)

    def stop(self) -> None:
        if self.submission_id:
            try:
                self.client.stop_job(self.submission_id)
            except Exception:
                pass

    def info(self) -> dict:
        try:
            info = self.client.get_job_info(self.submission_id)
            return {"status": str(info.status.value), "message": info.message, "metadata": dict(info.metadata or {}),
                    "start_time_ms": info.start_time, "end_time_ms": info.end_time}
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"[:500]}


# Loggers of the Jobs SDK that print at INFO on the user's terminal ("Uploading package ...", "Creating a
# file package ..."). Some set their own level, so quieting their parent "ray" is not enough.
RAY_SDK_LOGGERS = ("ray", "ray.dashboard", "ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk",
                   "ray._private.runtime_env.packaging", "ray._private.runtime_env.working_dir",
                   "ray._private.runtime_env.py_modules")


def quiet_ray_sdk_logs() -> None:
    """Raise every Ray logger of this process to WARNING: the kit reports progress itself, and
    ``--json`` output must be the only thing a script reads (stderr stays empty)."""
    import logging

    names = set(RAY_SDK_LOGGERS) | {n for n in logging.Logger.manager.loggerDict if n == "ray" or n.startswith("ray.")}
    for name in names:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET or logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


# How long a cluster the user named (--ray-address, a detached run's address) may take to answer before
# it counts as unreachable; a head the kit starts itself gets wait_for_jobs_api's longer default.
NAMED_CLUSTER_TIMEOUT_S = 20.0


def wait_for_jobs_api(address: str, timeout_s: float = 90.0, *, unreachable=None) -> None:
    """Poll until the dashboard's Jobs API answers (the head takes several seconds to come up).

    ``unreachable`` is the error class raised when it never answers: CheckFailed (default) for a head
    the kit started itself, BadInput for an address the user named."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{address}/api/version", timeout=3) as resp:
                if resp.status == 200:
                    return
        except Exception as exc:
            last = str(exc)
        time.sleep(0.5)
    from kit.model.errors import CheckFailed
    raise (unreachable or CheckFailed)(f"the Ray Jobs API at {address} did not answer within {timeout_s:.0f} s ({last})")
