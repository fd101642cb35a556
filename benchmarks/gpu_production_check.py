"""Self-check of fused production (P+) on one CUDA GPU at Qwen3-8B shapes: PASS/FAIL per check.

Each fused kernel of :mod:`rlk_kernels.gpu.production` against the eager production formula the
GRPO workload's P side ran before (both bf16; each also against an fp32 reference of the same bf16
inputs, so "close" means within production's own rounding), then the workload's passes:

1. ``rms_norm``, ``fused_add_rms_norm`` (the residual sum bitwise the eager bf16 add), ``silu_and_mul``,
   ``qk_norm_rope`` (prefill into a cache and one decode step into a longer one), ``logp_from_logits``
   (vocabulary 16 live of 152,576 and the whole width, temperature 1 and 0.7);
2. the SDPA backend choice per shape (each candidate against the math backend);
3. the 4-layer policy (hidden 4096, 32/8 heads of 128, FFN 12288, padded vocabulary 152,576, 16 live ids):
   the fused recompute against the eager one; a RolloutEngine generate, fused against eager, from one seed
   (the fused rollout's log-probs against the eager recompute of the same tokens: the distributions agree);
   prefill + decode over the fused KV cache against the fused full-sequence recompute;
4. a 2-step GRPO run of ``manifests/gpu-native.json`` (production fused) and of ``gpu-native-eager``:
   fused route lines, SDPA choices logged, finite rewards and losses, the P/P mismatch small.

Needs torch and Triton only; the repository need not be installed (``kernels/`` is registered as
``rlk_kernels``). Exits 1 when a check fails. Usage::

    PYTHONPATH=. python benchmarks/gpu_production_check.py [--skip-grpo]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULTS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str) -> None:
    RESULTS.append((name, bool(ok), detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)


def guarded(name: str, fn) -> None:
    try:
        fn()
    except Exception as exc:  # a crash is a failed check, the others still run
        import traceback
        traceback.print_exc()
        check(name, False, f"raised {type(exc).__name__}: {exc}")


def diffs(got, want, ref=None) -> tuple[float, float, str]:
    """(max |got - want|, max |want|, text) and, with ``ref`` (fp32), each one's max error against it."""
    d = float((got.float() - want.float()).abs().max())
    scale = float(want.float().abs().max())
    text = f"max|fused-eager| {d:.3g} (max|eager| {scale:.3g})"
    if ref is not None:
        text += (f"; vs fp32: fused {float((got.float() - ref).abs().max()):.3g}, "
                 f"eager {float((want.float() - ref).abs().max()):.3g}")
    return d, scale, text


BF16 = 2 ** -8        # half a bf16 ulp, relative


def within_bf16(got, want, ref, ulps: float = 4.0) -> tuple[bool, str]:
    """Fused and eager agree to a few bf16 roundings of the values, and the fused error against fp32 is no
    more than a few roundings beyond the eager one's."""
    d, scale, text = diffs(got, want, ref)
    err_f = float((got.float() - ref).abs().max())
    err_e = float((want.float() - ref).abs().max())
    return d <= ulps * 2 * BF16 * max(scale, 1e-6) and err_f <= err_e + ulps * BF16 * max(scale, 1e-6), text


# --- kernels ----------------------------------------------------------------------------------------

