"""The vime engine: VIME's train.py inside the arm's image, driven by RL-Kernel's launcher revision.

Example::

    ENGINE.command(doc, layout, catalog.stack("vime-current"), run_id="r1", run_dir="/workspace/runs/r1",
                   capture_sizes=[1, 2, 3, 4]).working_dir         # '/opt/rlk/src/vime'
"""

from __future__ import annotations

from kit.build import layout as L
from kit.engines.base import GiB, CaptureSizes, EngineBase, EngineCommand, HostNeeds
from kit.engines.vime import command as vime
from kit.engines.vime.keys import LOG_KEYS
from kit.engines.vime.records import parse_records
from kit.model.engine_traits import VIME


class VimeEngine(EngineBase):
    traits = VIME
    needs = HostNeeds(64 * GiB, "NCCL's shared-memory transport between 8 ranks and Ray's object store "
                                "(the reference head used a 200 GB store) live in /dev/shm",
                      100 * GiB, "Qwen3-8B HF checkpoint (~16 GiB), its torch_dist conversion (~16 GiB), "
                                 "run dirs with logs and weight audits")
    gates = ("cuda-graph-engine",)
    log_keys = LOG_KEYS

    def plan_problems(self, doc: dict, stack) -> list[tuple[str, str]]:
        return vime.launcher_problems(doc, vime.launcher_for_stack(stack))

    def fixed_capture_sizes(self, doc: dict, stack) -> CaptureSizes | None:
        launcher = vime.launcher_for_stack(stack)
        fixed = vime.launcher_capture_sizes(doc, launcher)
        return CaptureSizes(fixed, f"the {launcher.name} launcher") if fixed is not None else None

    def adjust_layout(self, layout: dict, doc: dict, stack) -> None:
        launcher = vime.launcher_for_stack(stack)
        if not launcher.offload_rule:
            layout["offload_train"] = False   # reference §2.4: the historical launcher always passed --no-offload-train
            layout["offload_rule"] = f"the {launcher.name} launcher never offloads train (reference §2.4)"
        if launcher.default_memory_utilization is not None and doc["workload"].get("vllm_gpu_memory_utilization") is None:
            layout["vllm_gpu_memory_utilization"] = launcher.default_memory_utilization   # reference §1.5

    def parse_records(self, lines, unparseable: list | None = None):
        """VIME's ``rollout|step|perf N: {...}`` records (the smoke workload prints the same format)."""
        return parse_records(lines, unparseable)

    def command(self, doc: dict, layout: dict, stack, *, run_id: str, run_dir: str,
                capture_sizes: list[int]) -> EngineCommand:
        launcher = vime.launcher_for_stack(stack)
        cmd = vime.train_command(doc, layout, run_dir, capture_sizes=capture_sizes, launcher=launcher)
        env = vime.runtime_env_vars(doc, layout, run_id, run_dir, capture_sizes=capture_sizes, launcher=launcher)
        # plan/v1 closes only its top level: the launcher record goes under `command`, and its revision name
        # into the job metadata, which the run manifest keeps
        return EngineCommand(cmd.argv, env, L.source_dir("vime"), list(cmd.entrypoint_appended),
                             record={"launcher": vime.launcher_record(stack, launcher)},
                             metadata={"launcher_revision": launcher.name})


ENGINE = VimeEngine()
