"""Rollout decode steps as CUDA graphs against eager steps, on one CUDA GPU: the same bits, and the time.

For each side of a GPU arm pair -- fused production (P+) and strict (R) -- at the arm's model (seeded
weights), two rollout engines: one eager, one capturing the decode steps (the arm's graph mode
FULL_DECODE_ONLY). Each runs two warm-up rollouts (kernels compile, vendor GEMMs are certified, SDPA
backends chosen; the graph engine captures in its second), then takes a weight update (every weight
moved by a seeded step, as a training step moves them: the graphs must read the new values in place)
and runs ``--reps`` timed rollouts of the same prompts and sampling seed. The eager and graph engines'
tokens and log-probs are compared byte for byte; the times are printed with eager ÷ graphs per side
and R ÷ P+ per mode. Usage (torch and Triton only; ``kernels/`` is registered as ``rlk_kernels``)::

    python benchmarks/gpu_decode_graphs.py [--arm gpu-consistency-w1] [--batch 1024] [--reps 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def run_side(cfg, impls, weights, moved, prompts, response, sizes, reps):
    """(wall seconds per timed rollout, tokens, logp) of one engine."""
    import torch
    from rlk_kernels.grpo import policy
    engine = policy.RolloutEngine(cfg, impls=impls, dtype=torch.bfloat16, device="cuda", production="fused",
                                  decode_graph_sizes=sizes, log=lambda line: print("   " + line, flush=True))
    engine.load_weights(weights)
    for seed in (1, 2):                                             # warm-up; the second captures
        engine.generate(prompts, response_len=response, generator=torch.Generator(device="cuda").manual_seed(seed))
    engine.load_weights(moved)
    times, first = [], None
    for _ in range(reps):
        torch.cuda.synchronize()
        started = time.perf_counter()
        out = engine.generate(prompts, response_len=response, generator=torch.Generator(device="cuda").manual_seed(7))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        first = first or out
    return times, first


def main(argv=None) -> int:
    from gpu_strict_kernels import add_rollout_arguments, arm_model
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_rollout_arguments(parser, "gpu-consistency-w1")
    parser.add_argument("--reps", type=int, default=5, help="timed rollouts per engine")
    args = parser.parse_args(argv)
    arm, cfg = arm_model(args.arm)
    import torch
    from rlk_kernels.grpo import policy
    from rlk_kernels.grpo.task import prompt_set
    doc = {"schema": "rlk-kit/bench-decode-graphs/v1", "device": torch.cuda.get_device_name(0), "arm": args.arm,
           "canonical_tp": cfg.canonical_tp, "batch": args.batch, "response": args.response, "reps": args.reps,
           "torch": torch.__version__, "sides": {}}
    sides = (("P+", policy.ALL_P), ("R", {"attention": "R", "ffn": "R", "logp": "R"}))
    with torch.no_grad(), torch.device("cuda"):
        weights = policy.init_policy_weights(cfg, 1234, "cuda")
        gen = torch.Generator(device="cuda").manual_seed(99)
        moved = {k: v + 1e-3 * torch.randn(v.shape, device="cuda", generator=gen) for k, v in weights.items()}
        prompts = prompt_set().cuda()
        prompts = prompts.repeat((args.batch + prompts.shape[0] - 1) // prompts.shape[0], 1)[:args.batch]
        for name, impls in sides:
            result = {}
            outs = {}
            for mode, sizes in (("eager", ()), ("graphs", (args.batch,))):
                print(f"== {name} {mode}", flush=True)
                times, outs[mode] = run_side(cfg, impls, weights, moved, prompts, args.response, sizes, args.reps)
                result[mode] = {"median_s": statistics.median(times), "times_s": [round(t, 5) for t in times]}
                torch.cuda.empty_cache()
            same = all(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
                       for a, b in zip(outs["eager"], outs["graphs"]))
            result["bytes_equal"] = same
            result["eager_over_graphs"] = result["eager"]["median_s"] / result["graphs"]["median_s"]
            doc["sides"][name] = result
            print(f"{name}: eager {result['eager']['median_s'] * 1e3:.1f} ms, graphs "
                  f"{result['graphs']['median_s'] * 1e3:.1f} ms per rollout (eager ÷ graphs "
                  f"{result['eager_over_graphs']:.2f}); tokens and log-probs byte-equal: {same}", flush=True)
    for mode in ("eager", "graphs"):
        ratio = doc["sides"]["R"][mode]["median_s"] / doc["sides"]["P+"][mode]["median_s"]
        doc[f"r_over_p_plus_{mode}"] = ratio
        print(f"R ÷ P+ rollout time, {mode}: {ratio:.2f}", flush=True)
    doc["passed"] = all(s["bytes_equal"] for s in doc["sides"].values())
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(doc, indent=2))
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
