"""Monitors: samplers started with a run and stopped with it, at one recorded interval, into ``monitors/``.

Each sampler writes one file in the run dir: the GPU (``nvidia-smi dmon``, or ``rocm-smi`` polled),
the host's CPU, memory and disk I/O (``vmstat`` and ``iostat`` where present, and ``psutil``
sampled in a thread, as CSV), and, on Ray, the cluster's object store (the dashboard's
``/api/cluster_status`` polled, as CSV). ``monitors/monitors.json`` (``rlk-kit/monitors/v1``) records the
interval, each sampler's command, file, status and sample count; a tool that is not there is
recorded as ``missing`` and never fails the run. The files are written before the seal, so they are
sealed with the rest. Example::

    monitors = Monitors(run_dir, interval_s=1.0, ray_address=None)     # a dashboard URL on Ray
    monitors.start()
    ...                                    # the job runs
    monitors.stop()                        # monitors/monitors.json lists gpu, vmstat, iostat, psutil
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kit.evidence.bundle import utc_now
from kit.model.documents import schema_id, write_new_document

MONITORS_DIR = "monitors"
MONITORS_FILE = f"{MONITORS_DIR}/monitors.json"
DEFAULT_INTERVAL_S = 1.0
PSUTIL_COLUMNS = ("time_s", "cpu_percent", "memory_used_bytes", "memory_available_bytes", "disk_read_bytes",
                  "disk_write_bytes")
RAY_COLUMNS = ("time_s", "object_store_used_bytes", "object_store_total_bytes", "cpu_used", "cpu_total")


@dataclass
class Sampler:
    """One sampler: a command streamed into a file, or a function called every interval into a CSV."""
    name: str
    what: str
    file: str
    command: list[str] | None = None
    tool: str | None = None           # the executable or module it needs; None: always available
    status: str = "pending"           # recorded | missing | failed
    note: str = ""
    samples: int = 0
    _process: subprocess.Popen | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        return {"name": self.name, "what": self.what, "tool": self.tool, "command": self.command,
                "file": self.file if self.status != "missing" else None, "status": self.status,
                "samples": self.samples, "note": self.note}


def _psutil():
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def plan_samplers(interval_s: float, ray_address: str | None = None) -> list[Sampler]:
    """The samplers this host can run (and those it cannot, marked missing), in a fixed order; the Ray
    object-store sampler only when the run is on Ray (``ray_address``: its dashboard URL)."""
    every = str(max(1, round(interval_s)))
    out = []
    if shutil.which("nvidia-smi"):
        out.append(Sampler("gpu", "GPU utilisation, memory, power, clocks (nvidia-smi dmon)", f"{MONITORS_DIR}/gpu-dmon.txt",
                           ["nvidia-smi", "dmon", "-s", "pucm", "-o", "T", "-d", every], "nvidia-smi"))
    elif shutil.which("rocm-smi"):
        out.append(Sampler("gpu", "GPU utilisation and memory (rocm-smi, polled)", f"{MONITORS_DIR}/gpu-rocm-smi.txt",
                           ["rocm-smi", "--showuse", "--showmemuse", "--csv"], "rocm-smi"))
    else:
        out.append(Sampler("gpu", "GPU utilisation and memory", f"{MONITORS_DIR}/gpu.txt", None, "nvidia-smi or rocm-smi",
                           status="missing", note="neither nvidia-smi nor rocm-smi is on PATH"))
    for name, command, what in (("vmstat", ["vmstat", "-n", "-t", every], "CPU, memory, swap, I/O (vmstat)"),
                                ("iostat", ["iostat", "-d", "-x", "-t", every], "disk I/O per device (iostat)")):
        sampler = Sampler(name, what, f"{MONITORS_DIR}/{name}.txt", command, name)
        if not shutil.which(name):
            sampler.status, sampler.note = "missing", f"{name} is not on PATH"
        out.append(sampler)
    sampler = Sampler("psutil", "CPU %, memory, disk bytes (psutil, in the kit's process)", f"{MONITORS_DIR}/host-psutil.csv",
                      None, "psutil")
    if _psutil() is None:
        sampler.status, sampler.note = "missing", "the psutil module is not importable"
    out.append(sampler)
    if ray_address:
        out.append(Sampler("ray-object-store", "Ray object store and CPU in use (the dashboard's cluster status)",
                           f"{MONITORS_DIR}/ray-object-store.csv", ["GET", f"{ray_address.rstrip('/')}{RAY_STATUS_PATH}"],
                           "ray dashboard"))
    return out


RAY_STATUS_PATH = "/api/cluster_status?format=0"


def ray_usage(payload: dict) -> tuple:
    """(object store used, total, CPU used, total) from the dashboard's cluster status document."""
    usage = payload["data"]["clusterStatus"]["loadMetricsReport"]["usage"]
    store, cpu = usage.get("objectStoreMemory", [None, None]), usage.get("CPU", [None, None])
    return store[0], store[1], cpu[0], cpu[1]