def kernel_checks(cfg):
    import torch
    import torch.nn.functional as F
    from rlk_kernels import ops
    from rlk_kernels.gpu import production as P
    from rlk_kernels.model import rope_table
    gen = torch.Generator(device="cuda").manual_seed(0)
    eps, h = cfg.norm_eps, cfg.hidden
    x = torch.randn(2048, h, device="cuda", generator=gen).bfloat16()
    r = torch.randn(2048, h, device="cuda", generator=gen).bfloat16()
    w = (1 + 0.1 * torch.randn(h, device="cuda", generator=gen)).bfloat16()

    def ref_norm(v):
        v = v.float()
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w.float()

    def rms():
        ok, text = within_bf16(P.rms_norm(x, w, eps), ops._production_rms_norm(x, w, eps), ref_norm(x))
        check("rms_norm [2048, 4096]", ok, text)
    guarded("rms_norm", rms)

    def add_rms():
        normed, summed = P.fused_add_rms_norm(x, r, w, eps)
        eager_sum = x + r
        ok, text = within_bf16(normed, ops._production_rms_norm(eager_sum, w, eps), ref_norm(eager_sum))
        same = torch.equal(summed, eager_sum)
        check("fused_add_rms_norm [2048, 4096]", ok and same, f"residual sum bitwise the bf16 add: {same}; {text}")
    guarded("fused_add_rms_norm", add_rms)

    def silu():
        gu = torch.randn(2048, 2 * cfg.ffn_hidden, device="cuda", generator=gen).bfloat16()
        g, u = gu.chunk(2, dim=-1)
        ok, text = within_bf16(P.silu_and_mul(gu), F.silu(g) * u, F.silu(g.float()) * u.float())
        check("silu_and_mul [2048, 2x12288]", ok, text)
    guarded("silu_and_mul", silu)

    cos, sin = (t.cuda().bfloat16() for t in rope_table(cfg))
    d, hq, hkv = cfg.head_dim, cfg.heads, cfg.query_groups
    qw = (1 + 0.1 * torch.randn(d, device="cuda", generator=gen)).bfloat16()
    kw = (1 + 0.1 * torch.randn(d, device="cuda", generator=gen)).bfloat16()

    def eager_heads(qkv, b, t, start, dtype):
        pos = torch.arange(start, start + t, device="cuda").unsqueeze(0).expand(b, -1)
        split = qkv.to(dtype).view(b, t, hq + 2 * hkv, d)
        q = ops._production_rms_norm(split[:, :, :hq], qw.to(dtype), eps).transpose(1, 2)
        k = ops._production_rms_norm(split[:, :, hq:hq + hkv], kw.to(dtype), eps).transpose(1, 2)
        rope = (cos.to(dtype), sin.to(dtype))
        return (ops._rope(q, pos.unsqueeze(1), rope), ops._rope(k, pos.unsqueeze(1), rope),
                split[:, :, hq + hkv:].transpose(1, 2))

    def qk(b, t, start, cap):
        qkv = torch.randn(b * t, (hq + 2 * hkv) * d, device="cuda", generator=gen).bfloat16()
        kc = torch.zeros(b, hkv, cap, d, device="cuda", dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        pos = torch.arange(start, start + t, device="cuda", dtype=torch.int32).repeat(b)
        q = P.qk_norm_rope(qkv, b, t, hq, hkv, d, qw, kw, cos, sin, pos, kc[:, :, :start + t], vc[:, :, :start + t], eps)
        eq, ek, ev = eager_heads(qkv, b, t, start, torch.bfloat16)
        rq, rk, _ = eager_heads(qkv, b, t, start, torch.float32)
        ok_q, tq = within_bf16(q, eq, rq, 8)
        ok_k, tk = within_bf16(kc[:, :, start:start + t], ek, rk, 8)
        ok_v = torch.equal(vc[:, :, start:start + t], ev)
        untouched = not kc[:, :, :start].any() and not kc[:, :, start + t:].any()
        check(f"qk_norm_rope b={b} t={t} start={start}", ok_q and ok_k and ok_v and untouched,
              f"q: {tq}; k: {tk}; v copied bitwise: {ok_v}; other cache rows untouched: {untouched}")
    guarded("qk_norm_rope prefill", lambda: qk(4, 256, 0, 300))
    guarded("qk_norm_rope decode", lambda: qk(64, 1, 27, 28))

    def logp(vocab, temperature):
        rows = 512
        logits = (torch.randn(rows, cfg.padded_vocab, device="cuda", generator=gen) * 3).bfloat16()
        targets = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
        got = P.logp_from_logits(logits, targets, vocab, temperature)
        full = logits.float() / temperature if temperature != 1.0 else logits.float()
        live = torch.arange(cfg.padded_vocab, device="cuda") < vocab
        want = torch.log_softmax(full.masked_fill(~live, float("-inf")), -1).gather(-1, targets[:, None])[:, 0]
        dd = float((got - want).abs().max())
        check(f"logp_from_logits vocab={vocab} T={temperature}", dd <= 1e-4 * max(1.0, float(want.abs().max())),
              f"max|fused-eager| {dd:.3g} (eager: fp32 logits, masked log-softmax; max|logp| {float(want.abs().max()):.3g})")
    for vocab in (cfg.vocab, cfg.padded_vocab):
        for temperature in (1.0, 0.7):
            guarded(f"logp vocab={vocab} T={temperature}", lambda v=vocab, t=temperature: logp(v, t))

    def backends():
        lines = []
        choice = P.BackendChoice(log=lines.append)
        shapes = [(4, 256, 256), (282, 27, 27), (1024, 1, 5), (1024, 1, 27), (1, 4096, 4096)]
        picked = []
        for b, t, kv in shapes:
            q = torch.randn(b, t, hq, d, device="cuda", generator=gen).bfloat16().transpose(1, 2)
            k = torch.randn(b, hkv, kv, d, device="cuda", generator=gen).bfloat16()
            v = torch.randn_like(k)
            name = choice.backend(q, k, v, t > 1)
            out = P.sdpa(q, k, v, t > 1, name)
            ref = P.sdpa(q, k, v, t > 1, "MATH")
            picked.append((b, t, kv, name, float((out.float() - ref.float()).abs().max())))
        for line in lines:
            print("      " + line)
        ok = all(err <= 2e-2 for *_, err in picked) and len(lines) == len(shapes)
        check("sdpa backend choice per shape", ok,
              "; ".join(f"({b},{t},{kv}) {n} max|d| vs math {e:.2g}" for b, t, kv, n, e in picked))
    guarded("sdpa backend choice", backends)


# --- the policy -------------------------------------------------------------------------------------

def policy_checks(cfg):
    import torch
    from rlk_kernels.gpu.production import BackendChoice
    from rlk_kernels.grpo import policy
    from rlk_kernels.grpo.task import PROMPT_LEN, prompt_set
    masters = policy.init_policy_weights(cfg, 1234, "cuda")
    w = policy.cast(masters, torch.bfloat16)
    del masters
    rope = policy.rope_for(cfg, torch.bfloat16, "cuda")
    P_ = policy.ALL_P
    response = 24
    prompts = prompt_set().cuda()[:64].repeat_interleave(4, 0)                # 256 sequences
    choice = BackendChoice()

    def recompute():
        gen = torch.Generator(device="cuda").manual_seed(5)
        tokens = torch.cat([prompts, torch.randint(0, cfg.vocab, (prompts.shape[0], response), device="cuda",
                                                   generator=gen)], 1)
        kw = dict(prompt_len=PROMPT_LEN, chunk=128, temperature=1.0)
        eager = policy.sequence_logprobs(w, cfg, rope, tokens, P_, **kw)
        got = policy.sequence_logprobs(w, cfg, rope, tokens, P_, production="fused", choice=choice, **kw)
        w32 = {k: v.float() for k, v in w.items()}
        ref = policy.sequence_logprobs(w32, cfg, policy.rope_for(cfg, torch.float32, "cuda"), tokens, P_, **kw)
        del w32
        d = (got - eager).abs()
        ef, ee = float((got - ref).abs().mean()), float((eager - ref).abs().mean())
        # two bf16 roundings of the same formula: bounded apart, and fused no further from fp32 than eager
        ok = float(d.max()) <= 0.1 and float(d.mean()) <= 0.02 and ef <= 2 * ee + 1e-3
        check("recompute fused vs eager (256 x 28 tokens, 4 layers)", ok,
              f"max|Δ logp| {float(d.max()):.3g}, mean {float(d.mean()):.3g}; mean |Δ| vs fp32: fused {ef:.3g}, eager {ee:.3g}")
    guarded("recompute", recompute)

    def rollout():
        outs = {}
        for production in ("eager", "fused"):
            lines = []
            engine = policy.RolloutEngine(cfg, impls=P_, dtype=torch.bfloat16, device="cuda", production=production,
                                          log=lines.append)
            engine.load_weights(w)
            gen = torch.Generator(device="cuda").manual_seed(7)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs[production] = engine.generate(prompts, response_len=response, generator=gen)
            torch.cuda.synchronize()
            print(f"      rollout {production}: {time.perf_counter() - t0:.3f} s (first call: includes compiles"
                  f"{' and backend timing' if lines else ''}); {len(lines)} sdpa choices logged")
            del engine
        (tok_e, lp_e), (tok_f, lp_f) = outs["eager"], outs["fused"]
        kw = dict(prompt_len=PROMPT_LEN, chunk=128, temperature=1.0)
        eager_on_fused = policy.sequence_logprobs(w, cfg, rope, tok_f, P_, **kw)
        fused_on_fused = policy.sequence_logprobs(w, cfg, rope, tok_f, P_, production="fused", choice=choice, **kw)
        same = float((tok_e == tok_f).float()[:, PROMPT_LEN:].mean())
        d = (lp_f - eager_on_fused).abs()
        c = (lp_f - fused_on_fused).abs()
        ok = float(d.max()) <= 0.1 and float(d.mean()) <= 0.01 and float(c.max()) <= 0.1
        check("rollout fused vs eager (256 x 24 tokens)", ok,
              f"fused rollout logp vs eager recompute of its tokens: max {float(d.max()):.3g}, mean {float(d.mean()):.3g}; "
              f"vs the fused recompute (P/P mismatch): max {float(c.max()):.3g}; same sampled tokens as the eager "
              f"rollout from one seed: {same:.1%}; mean logp fused {float(lp_f.mean()):.4f}, eager {float(lp_e.mean()):.4f}")
    guarded("rollout", rollout)


# --- GRPO -------------------------------------------------------------------------------------------

def grpo_checks(steps: int):
    import torch
    from rlk_kernels.grpo.config import GrpoConfig
    from rlk_kernels.grpo.run import FUSED_PRODUCTION_IDS, PRODUCTION_IDS, run_grpo
    for arm in ("gpu-native", "gpu-native-eager"):
        doc = json.loads((ROOT / "manifests" / f"{arm}.json").read_text())

        def one(doc=doc, arm=arm):
            lines = []
            t0 = time.perf_counter()
            done = run_grpo(GrpoConfig.from_arm(doc, device="cuda").with_rollouts(steps), emit=lines.append)
            wall = time.perf_counter() - t0
            records = [json_record(line) for line in lines if line.startswith("step ")]
            perf = [json_record(line) for line in lines if line.startswith("perf ") and "step_time" in line]
            rollouts = [json_record(line) for line in lines if line.startswith("rollout ")]
            routes = [line for line in lines if "[RL-Kernel][route]" in line]
            sdpa = [line for line in lines if "[RL-Kernel][sdpa]" in line]
            fused = doc.get("production") == "fused"
            want = set((FUSED_PRODUCTION_IDS if fused else PRODUCTION_IDS).values())
            finite = all(math.isfinite(r[k]) for r in records for k in ("train/loss", "train/grad_norm"))
            finite &= all(math.isfinite(r["rollout/raw_reward"]) for r in rollouts)
            max_diff = max(r["train/train_current_rollout_logprob_max_abs_diff"] for r in records)
            actual = {line.split("actual=")[1].split()[0] for line in routes}
            ok = (done == steps and finite and actual == want and len(routes) == 6 and (bool(sdpa) == fused)
                  and max_diff <= 0.1)
            check(f"grpo {arm} {steps} steps", ok,
                  f"{done} steps in {wall:.1f} s; step times {[round(p['perf/step_time'], 3) for p in perf]}; "
                  f"rollout+sync {[round(p['perf/train_wait_time'], 3) for p in perf]}; "
                  f"log-probs {[round(p['perf/log_probs_time'], 3) for p in perf]}; max |Δ logp| {max_diff:.3g}; "
                  f"rewards {[round(r['rollout/raw_reward'], 3) for r in rollouts]}; {len(sdpa)} sdpa choices; "
                  f"{next((line for line in lines if line.startswith('gpu production')), '')}")
        guarded(f"grpo {arm}", one)
        torch.cuda.empty_cache()


def json_record(line: str) -> dict:
    import ast
    return ast.literal_eval(line.split(": ", 1)[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-grpo", action="store_true", help="kernels and policy passes only")
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps per arm (default 2)")
    args = parser.parse_args(argv)
    from gpu_strict_kernels import _bootstrap      # kernels/ registered as rlk_kernels, as the benchmark does
    _bootstrap()
    import torch
    if not torch.cuda.is_available():
        print("FAIL  cuda: no CUDA device", flush=True)
        return 1
    from rlk_kernels.model import ModelConfig
    arm = json.loads((ROOT / "manifests" / "gpu-native.json").read_text())
    cfg = ModelConfig.from_arm_model(arm["model"])
    props = torch.cuda.get_device_properties(0)
    import triton
    print(f"device {props.name}; torch {torch.__version__} (CUDA {torch.version.cuda}); triton {triton.__version__}; "
          f"model {cfg.name}: hidden {cfg.hidden}, heads {cfg.heads}/{cfg.query_groups} x {cfg.head_dim}, "
          f"ffn {cfg.ffn_hidden}, padded vocab {cfg.padded_vocab}, live {cfg.vocab}, layers {cfg.layers}", flush=True)
    started = time.perf_counter()
    with torch.no_grad():
        kernel_checks(cfg)
        with torch.device("cuda"):                       # as the workload's driver runs (the eager KV cache)
            policy_checks(cfg)
    torch.cuda.empty_cache()
    if not args.skip_grpo:
        grpo_checks(args.steps)
    failed = [name for name, ok, _ in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed in {time.perf_counter() - started:.1f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
