"""The GRPO driver: sync weights, roll out, train; one set of VIME-format records per step.

Per step: the trainer's weights are synced to the rollout engine (cast to the compute dtype), the
engine samples ``group_size`` responses for each of ``prompts_per_step`` prompts, the reward is
verified, and the trainer recomputes log-probs, compares them with the rollout's and takes one
AdamW step. Records are printed as VIME prints them (``rollout N``, ``perf N`` rollout side,
``step N``, ``perf N`` train side), with the same keys the smoke workload prints. Example::

    config = GrpoConfig.from_arm(json.load(open("manifests/gpu-consistency.json")))
    run_grpo(config.with_rollouts(2), emit=print)

or ``python -m rlk_kernels.grpo.run --arm-file ARM.json [--rollouts N] [--device cpu]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rlk_kernels.grpo.config import GrpoConfig
from rlk_kernels.grpo.policy import RolloutEngine, compute_dtype
from rlk_kernels.grpo.task import DIGIT0, PROMPT_SET_SIZE, prompt_set, prompt_set_sha256, successor_reward
from rlk_kernels.grpo.trainer import Trainer, synchronize

PRODUCTION_IDS = {"attention": "torch.sdpa.prefill_decode", "ffn": "torch.matmul.rank_order_allreduce",
                  "logp": "torch.matmul_bf16.fp32_log_softmax"}
# fused production (the arm's production "fused", on CUDA): the no-grad passes' kernels (rlk_kernels.grpo.fused)
FUSED_PRODUCTION_IDS = {"attention": "triton.fused_rms_qk_norm_rope.sdpa_fastest_backend",
                        "ffn": "triton.fused_add_rms_norm.merged_gate_up.silu_and_mul",
                        "logp": "torch.matmul_bf16.triton_logp_from_logits"}


def backend_id(module: str, letter: str, device: str, fused: dict | None = None) -> str:
    from rlk_kernels import ops
    if letter == "R":
        return ops.strict_backend_id(module, device.split(":")[0])
    piece = "logp" if module == "logp" else "layers"
    return FUSED_PRODUCTION_IDS[module] if fused and fused[piece] else PRODUCTION_IDS[module]


def route_lines(config: GrpoConfig) -> list[str]:
    from rlk_kernels.grpo.fused import uses_fused
    lines = []
    for side, framework, target in (("train", "gpu-train", "training"), ("rollout", "gpu-rollout", "rollout")):
        impls = config.impls(side)
        fused = uses_fused(config.production, impls, config.device)
        for module, letter in impls.items():
            requested = "rl_kernel" if letter == "R" else "production"
            lines.append(f"[RL-Kernel][route] framework={framework} target={target} module={module} "
                         f"requested={requested} actual={backend_id(module, letter, config.device, fused)} "
                         "fallback=false")
    return lines


def graph_line(config: GrpoConfig) -> str:
    """Whether rollout decode steps run as CUDA graphs (the arm's /graph), and for which batch sizes."""
    sizes = sorted(config.decode_graph_sizes)
    if not sizes:
        return "gpu decode graphs: NONE (every decode step eager)"
    span = f"{sizes[0]}..{sizes[-1]}" if sizes == list(range(sizes[0], sizes[-1] + 1)) else ",".join(map(str, sizes))
    where = ("captured from the second rollout on" if str(config.device).startswith("cuda")
             else "none here: no CUDA device, every step eager")
    return f"gpu decode graphs: FULL_DECODE_ONLY for batch sizes {span} ({where}; batch here {config.batch})"


def production_line(config: GrpoConfig) -> str:
    """Which production formula the P modules run, and where the fused one applies."""
    from rlk_kernels.grpo.fused import uses_fused
    train = uses_fused(config.production, config.impls("train"), config.device)
    rollout = uses_fused(config.production, config.impls("rollout"), config.device)
    where = "no-grad passes (rollout prefill/decode, log-prob recomputes); the actor pass is the eager graph"
    has_p = any(letter == "P" for side in ("train", "rollout") for letter in config.impls(side).values())
    if config.production == "fused" and not (any(train.values()) or any(rollout.values())):
        where = ("nowhere here: no P module (R modules do not read it)" if not has_p
                 else "nowhere here: on the CPU the eager formula runs" if not str(config.device).startswith("cuda")
                 else "nowhere here: Triton is unavailable, the eager formula runs")
    return (f"gpu production: {config.production} (train layers={str(train['layers']).lower()} "
            f"logp={str(train['logp']).lower()}; rollout layers={str(rollout['layers']).lower()} "
            f"logp={str(rollout['logp']).lower()}): {where if config.production == 'fused' else 'the eager formula'}")


def _round(record: dict) -> dict:
    return {k: (round(v, 10) if isinstance(v, float) else v) for k, v in record.items()}


def device_line(config: GrpoConfig) -> str:
    import torch
    if str(config.device).startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        return (f"gpu device: {props.name} capability={props.major}.{props.minor} "
                f"memory_gib={props.total_memory / 2**30:.1f} torch={torch.__version__} cuda={torch.version.cuda}")
    return f"gpu device: cpu torch={torch.__version__}"


def run_grpo(config: GrpoConfig, emit=print, should_stop=lambda: False) -> int:
    """Run in this process on ``config.device``; returns the number of steps run."""
    import torch

    device, c = config.device, config
    with torch.device(device):
        emit(device_line(c))
        trainer = Trainer(c, log=emit)
        rollout = RolloutEngine(c.model, impls=c.impls("rollout"), dtype=compute_dtype(device), device=device,
                                temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, production=c.production,
                                log=emit, decode_graph_sizes=c.decode_graph_sizes)
        ident = trainer.identity()
        emit(f"gpu model {c.model.name}: config_sha256={ident['config_sha256']} weights_sha256={ident['weights_sha256']} "
             f"dtype={ident['dtype']} seed={c.seed} rollout_seed={c.rollout_seed} prompts_sha256={prompt_set_sha256()}")
        for line in route_lines(c):
            emit(line)
        emit(production_line(c))
        emit(graph_line(c))
        emit(f"rlkernel mismatch sidecar active: logp_case={c.logp_case}")
        prompts_all = prompt_set().to(device)
        done, generated, mismatched, compared = 0, 0, 0, 0
        for step in range(c.rollouts):
            if should_stop():
                break
            synchronize(device)
            step_started = time.perf_counter()
            rollout.load_weights(trainer.params)
            synchronize(device)
            update_weights = time.perf_counter() - step_started

            rollout_started = time.perf_counter()
            index = torch.arange(step * c.prompts_per_step, (step + 1) * c.prompts_per_step, device=device) % PROMPT_SET_SIZE
            prompts = prompts_all[index.repeat_interleave(c.group_size)]
            generator = torch.Generator(device=device).manual_seed(c.rollout_seed * 1_000_003 + step)
            tokens, rollout_logp = rollout.generate(prompts, response_len=c.response_len, generator=generator)
            responses = tokens[:, prompts.shape[1]:]
            rewards = successor_reward(responses, prompts[:, -2])
            synchronize(device)
            rollout_time = time.perf_counter() - rollout_started

            n_tokens = responses.numel()
            generated += n_tokens
            groups = rewards.view(-1, c.group_size)
            normalized = ((groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, unbiased=False, keepdim=True) + 1e-6)).view(-1)
            mean_logp = float(rollout_logp.mean())
            total_len = prompts.shape[1] + c.response_len
            emit(f"rollout {step}: " + repr(_round({
                "rollout/raw_reward": float(rewards.mean()), "rollout/rewards": float(normalized.mean()),
                "rollout/advantages": float(normalized.mean()), "rollout/log_probs": mean_logp,
                "rollout/rollout_log_probs": mean_logp, "rollout/response_lengths": float(c.response_len),
                "rollout/total_lengths": float(total_len), "rollout/truncated": 0.0, "rollout/truncated_ratio": 0.0,
                "rollout/response_len/mean": float(c.response_len), "rollout/response_len/max": c.response_len,
                "rollout/response_len/min": c.response_len, "rollout/response_len/median": float(c.response_len),
                "rollout/digit_fraction": float(((responses >= DIGIT0) & (responses < DIGIT0 + 10)).float().mean()),
            })))
            per_second = 1.0 / max(rollout_time, 1e-9)
            emit(f"perf {step}: " + repr(_round({
                "perf/rollout_time": rollout_time, "perf/tokens_per_gpu_per_sec": n_tokens * per_second,
                "perf/longest_sample_tokens_per_sec": c.response_len * per_second,
                "perf/effective_tokens_per_gpu_per_sec": n_tokens * per_second,
                "perf/longest_effective_sample_tokens_per_sec": c.response_len * per_second,
            })))

            train_started = time.perf_counter()
            result = trainer.train(tokens, rollout_logp, rewards)
            train_time = time.perf_counter() - train_started
            emit(f"step {step}: " + repr(_round(dict(result["record"], **{"train/step": step}))))
            timers = result["timers"]
            mismatched += timers["mismatched_tokens"]
            compared += timers["compared_tokens"]
            step_time = time.perf_counter() - step_started
            perf = {
                "perf/step_time": step_time, "perf/train_time": train_time,
                "perf/actor_train_time": timers["actor_train_time"], "perf/update_weights_time": update_weights,
                "perf/train_wait_time": rollout_time + update_weights,
                "perf/data_preprocess_time": timers["data_preprocess_time"],
                "perf/actor_train_tok_per_s": timers["total_tokens"] / max(timers["actor_train_time"], 1e-9),
                "perf/actor_train_tflops": timers["actor_train_tflops"],
                "perf/log_probs_time": timers["log_probs_time"], "perf/log_probs_tflops": timers["log_probs_tflops"],
                "perf/wait_time_ratio": (rollout_time + update_weights) / max(step_time, 1e-9),
            }
            if "ref_log_probs_time" in timers:
                perf.update({"perf/ref_log_probs_time": timers["ref_log_probs_time"],
                             "perf/ref_log_probs_tflops": timers["ref_log_probs_tflops"]})
            emit(f"perf {step}: " + repr(_round(perf)))
            done += 1
        peak = torch.cuda.max_memory_allocated() / 2**30 if str(device).startswith("cuda") else 0.0
        emit(f"gpu run summary: steps={done} generated_tokens={generated} compared_tokens={compared} "
             f"mismatched_tokens={mismatched} peak_memory_gib={peak:.1f}")
    return done


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlk_kernels.grpo.run",
                                     description="Run the GRPO workload of a gpu arm and print VIME-format records.")
    parser.add_argument("--arm-file", required=True, help="an rlk-kit/arm JSON document with engine 'gpu'")
    parser.add_argument("--rollouts", type=int, help="override /workload/rollouts")
    parser.add_argument("--device", help="cuda (default when a GPU is present) or cpu")
    args = parser.parse_args(argv)
    try:
        with open(args.arm_file, encoding="utf-8") as handle:
            config = GrpoConfig.from_arm(json.load(handle), device=args.device)
        if args.rollouts is not None:
            config = config.with_rollouts(args.rollouts)
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        print(f"grpo: {args.arm_file}: {exc}", file=sys.stderr)
        return 2
    run_grpo(config, emit=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
