"""The one GPU lister: what the host's driver tools report, as plain records.

NVIDIA GPUs come from ``nvidia-smi``, AMD GPUs from ``rocm-smi --json``, and, when neither tool is
installed but ``/dev/kfd`` is, one record per ``/dev/dri`` render node. No GPU is an empty listing, never
an error: a CPU host is a valid observation. Example::

    listing = list_gpus()
    listing.source                       # 'nvidia-smi', 'rocm-smi', '/dev/dri render nodes' or 'none found'
    [g.name for g in listing.devices]    # ['NVIDIA H200', ...]
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

NONE_FOUND = "none found"
NVIDIA_FIELDS = ("index", "name", "memory.total", "driver_version", "uuid", "compute_cap")
TIMEOUT_S = 30


@dataclass(frozen=True)
class Gpu:
    vendor: str
    index: int
    name: str
    driver: str
    uuid: str = ""
    memory_mib: int | None = None
    compute_cap: str = ""


@dataclass(frozen=True)
class GpuListing:
    devices: list[Gpu] = field(default_factory=list)
    source: str = NONE_FOUND

    @property
    def driver(self) -> str | None:
        return self.devices[0].driver if self.devices and self.devices[0].driver else None


def _output(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_nvidia_smi(text: str, fields: tuple[str, ...] = NVIDIA_FIELDS) -> list[Gpu]:
    """Rows of ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` (pure)."""
    out = []
    for row in text.strip().splitlines():
        parts = dict(zip(fields, (p.strip() for p in row.split(","))))
        if not parts.get("name"):
            continue
        try:
            memory = int(float(parts["memory.total"])) if parts.get("memory.total") else None
            index = int(parts.get("index", len(out)))
        except ValueError:
            continue
        out.append(Gpu("nvidia", index, parts["name"], parts.get("driver_version", ""), parts.get("uuid", ""),
                       memory, parts.get("compute_cap", "")))
    return out


def parse_rocm_smi(text: str) -> list[Gpu]:
    """Cards of ``rocm-smi --showproductname --showdriverversion --json`` (pure)."""
    try:
        cards = json.loads(text or "{}")
    except ValueError:
        return []
    driver = str(cards.get("system", {}).get("Driver version", ""))
    out = []
    for key, info in sorted(cards.items()):
        if key.startswith("card") and key[4:].isdigit():
            out.append(Gpu("amd", int(key[4:]), info.get("Card series", ""), info.get("Driver version", driver),
                           info.get("Unique ID", "")))
    return out


def list_gpus() -> GpuListing:
    """Every GPU the host's driver tools report (see the module docstring for the order asked)."""
    if shutil.which("nvidia-smi"):
        for fields in (NVIDIA_FIELDS, NVIDIA_FIELDS[:-1]):   # drivers before 510 lack compute_cap
            text = _output(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
            if text is not None:
                return GpuListing(parse_nvidia_smi(text, fields), "nvidia-smi")
    if shutil.which("rocm-smi"):
        text = _output(["rocm-smi", "--showproductname", "--showdriverversion", "--json"])
        if text is not None:
            return GpuListing(parse_rocm_smi(text), "rocm-smi")
    if Path("/dev/kfd").exists() and Path("/dev/dri").is_dir():
        version = Path("/sys/module/amdgpu/version")
        driver = version.read_text().strip() if version.exists() else "amdgpu"
        renders = sorted(Path("/dev/dri").glob("renderD*"))
        return GpuListing([Gpu("amd", i, "AMD GPU", driver) for i, _ in enumerate(renders)], "/dev/dri render nodes")
    return GpuListing()
