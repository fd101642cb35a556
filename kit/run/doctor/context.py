"""What doctor's checks work on: the result type, the arm as doctor reads it, and the host observations
(gathered lazily and once). Example::

    Context(arm=load_arm("G10"), workspace=Path("ws")).gpus     # ([Gpu('NVIDIA H200', '570.86', '9.0'), ...], 'nvidia-smi')
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TextIO

from kit.adapters import docker as dockerdoor
from kit.adapters.gpus import NONE_FOUND, list_gpus
from kit.model.documents import schema_id
from kit.model.engine_traits import traits
from kit.model.catalog import Catalog

DOCTOR_SCHEMA = schema_id("doctor")
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
GiB = 1 << 30
MIN_DOCKER = (20, 10)


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

    @property
    def needs_gpus(self) -> bool:
        return traits(self.engine).needs_gpus


def load_arm(name: str) -> ArmSpec:
    """The arm from the catalog of manifests (``kit.catalog.Catalog.default().arm(name)``)."""

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
        return dockerdoor.engine_facts()

    @cached_property
    def nvidia_runtime(self) -> bool:
        return "nvidia" in self.docker.get("runtimes", [])

    @cached_property
    def rocm_devices(self) -> bool:
        return Path("/dev/kfd").exists() and Path("/dev/dri").is_dir()

    @cached_property
    def gpus(self) -> tuple[list[Gpu], str]:
        """The GPUs the host driver reports, and how they were listed."""
        listing = list_gpus()
        if not listing.devices and listing.source == NONE_FOUND:
            return [], "no nvidia-smi, no rocm-smi and no /dev/kfd"
        return [Gpu(g.name, g.driver, g.compute_cap) for g in listing.devices], listing.source

    @property
    def platform(self) -> str:
        if self.arm is None or not self.arm.needs_gpus:
            return traits(self.arm.engine).platform if self.arm else "cpu"
        return "rocm" if self.rocm_devices and not self.nvidia_runtime else "cuda"

    @property
    def disk_path(self) -> Path:
        path = self.workspace if self.workspace is not None else Path.cwd()
        while not path.exists() and path != path.parent:
            path = path.parent  # a workspace not made yet lives on its parent's file system
        return path


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