class Monitors:
    def __init__(self, run_dir: Path, *, interval_s: float = DEFAULT_INTERVAL_S, samplers: list[Sampler] | None = None,
                 ray_address: str | None = None):
        self.run_dir = Path(run_dir)
        self.interval_s = interval_s
        self.samplers = samplers if samplers is not None else plan_samplers(interval_s, ray_address)
        self._stop = threading.Event()
        self.started_at = self.stopped_at = None
        self._t0 = 0.0

    def start(self) -> None:
        """Start every available sampler; one that fails to start is recorded as failed, the run goes on."""
        (self.run_dir / MONITORS_DIR).mkdir(exist_ok=True)
        self.started_at, self._t0 = utc_now(), time.monotonic()
        for s in self.samplers:
            if s.status == "missing":
                continue
            try:
                if s.name in ("psutil", "ray-object-store"):
                    loop = self._psutil_loop if s.name == "psutil" else self._ray_loop
                    s._thread = threading.Thread(target=loop, args=(s,), daemon=True)
                    s._thread.start()
                elif s.tool == "rocm-smi":
                    s._thread = threading.Thread(target=self._poll_loop, args=(s,), daemon=True)
                    s._thread.start()
                else:
                    out = open(self.run_dir / s.file, "x", encoding="utf-8")
                    s._process = subprocess.Popen(s.command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                    out.close()
                s.status = "recorded"
            except OSError as exc:
                s.status, s.note = "failed", f"could not start: {exc.strerror or exc}"

    def stop(self) -> dict:
        """Stop every sampler, count its samples and write monitors/monitors.json; returns that document."""
        self._stop.set()
        for s in self.samplers:
            if s._process is not None:
                s._process.terminate()
                try:
                    s._process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    s._process.kill()
                    s._process.wait()
                s.samples = self._count_lines(s)
                if s._process.returncode not in (0, -15, 143) and s.samples == 0:
                    s.status, s.note = "failed", f"exited {s._process.returncode} with no samples"
            if s._thread is not None:
                s._thread.join(timeout=self.interval_s + 5)
                if s.samples == 0 and s.status == "recorded":
                    s.status = "failed"
        self.stopped_at = utc_now()
        doc = {"schema": schema_id("monitors"), "interval_s": self.interval_s, "started_at": self.started_at,
               "stopped_at": self.stopped_at, "samplers": [s.to_json() for s in self.samplers]}
        write_new_document(self.run_dir / MONITORS_FILE, doc, expected="monitors")
        return doc

    def _count_lines(self, s: Sampler) -> int:
        try:
            text = (self.run_dir / s.file).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return 0
        # data lines only: headers are comments (dmon) or hold no digit (vmstat, iostat)
        return sum(1 for line in text.splitlines()
                   if not line.lstrip().startswith("#") and any(ch.isdigit() for ch in line))

    def _psutil_loop(self, s: Sampler) -> None:
        psutil = _psutil()
        with open(self.run_dir / s.file, "x", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(PSUTIL_COLUMNS)
            psutil.cpu_percent(None)
            while True:
                disk = psutil.disk_io_counters()
                mem = psutil.virtual_memory()
                writer.writerow([round(time.monotonic() - self._t0, 3), psutil.cpu_percent(None), mem.used, mem.available,
                                 getattr(disk, "read_bytes", ""), getattr(disk, "write_bytes", "")])
                handle.flush()
                s.samples += 1
                if self._stop.wait(self.interval_s):
                    return

    def _poll_loop(self, s: Sampler) -> None:
        with open(self.run_dir / s.file, "x", encoding="utf-8") as handle:
            while True:
                try:
                    out = subprocess.run(s.command, capture_output=True, text=True, timeout=30).stdout
                    handle.write(f"# t={time.monotonic() - self._t0:.3f}\n{out}")
                    handle.flush()
                    s.samples += 1
                except (OSError, subprocess.SubprocessError) as exc:
                    s.note = f"poll failed: {exc}"[:200]
                if self._stop.wait(self.interval_s):
                    return

    def _ray_loop(self, s: Sampler) -> None:
        with open(self.run_dir / s.file, "x", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(RAY_COLUMNS)
            while True:
                try:
                    with urllib.request.urlopen(s.command[1], timeout=5) as resp:
                        row = ray_usage(json.loads(resp.read()))
                    writer.writerow([round(time.monotonic() - self._t0, 3), *row])
                    handle.flush()
                    s.samples += 1
                except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
                    s.note = f"poll failed: {type(exc).__name__}: {exc}"[:200]   # an unauthorised dashboard, say
                if self._stop.wait(self.interval_s):
                    return
