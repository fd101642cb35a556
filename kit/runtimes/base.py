"""The Runtime protocol and what the runtimes share: the job spec, the Ray-job base, host facts.

See :mod:`kit.runtimes` for the verbs. Example::

    JobSpec("rlk-r1", "python -m rlk_kernels.smoke --arm-file arm.json", ["python"], {}).submission_id   # 'rlk-r1'
"""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass, field
from typing import Callable

from kit.adapters.gpus import list_gpus
from kit.adapters.ray import RayJob
from kit.model.errors import BadInput
from kit.runtimes.leases import Lease


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
    address: str | None = None       # where its jobs run, when that is a Ray cluster
    lease: Lease = Lease.none()      # kit run gives each run its own: what preflight starts is recorded first

    def preflight(self) -> None:
        """Check (and for container runtimes start) where the job will run; raise on any mismatch."""

    def describe(self) -> dict:
        """Manifest sections: runtime, image, observed_identity, identity_differences, host, gpus, ray_cluster."""
        return {"runtime": {"kind": self.kind}, "image": None, "observed_identity": None, "identity_differences": [],
                "host": host_info(), "gpus": gpu_info(), "ray_cluster": None}

    def job_argv(self, plan: dict, host_run_dir: str) -> list[str]:
        return list(plan["command"]["argv"])

    def set_arm_document(self, doc: dict) -> None:
        """The resolved arm document the job runs (an in-process runtime hands it to the workload)."""

    def submit(self, spec: JobSpec) -> None:
        raise NotImplementedError

    def attach(self, submission_id: str) -> None:
        """Follow a job submitted earlier instead of submitting one; only a Ray cluster keeps jobs."""
        raise BadInput(f"the {self.kind} runtime keeps no job to attach to; --attach needs a run on --runtime ray")

    def job_status(self) -> str | None:
        """The job's current status; None when there is none or the cluster does not answer."""
        return None

    def job_info(self) -> dict:
        """What the job's runner recorded about it (status, message, times); empty when nothing did."""
        return {}

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

    def attach(self, submission_id: str) -> None:
        self.job = RayJob.existing(self.address, submission_id)

    def job_info(self) -> dict:
        return self.job.info() if self.job else {}

    def job_status(self) -> str | None:
        """The job's current status (``kit run --detach`` records it); None when the cluster does not answer."""
        try:
            return self.job.status() if self.job else None
        except Exception:
            return None


# --- host facts -------------------------------------------------------------------------------------

def host_info() -> dict:
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "machine": platform.machine()}


def gpu_info() -> dict:
    """The manifest's ``gpus`` section: devices and driver as the host reports them; none is an empty list."""
    listing = list_gpus()
    devices = [{"index": g.index, "name": g.name, "memory_mib": g.memory_mib, "driver": g.driver}
               if g.vendor == "nvidia" else {"vendor": g.vendor, "index": g.index, "name": g.name, "driver": g.driver}
               for g in listing.devices]
    return {"devices": devices, "driver": listing.driver, "source": listing.source}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(names) -> dict:
    """A distinct free host port for each name (chosen while all are held, so none repeats: ports
    picked one at a time can come back equal, and Ray refuses two components on one port)."""
    held, out = [], {}
    try:
        for name in names:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
            out[name] = s.getsockname()[1]
    finally:
        for s in held:
            s.close()
    return out
