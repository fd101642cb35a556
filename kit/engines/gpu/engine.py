"""What the kit knows of the gpu engine: its command, its inputs, its accelerator's identity, its in-process run.

The accelerator identity is the GPU host's answer to "what ran this": driver and GPU from
nvidia-smi, torch with its CUDA build, Triton, the device's name and compute capability, and the
strict kernels' conformance fingerprint computed on that device (``kit kernels check --device
cuda --shape qwen3-8b`` gives the same value). Where something cannot be read, its entry says why.
Example::

    ident = accelerator_identity(gpu_info())
    ident["device"]["name"], ident["conformance"]["fingerprint"]     # ('NVIDIA H100 80GB HBM3', '59f3ccf6…')
"""

from __future__ import annotations

import importlib.metadata
import time
from typing import Callable

from kit.build import layout as L
from kit.engines.base import GiB, EngineBase, EngineCommand, HostNeeds
from kit.engines.smoke import ENGINE as SMOKE_ENGINE
from kit.engines.vime.records import parse_records
from kit.model.engine_traits import GPU

NAME = "gpu"
ENTRY_MODULE = "rlk_kernels.grpo.run"
CONFORMANCE_SHAPE = "qwen3-8b"


def command_argv(python: str, run_dir: str) -> list[str]:
    """The standalone command of a gpu run: the workload reading the run dir's arm.json."""
    return [python, "-m", ENTRY_MODULE, "--arm-file", f"{run_dir}/arm.json"]


def workload_inputs(arm_doc: dict) -> dict:
    """The manifest's ``inputs``: the built-in prompt set's hash and the model's config hash and seed.

    The initial weights are drawn on the device (seeded); the engine prints their sha256 in its log."""
    from rlk_kernels.grpo.config import GrpoConfig
    from rlk_kernels.grpo.task import PROMPT_SET_SIZE, prompt_set_sha256

    config = GrpoConfig.from_arm(arm_doc, device="cpu")
    return {"prompt_data": {"source": "rlk_kernels.grpo.task.prompt_set()", "sha256": prompt_set_sha256(),
                            "count": PROMPT_SET_SIZE},
            "model": {"source": f"rlk_kernels.grpo.policy.init_policy_weights(seed={config.seed}) on the device",
                      "name": config.model.name, "config_sha256": config.model.config_sha256,
                      "note": "seeded random initialisation at the arm's shapes; no pretrained weights"},
            "checkpoint": None}


def accelerator_identity(gpus: dict | None = None, *, conformance: bool = True) -> dict:
    """CUDA, torch, Triton and the strict kernels' fingerprint on this host's first GPU; ``gpus`` is the
    runtime's listing (driver and GPU names), kept beside them."""
    out: dict = {"gpus": gpus, "packages": {}}
    for name in ("torch", "triton"):
        try:
            out["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out["packages"][name] = None
    try:
        import torch
    except Exception as exc:   # a missing torch is itself the observation
        out["error"] = f"torch: {type(exc).__name__}: {exc}"[:300]
        return out
    out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if not torch.cuda.is_available():
        out["device"] = None
        out["conformance"] = {"skipped": "no CUDA device"}
        return out
    props = torch.cuda.get_device_properties(0)
    out["device"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                     "memory_gib": round(props.total_memory / 2**30, 1), "multiprocessors": props.multi_processor_count}
    if conformance:
        started = time.perf_counter()
        try:
            from rlk_kernels.conformance import conformance_fingerprint
            out["conformance"] = {"device": "cuda", "shape": CONFORMANCE_SHAPE,
                                  "fingerprint": conformance_fingerprint("cuda", CONFORMANCE_SHAPE),
                                  "seconds": round(time.perf_counter() - started, 1)}
        except Exception as exc:   # reported, not hidden: a failing oracle is an observation
            out["conformance"] = {"device": "cuda", "shape": CONFORMANCE_SHAPE,
                                  "error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def run_in_process(arm_doc: dict, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> int:
    """Run the workload of ``arm_doc`` here; returns the steps run (CUDA when present, else the CPU)."""
    from rlk_kernels.grpo.config import GrpoConfig
    from rlk_kernels.grpo.run import run_grpo

    return run_grpo(GrpoConfig.from_arm(arm_doc), emit=emit, should_stop=should_stop)


class GpuEngine(EngineBase):
    """The gpu engine behind the Engine protocol (kit/engines/base.py)."""

    traits = GPU
    needs = HostNeeds(1 * GiB, "torch's CUDA workers and the run's monitors share memory through /dev/shm",
                      2 * GiB, "run dirs with logs, metrics and monitor samples")
    log_keys = SMOKE_ENGINE.log_keys   # it prints the smoke workload's records
    in_process_module = ENTRY_MODULE

    def parse_records(self, lines, unparseable: list | None = None):
        return parse_records(lines, unparseable)

    def workload_inputs(self, doc: dict) -> dict:
        return workload_inputs(doc)

    def run_in_process(self, doc: dict, emit, should_stop) -> None:
        run_in_process(doc, emit=emit, should_stop=should_stop)

    def host_identity(self, gpus: dict) -> dict | None:
        return accelerator_identity(gpus)

    def command(self, doc: dict, layout: dict, stack, *, run_id: str, run_dir: str,
                capture_sizes: list[int]) -> EngineCommand:
        smoke = SMOKE_ENGINE.command(doc, layout, stack, run_id=run_id, run_dir=run_dir, capture_sizes=capture_sizes)
        return EngineCommand(command_argv(L.PYTHON, run_dir), smoke.env, smoke.working_dir)


ENGINE = GpuEngine()
