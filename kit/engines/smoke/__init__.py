"""The smoke engine: the kit's own small GRPO workload (``rlk_kernels.smoke``) on CPU, in-process or as a
Ray job, with the strict/native operators. Example::

    ENGINE.command(doc, layout, stack, run_id="r1", run_dir="/workspace/runs/r1", capture_sizes=[]).argv[-2:]
    # ['--arm-file', '/workspace/runs/r1/arm.json']
"""

from __future__ import annotations

import hashlib

from kit.build import layout as L
from kit.engines.base import GiB, EngineBase, EngineCommand, HostNeeds
from kit.engines.vime.records import parse_records
from kit.model.engine_traits import SMOKE


class SmokeEngine(EngineBase):
    traits = SMOKE
    needs = HostNeeds(1 * GiB, "the smoke run's Ray object store and torch workers share memory through /dev/shm",
                      2 * GiB, "run dirs and a CPU image of about 1 GiB")
    gates = ("operator-routes", "model-identity")
    in_process_module = "rlk_kernels.smoke"
    ray_actor_flag = "--ray"
    log_keys = ("train/loss", "train/grad_norm", "rollout/reward", "perf/step_time", "perf/rollout_time")

    def parse_records(self, lines, unparseable: list | None = None):
        """VIME's ``rollout|step|perf N: {...}`` records (the smoke workload prints the same format)."""
        return parse_records(lines, unparseable)

    def workload_inputs(self, doc: dict) -> dict:
        """Hashes of the smoke workload's inputs: its built-in prompt set and its model (config, initial weights)."""
        from rlk_kernels.model import init_weights, weights_sha256   # the workload: torch behind it
        from rlk_kernels.smoke import SmokeConfig, prompt_set

        config = SmokeConfig.from_arm(doc)
        prompts, answers = prompt_set()
        digest = hashlib.sha256(prompts.contiguous().numpy().tobytes() + b"|"
                                + answers.contiguous().numpy().tobytes()).hexdigest()
        return {"prompt_data": {"source": "rlk_kernels.smoke.prompt_set()", "sha256": digest,
                                "count": int(prompts.shape[0])},
                "model": {"source": f"rlk_kernels.model.init_weights(seed={config.seed})", "name": config.model.name,
                          "config_sha256": config.model.config_sha256,
                          "weights_sha256": weights_sha256(init_weights(config.model, config.seed))},
                "checkpoint": None}

    def run_in_process(self, doc: dict, emit, should_stop) -> None:
        from rlk_kernels.smoke import SmokeConfig, run_smoke   # the workload: torch behind it

        run_smoke(SmokeConfig.from_arm(doc), emit=emit, should_stop=should_stop)

    def command(self, doc: dict, layout: dict, stack, *, run_id: str, run_dir: str,
                capture_sizes: list[int]) -> EngineCommand:
        argv = [L.PYTHON, "-m", "rlk_kernels.smoke", "--arm-file", f"{run_dir}/arm.json"]
        env = {"PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": str(doc["workload"]["seed"]), "RAY_USAGE_STATS_ENABLED": "0",
               "RL_KERNEL_ATTENTION_CASE": doc["operators"]["attention"], "RL_KERNEL_FFN_CASE": doc["operators"]["ffn"],
               "RL_KERNEL_LOGP_CASE": doc["operators"]["logp"], "RL_KERNEL_RUN_ID": run_id}
        return EngineCommand(argv, env, run_dir)


ENGINE = SmokeEngine()
