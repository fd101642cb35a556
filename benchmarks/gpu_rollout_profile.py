"""Where a GPU arm's rollout or log-prob recompute spends its time: strict (R) against fused production (P+) on one CUDA GPU.

The GPU claim's end-to-end tax is dominated by the rollout (R/R ÷ P/P 2.3x at prefill + 24 decode steps of
batch 1024 over at most 28 keys), a shape the layer benchmark does not cover. This builds the arm's policy
(``--arm``'s model, default ``manifests/gpu-native-w1.json``'s; seeded weights), runs the rollout engine of each side once to warm
up, then once under the torch profiler, and prints the wall time and the kernels that take the most GPU
time, grouped by name. ``--stage recompute`` profiles the training side's log-prob pass instead
(``policy.sequence_logprobs`` over the rollout's full sequences in the arm's micro-batches: the
"log-prob recompute" and "reference log-probs" stages of a GRPO step). Usage (torch and Triton only;
``kernels/`` is registered as ``rlk_kernels``)::

    python benchmarks/gpu_rollout_profile.py [--stage rollout|recompute] [--batch 1024] [--top 12] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def profile_call(name, call, top):
    """``call`` once to warm up (compiles, certifies, chooses backends), once timed, once under the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    call()
    torch.cuda.synchronize()
    started = time.perf_counter()
    call()
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    rows = {}
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
        if us > 0:
            rows[event.key[:90]] = (us, event.count)
    total = sum(us for us, _ in rows.values())
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]
    print(f"== {name}: wall {wall * 1e3:.1f} ms, GPU kernels {total / 1e3:.1f} ms in "
          f"{sum(c for _, c in rows.values())} launches", flush=True)
    for key, (us, count) in ranked:
        print(f"   {us / 1e3:8.2f} ms  {count:6d}x  {key}", flush=True)
    return {"wall_ms": wall * 1e3, "kernel_ms": total / 1e3,
            "top": [{"kernel": k, "ms": us / 1e3, "launches": c} for k, (us, c) in ranked]}


def main(argv=None) -> int:
    from gpu_strict_kernels import add_rollout_arguments, arm_model
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("rollout", "recompute"), default="rollout",
                        help="the rollout (prefill and decode steps) or the training side's log-prob pass")
    add_rollout_arguments(parser, "gpu-native-w1")
    parser.add_argument("--top", type=int, default=12, help="kernels listed per side")
    args = parser.parse_args(argv)
    arm, cfg = arm_model(args.arm)
    import torch
    from rlk_kernels.grpo import policy
    from rlk_kernels.grpo.task import PROMPT_LEN, prompt_set
    doc = {"device": torch.cuda.get_device_name(0), "arm": args.arm, "stage": args.stage, "batch": args.batch,
           "response": args.response, "sides": {}}
    with torch.no_grad(), torch.device("cuda"):
        weights = policy.init_policy_weights(cfg, 1234, "cuda")
        prompts = prompt_set().cuda()
        prompts = prompts.repeat((args.batch + prompts.shape[0] - 1) // prompts.shape[0], 1)[:args.batch]
        for name, impls, production in (("P+ (fused production)", policy.ALL_P, "fused"),
                                        ("R (strict)", {"attention": "R", "ffn": "R", "logp": "R"}, "fused")):
            if args.stage == "rollout":
                engine = policy.RolloutEngine(cfg, impls=impls, dtype=torch.bfloat16, device="cuda",
                                              production=production)
                engine.load_weights(weights)
                call = (lambda e=engine: e.generate(prompts, response_len=args.response,
                                                    generator=torch.Generator(device="cuda").manual_seed(7)))
            else:
                engine = policy.cast(weights, torch.bfloat16)
                rope = policy.rope_for(cfg, torch.bfloat16, "cuda")
                tokens = torch.randint(0, cfg.vocab, (args.batch, PROMPT_LEN + args.response),
                                       generator=torch.Generator(device="cuda").manual_seed(7), device="cuda")
                chunk = max(1, arm["workload"]["max_tokens_per_gpu"] // (PROMPT_LEN + args.response))
                call = (lambda w=engine, impls=impls, rope=rope, tokens=tokens, chunk=chunk: policy.sequence_logprobs(
                    w, cfg, rope, tokens, impls, prompt_len=PROMPT_LEN, chunk=chunk, production=production))
            doc["sides"][name] = profile_call(name, call, args.top)
            del engine, call
            torch.cuda.empty_cache()
    sides = list(doc["sides"].values())
    print(f"R ÷ P+ {args.stage} wall time: {sides[1]['wall_ms'] / sides[0]['wall_ms']:.2f}", flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
