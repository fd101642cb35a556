"""Strict (R) against production operators on one CUDA GPU at Qwen3-8B shapes.

One run writes one JSON document with:

1. invariance at the benchmark's sizes: GEMM / tree / logp rows against an 8192-row call, attention
   prefill of 7168 tokens against decode steps (batch 1 and 64), and a whole R decoder layer's
   prefill rows against decode steps on the prefill's KV cache;
2. throughput per module (attention, ffn, logp, layer = attention + FFN, layer+logp) in prefill (one
   sequence of 4096 / 8192 tokens: the training-side recompute) and decode (batch 1, 4, 8, 64 over
   2048 / 7168 cached tokens) of four implementations, each captured in a CUDA graph and timed in
   rotating order within each of ``--trials`` rounds: P (eager production: the history's column),
   P+ (the fair production baseline of ``fair_baseline.py``: fused RMSNorm, fused QK-norm+RoPE,
   fused SwiGLU, the fastest SDPA backend per shape), R (the strict kernels of ``rlk_kernels.gpu``)
   and RT (R with every GEMM on the strict Triton kernels: the certified cuBLAS path of
   ``rlk_kernels.gpu.vendor_gemm`` off; prefill only, decode never reaches it). Ratios are
   throughput ratios (= time of the denominator / time of R) per round, reported as the median with
   a 95 % bootstrap CI over rounds; GPU clocks are read before and after;
3. a torch-profiler breakdown of one R and one P+ layer (prefill 8192, decode batch 64 / 7168 KV);
4. the conformance oracle ``run_check(device="cuda", shape="qwen3-8b")`` in a fresh process with an
   empty Triton cache (the cold check), its time and fingerprint: speed and bits of the same build
   (it runs first, before this process holds any of the card's memory);
5. with ``--sweep``, the launch-configuration sweep of round 3; with ``--sections decode_gemm``, the
   strict GEMMs at decode row counts under candidate launches against cuBLAS.

Usage (the package need not be installed; ``kernels/`` is registered as ``rlk_kernels``)::

    python benchmarks/gpu_strict_kernels.py --out results.json [--skip-check] [--quick] [--sweep]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _bootstrap():
    try:
        import rlk_kernels  # noqa: F401
        return
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location("rlk_kernels", ROOT / "kernels" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "kernels")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["rlk_kernels"] = module
    spec.loader.exec_module(module)


def add_rollout_arguments(parser, arm: str):
    """The arguments the rollout benchmarks share (``gpu_decode_graphs.py``, ``gpu_rollout_profile.py``)."""
    parser.add_argument("--arm", default=arm, help="the arm whose model is built (manifests/ARM.json)")
    parser.add_argument("--batch", type=int, default=1024, help="sequences per rollout (the arm's 256 x 4)")
    parser.add_argument("--response", type=int, default=24, help="response tokens")
    parser.add_argument("--out", help="also write the result as JSON")


def arm_model(name: str):
    """(manifests/NAME.json's document, its model's ModelConfig), with ``kernels/`` registered as ``rlk_kernels``."""
    _bootstrap()
    from rlk_kernels.model import ModelConfig
    arm = json.loads((ROOT / "manifests" / f"{name}.json").read_text())
    return arm, ModelConfig.from_arm_model(arm["model"])


# --- the layer, R and P ------------------------------------------------------------------------------

class Layer:
    """One Qwen3-8B decoder layer's weights (bf16, seeded) in the layouts R and P read."""

    def __init__(self, cfg, seed=1):
        import torch
        from rlk_kernels.model import init_weights, layer_weights, rope_table
        small = type(cfg)(**{**cfg.to_json(), "layers": 1})
        w = init_weights(small, seed, layers=1, dtype=torch.bfloat16)
        lw = {k: v.cuda() for k, v in layer_weights(w, 0).items()}
        self.cfg = cfg
        c, d, h = cfg.canonical_tp, cfg.head_dim, cfg.hidden
        nq, nk = cfg.heads // c * d, cfg.query_groups // c * d
        self.w = lw
        # R: per-shard [S, N, K] storage, used as [S, K, N] views (K contiguous, as P's F.linear weights)
        qkv = torch.cat([lw["wq"].view(c, nq, h), lw["wk"].view(c, nk, h), lw["wv"].view(c, nk, h)], 1)
        self.r_qkv = qkv.contiguous().transpose(1, 2)
        per = cfg.ffn_hidden // c
        gu = torch.cat([lw["w_gate"].view(c, per, h), lw["w_up"].view(c, per, h)], 1)
        self.r_gu = gu.contiguous().transpose(1, 2)
        self.r_o = lw["wo"].view(h, c, nq).permute(1, 2, 0)                    # [S, K/S, H] view
        self.r_down = lw["w_down"].view(h, c, per).permute(1, 2, 0)
        # P: whole matrices, heads in the same global order
        self.p_qkv = torch.cat([lw["wq"], lw["wk"], lw["wv"]], 0)
        self.p_gu = torch.cat([lw["w_gate"], lw["w_up"]], 0)
        self.final_norm = w["final_norm"].cuda()
        self.lm = w["lm_head"].cuda()
        from rlk_kernels.ops import logp_slices
        slices = logp_slices(cfg)
        self.r_lm = self.lm.view(slices, cfg.padded_vocab // slices, h).transpose(1, 2)
        cos, sin = rope_table(cfg, 8192 + 64)
        self.cos, self.sin = cos.cuda().to(torch.bfloat16), sin.cuda().to(torch.bfloat16)
        self.nq, self.nk, self.per = nq, nk, per


def _rope(x, pos, layer):
    import torch
    c, s = layer.cos[pos], layer.sin[pos]                      # [B, L, D/2]
    c, s = c.unsqueeze(1), s.unsqueeze(1)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _p_norm(x, w, eps):
    import torch
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def attention(impl, L, x, pos, kcache, vcache, normed=None, residual=None):
    """x [B, T, H] at positions pos [B, T]; writes K/V at pos into the caches [B, Hkv, cap, D];
    attends keys 0..pos. Returns [B, T, H] (bf16). ``impl``: "R" strict (q/k norm, RoPE, scale and
    head split in one strict kernel), "R0" strict with that glue as eager ops (round 3; the same
    bits), "P" eager production,
    "P+" the fair production baseline (``normed``: P+ only, the input already normed by a fused
    residual-add norm). ``residual`` (R, R0): returns ``residual + attention`` with the residual
    add in the shard tree's kernel (the bits of the eager add)."""
    import torch
    import torch.nn.functional as F
    from rlk_kernels.gpu import triton_attention, triton_gemm, triton_pointwise
    cfg = L.cfg
    b, t, h = x.shape
    c, d = cfg.canonical_tp, cfg.head_dim
    rows = x.reshape(b * t, h)
    if impl == "P+":
        return _attention_plus(L, x, pos, kcache, vcache, normed=normed)
    if impl in ("R", "R0"):
        n = triton_pointwise.rms_norm(rows, L.w["input_norm"], cfg.norm_eps)
        out = triton_gemm.shard_matmul(n, L.r_qkv)                             # [S, M, nq+2nk]
    if impl == "R":
        q, k, v = triton_pointwise.qkv_glue(out, L.w["q_norm"], L.w["k_norm"], cfg.norm_eps, L.cos, L.sin, pos,
                                            heads=cfg.heads, groups=cfg.query_groups, scale=d ** -0.5)
    elif impl == "R0":
        q = out[..., :L.nq].reshape(c, b * t, -1, d).permute(1, 0, 2, 3).reshape(b, t, cfg.heads, d)
        k = out[..., L.nq:L.nq + L.nk].reshape(c, b * t, -1, d).permute(1, 0, 2, 3).reshape(b, t, cfg.query_groups, d)
        v = out[..., L.nq + L.nk:].reshape(c, b * t, -1, d).permute(1, 0, 2, 3).reshape(b, t, cfg.query_groups, d)
        q = triton_pointwise.rms_norm(q, L.w["q_norm"], cfg.norm_eps)
        k = triton_pointwise.rms_norm(k, L.w["k_norm"], cfg.norm_eps)
    else:
        qkv = F.linear(_p_norm(rows, L.w["input_norm"], cfg.norm_eps), L.p_qkv)
        q = qkv[:, :cfg.heads * d].view(b, t, cfg.heads, d)
        k = qkv[:, cfg.heads * d:(cfg.heads + cfg.query_groups) * d].view(b, t, cfg.query_groups, d)
        v = qkv[:, (cfg.heads + cfg.query_groups) * d:].view(b, t, cfg.query_groups, d)
        q = _p_norm(q, L.w["q_norm"], cfg.norm_eps)
        k = _p_norm(k, L.w["k_norm"], cfg.norm_eps)
    if impl != "R":
        q = _rope(q.transpose(1, 2), pos, L)
        k = _rope(k.transpose(1, 2), pos, L)
        v = v.transpose(1, 2)
    if impl == "R0":
        q = q * (d ** -0.5)
    if t == kcache.shape[2]:                                   # prefill from position 0: the cache is this
        kc, vc = k, v
    else:
        start = kcache.shape[2] - t                           # decode appends at the cache's end
        kcache[:, :, start:] = k
        vcache[:, :, start:] = v
        kc, vc = kcache, vcache
    if impl in ("R", "R0"):
        core = triton_attention.attention(q, kc, vc, pos)
        attn = core.transpose(1, 2).reshape(b * t, c, L.nq).transpose(0, 1)    # [S, M, K/S] view
        if residual is not None:
            return triton_gemm.shard_matmul_tree(attn, L.r_o, residual=residual.reshape(b * t, h)).view(b, t, h)
        o = triton_gemm.shard_matmul_tree(attn, L.r_o).to(torch.bfloat16)
    else:
        causal = t > 1
        core = F.scaled_dot_product_attention(q, kc, vc, is_causal=causal, enable_gqa=True)
        o = F.linear(core.transpose(1, 2).reshape(b * t, -1), L.w["wo"])
    return o.view(b, t, h)


def _attention_plus(L, x, pos, kcache, vcache, normed=None):
    import torch.nn.functional as F
    import fair_baseline as fb
    cfg = L.cfg
    b, t, h = x.shape
    n = normed if normed is not None else fb.rms_norm(x.reshape(b * t, h), L.w["input_norm"], cfg.norm_eps)
    qkv = F.linear(n.reshape(b * t, h), L.p_qkv)
    q = fb.qk_norm_rope(qkv, b, t, cfg.heads, cfg.query_groups, cfg.head_dim, L.w["q_norm"], L.w["k_norm"],
                        L.cos, L.sin, pos, kcache, vcache, cfg.norm_eps)
    backend = BACKEND_CHOICE.get((b, t, kcache.shape[2]), "FLASH_ATTENTION")
    core = fb.sdpa(q, kcache, vcache, t > 1, backend)             # [B, Hq, T, D]
    return F.linear(core.transpose(1, 2).reshape(b * t, -1), L.w["wo"]).view(b, t, h)


BACKEND_CHOICE: dict = {}        # (batch, tokens, cache length) -> the fastest SDPA backend measured


def ffn(impl, L, x, normed=None, residual=None):
    import torch
    import torch.nn.functional as F
    from rlk_kernels.gpu import triton_gemm, triton_pointwise
    cfg = L.cfg
    shape = x.shape
    rows = x.reshape(-1, cfg.hidden)
    if impl == "P+":
        import fair_baseline as fb
        n = normed if normed is not None else fb.rms_norm(rows, L.w["post_norm"], cfg.norm_eps)
        return F.linear(fb.silu_and_mul(F.linear(n, L.p_gu)), L.w["w_down"]).view(shape)
    if impl in ("R", "R0"):
        n = triton_pointwise.rms_norm(rows, L.w["post_norm"], cfg.norm_eps)
        act = triton_gemm.shard_swiglu(n, L.r_gu, L.per)
        if residual is not None:                 # residual + FFN, the add in the shard tree's kernel
            return triton_gemm.shard_matmul_tree(act, L.r_down, residual=residual.reshape(-1, cfg.hidden)).view(shape)
        out = triton_gemm.shard_matmul_tree(act, L.r_down).to(torch.bfloat16)
    else:
        gu = F.linear(_p_norm(rows, L.w["post_norm"], cfg.norm_eps), L.p_gu)
        g, u = gu.chunk(2, dim=-1)
        out = F.linear(F.silu(g) * u, L.w["w_down"])
    return out.view(shape)


def logp(impl, L, x, targets):
    import torch
    import torch.nn.functional as F
    from rlk_kernels.gpu import triton_logp, triton_pointwise
    cfg = L.cfg
    rows = x.reshape(-1, cfg.hidden)
    if impl == "P+":
        import fair_baseline as fb
        return fb.logp_from_logits(F.linear(fb.rms_norm(rows, L.final_norm, cfg.norm_eps), L.lm), targets, cfg.vocab)
    if impl in ("R", "R0"):
        n = triton_pointwise.rms_norm(rows, L.final_norm, cfg.norm_eps)
        return triton_logp.logp(n, L.r_lm, targets, vocab=cfg.vocab)
    logits = F.linear(_p_norm(rows, L.final_norm, cfg.norm_eps), L.lm)[:, :cfg.vocab].float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)


def layer(impl, L, x, pos, kcache, vcache):
    if impl == "P+":             # residual adds fused into the next norm, as vLLM's fused_add_rms_norm
        import fair_baseline as fb
        a = attention("P+", L, x, pos, kcache, vcache)
        n, h = fb.fused_add_rms_norm(a, x, L.w["post_norm"], L.cfg.norm_eps)
        return h + ffn("P+", L, h, normed=n)
    if impl in ("R", "R0"):       # the residual adds in the shard trees' kernels (the same bits)
        h = attention(impl, L, x, pos, kcache, vcache, residual=x)
        return ffn(impl, L, h, residual=h)
    h = x + attention(impl, L, x, pos, kcache, vcache)
    return h + ffn(impl, L, h)


# --- timing ------------------------------------------------------------------------------------------

def _graph(fn):
    import torch
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _time(run, reps):
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    run()
    start.record()
    for _ in range(reps):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3                  # microseconds


def side_by_side(fn_r, fn_p, reps, trials=5):
    runs = {}
    for name, fn in (("R", fn_r), ("P", fn_p)):
        try:
            runs[name] = _graph(fn)
        except Exception as exc:                                 # eager fallback, recorded
            print(f"  graph capture failed for {name}: {exc!r}; timing eagerly")
            runs[name] = fn
    times = {"R": [], "P": []}
    for _ in range(trials):                                      # alternate R and P
        for name in ("R", "P"):
            times[name].append(_time(runs[name], reps))
    r, p = statistics.median(times["R"]), statistics.median(times["P"])
    return {"r_us": round(r, 2), "p_us": round(p, 2), "ratio": round(p / r, 3)}


# --- invariance at the benchmark's sizes -----------------------------------------------------------

def _same(a, b) -> bool:
    import torch
    return bool(torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))


def invariance_at_scale(L):
    import torch
    from rlk_kernels.gpu import triton_attention, triton_gemm, triton_logp
    cfg = L.cfg
    gen = torch.Generator(device="cuda").manual_seed(7)
    results = {}
    x = torch.randn(8192, cfg.hidden, device="cuda", generator=gen).to(torch.bfloat16)
    targets = torch.randint(0, cfg.vocab, (8192,), device="cuda", generator=gen)
    full_col = triton_gemm.shard_matmul(x, L.r_gu)
    c = cfg.canonical_tp
    act = torch.randn(c, 8192, L.per, device="cuda", generator=gen).to(torch.bfloat16)
    full_tree = triton_gemm.shard_matmul_tree(act, L.r_down)
    full_logp = triton_logp.logp(x, L.r_lm, targets, vocab=cfg.vocab)
    ok = {"gemm_columns": True, "gemm_tree": True, "logp": True}
    for rows in (1, 3, 17, 64, 65, 128, 129, 200, 256, 257, 1000, 4096):
        ok["gemm_columns"] &= _same(triton_gemm.shard_matmul(x[:rows], L.r_gu), full_col[:, :rows])
        ok["gemm_tree"] &= _same(triton_gemm.shard_matmul_tree(act[:, :rows], L.r_down), full_tree[:rows])
        ok["logp"] &= _same(triton_logp.logp(x[:rows], L.r_lm, targets[:rows], vocab=cfg.vocab), full_logp[:rows])
    slices = L.r_lm.shape[0]
    ok["logp_tp_ranks"] = all(
        _same(triton_logp.logp(x[:300], L.r_lm, targets[:300], vocab=cfg.vocab,
                               ranks=[range(r * slices // tp, (r + 1) * slices // tp) for r in range(tp)]), full_logp[:300])
        for tp in (2, 4, 8) if tp <= c)
    # the FFN module (fused gate/up + SwiGLU above 256 rows, stored gate/up + SwiGLU kernel below)
    full_ffn = ffn("R", L, x)
    ok["ffn_module"] = all(_same(ffn("R", L, x[:rows]), full_ffn[:rows]) for rows in (1, 8, 64, 256, 257, 4096))
    results["rows_1_to_4096_vs_8192"] = ok
    # attention: prefill of 7168 tokens vs decode steps (batch 1 and 64) over the same keys
    length = 7168
    q = (torch.randn(64, cfg.heads, 1, cfg.head_dim, device="cuda", generator=gen) * 0.1).to(torch.bfloat16)
    kv = torch.randn(2, 64, cfg.query_groups, length, cfg.head_dim, device="cuda", generator=gen).to(torch.bfloat16)
    qs = torch.randn(1, cfg.heads, length, cfg.head_dim, device="cuda", generator=gen).to(torch.bfloat16) * 0.1
    pos_all = torch.arange(length, device="cuda").view(1, -1)
    pre = triton_attention.attention(qs, kv[0, :1], kv[1, :1], pos_all)
    att_ok = True
    for p in (0, 255, 256, 2047, 4095, 7167):
        one = triton_attention.attention(qs[:, :, p:p + 1], kv[0, :1, :, :p + 1], kv[1, :1, :, :p + 1], pos_all[:, p:p + 1])
        att_ok &= _same(one[:, :, 0], pre[:, :, p])
        batch_q = q.clone()
        batch_q[0] = qs[0, :, p:p + 1]
        many = triton_attention.attention(batch_q, kv[0], kv[1], torch.full((64, 1), p, device="cuda"))
        kv0 = kv[:, :1].clone()
        many_ref = triton_attention.attention(qs[:, :, p:p + 1], kv0[0], kv0[1], torch.full((1, 1), p, device="cuda"))
        att_ok &= _same(many[0], many_ref[0]) and _same(many_ref[:, :, 0], pre[:, :, p])
    results["attention_prefill_7168_vs_decode_batch_1_64"] = att_ok
    # whole R layer: prefill rows vs decode steps on the prefill's cache (batch 1, and batch 8 replicas)
    xs = torch.randn(1, length, cfg.hidden, device="cuda", generator=gen).to(torch.bfloat16)
    kc = torch.zeros(1, cfg.query_groups, length, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    pre_out = layer("R", L, xs, pos_all, kc, vc)
    # the prefill's K/V, rebuilt into a cache (same kernels, same rows)
    layer_ok = True
    for p in (2048, 7167):
        kc2 = torch.zeros(8, cfg.query_groups, p + 1, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
        vc2 = torch.zeros_like(kc2)
        prefix = layer_prefix_cache(L, xs[:, :p])
        kc2[:, :, :p] = prefix[0]
        vc2[:, :, :p] = prefix[1]
        step = layer("R", L, xs[:, p:p + 1].expand(8, 1, -1).contiguous(), torch.full((8, 1), p, device="cuda"), kc2, vc2)
        layer_ok &= all(_same(step[i, 0], pre_out[0, p]) for i in range(8))
    results["decoder_layer_prefill_7168_vs_decode_batch_8"] = layer_ok
    # the fused strict glue (q/k norm + RoPE + scale + head split, one program per token) against the
    # eager ops: their norms sum squares in another order, so the layers may differ by roundings
    kc3 = torch.zeros(8, cfg.query_groups, 2049, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    step_x = xs[:, 2048:2049].expand(8, 1, -1).contiguous()
    step_pos = torch.full((8, 1), 2048, device="cuda")
    glue_r, glue_r0 = layer("R", L, xs, pos_all, kc, vc), layer("R0", L, xs, pos_all, kc, vc)
    results["fused_glue_vs_eager_glue"] = {
        "prefill_bytes_equal": _same(glue_r, glue_r0),
        "prefill_max_abs_diff": float((glue_r.float() - glue_r0.float()).abs().max()),
        "decode_bytes_equal": _same(layer("R", L, step_x, step_pos, kc3, kc3.clone()),
                                    layer("R0", L, step_x, step_pos, kc3, kc3.clone()))}
    # the residual adds fused into the shard trees against the eager adds (prefill and decode rows)
    def unfused(xx, pp, kk, vv):
        hh = xx + attention("R", L, xx, pp, kk, vv)
        return hh + ffn("R", L, hh)
    results["fused_residual_equals_eager_residual"] = (
        _same(layer("R", L, xs[:, :4096], pos_all[:, :4096], kc[:, :, :4096], vc[:, :, :4096]),
              unfused(xs[:, :4096], pos_all[:, :4096], kc[:, :, :4096], vc[:, :, :4096]))
        and _same(layer("R", L, step_x, step_pos, kc3, kc3.clone()), unfused(step_x, step_pos, kc3, kc3.clone())))
    # the certified cuBLAS GEMMs against the strict Triton GEMMs: a whole layer, byte for byte
    results["vendor_gemm_layer_equals_triton_gemm_layer"] = all(
        _same(layer("R", L, xs[:, :n], pos_all[:, :n], kc[:, :, :n], vc[:, :, :n]),
              _vendor_off(lambda i: layer(i, L, xs[:, :n], pos_all[:, :n], kc[:, :, :n], vc[:, :, :n])))
        for n in (300, 4096, 7168))
    return results


def layer_prefix_cache(L, xs):
    """K/V of the prefix ``xs`` [1, p, H] as R's prefill computes them."""
    import torch
    p = xs.shape[1]
    kc = torch.zeros(1, L.cfg.query_groups, p, L.cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    captured = {}
    from rlk_kernels.gpu import triton_attention
    original = triton_attention.attention

    def spy(q, k, v, q_pos, **kw):
        captured["k"], captured["v"] = k, v
        return original(q, k, v, q_pos, **kw)

    triton_attention.attention = spy
    try:
        attention("R", L, xs, torch.arange(p, device="cuda").view(1, -1), kc, vc)
    finally:
        triton_attention.attention = original
    return captured["k"], captured["v"]


# --- launch-configuration sweep ----------------------------------------------------------------------

# prefill: (BLOCK_M, warps, stages, unmasked interior blocks, heavy tiles first, tensor-descriptor
# loads) -- all bit-neutral; the first is round 2's schedule, the fourth today's default
PREFILL_VARIANTS = ((128, 8, 3, False, False, False), (128, 8, 3, True, False, False),
                    (128, 8, 3, False, True, False), (128, 8, 3, True, True, False),
                    (128, 8, 3, True, True, True), (128, 8, 2, True, True, False), (64, 4, 3, True, True, False))
PREFILL_LENGTHS = (4096, 8192)
# decode over one split (a GRPO rollout's cache holds tens of keys), with the merge kernel or without
ONE_SPLIT_CACHES = (48, 512)
# decode: rows per program of the split merge (64: round 2's, the split kernel's tile) -- bit-neutral
DECODE_VARIANTS = (64, 16, 4)
# decode: programs sharing one split's value columns (DV_PARTS) -- bit-neutral
DV_PARTS_VARIANTS = (1, 2, 4, 8)
# other canonical splits: these change the strict bits (a different canonical schedule); timed to
# show what the split size costs and buys (16384: one split, the schedule's upper bound)
SPLIT_VARIANTS = (256, 512, 16384)


def _registers(ta) -> dict:
    """Registers and spills of the attention kernel compiled last (what a launch change costs)."""
    kernel = getattr(ta, "LAST_KERNEL", None)
    return {"registers": getattr(kernel, "n_regs", None), "spills": getattr(kernel, "n_spills", None)}


def _decode_row(res, section, row, step, base, same_key, checks, **schedule):
    """One decode schedule over ``step`` (q, k cache, v cache, positions): its bytes against ``base``,
    any further ``checks`` (name -> callable), its time against SDPA; recorded under ``section``."""
    import torch.nn.functional as F
    from rlk_kernels.gpu import triton_attention as ta
    q, kc, vc, _ = step
    try:
        row[same_key] = _same(ta.attention(*step, **schedule), base)
        row.update({name: check() for name, check in checks.items()})
        row.update(side_by_side(lambda: ta.attention(*step, **schedule),
                                lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True), 20))
    except Exception as exc:
        row["error"] = repr(exc)[:300]
    res[section].append(row)
    print("sweep " + section.replace("_", " "), row, flush=True)


def sweep(L, split_sizes=True):
    """Core attention (prefill 4096 and 8192 tokens, with each kernel's registers and spills; decode
    batch 1 / 8 / 64 over 2048 / 7168 cached keys; decode over one split, batch 1 / 64 / 1024 over 48 /
    512 keys) under several schedules, each timed against the same P and checked
    byte for byte against the defaults (attention: decode steps against the prefill rows)."""
    import torch
    import torch.nn.functional as F
    from rlk_kernels.gpu import triton_attention as ta
    from rlk_kernels.gpu import triton_logp
    cfg = L.cfg
    d = cfg.head_dim
    gen = torch.Generator(device="cuda").manual_seed(13)
    res = {"defaults": {"prefill": list(ta.PREFILL), "fast": ta.FAST, "heavy_first": ta.HEAVY_FIRST,
                        "decode": list(ta.DECODE), "combine_rows": ta.COMBINE_ROWS, "tma": ta.TMA, "split": ta.SPLIT,
                        "dv_parts": ta.DV_PARTS, "dv_few_programs": ta.DV_FEW_PROGRAMS, "one_split": ta.ONE_SPLIT,
                        "logp_summary": list(triton_logp.SUMMARY), "merge_chunk": triton_logp.MERGE_CHUNK},
           "prefill_attention": [], "decode_attention": [], "decode_value_parts": [], "decode_one_split": [],
           "split_size": []}
    for length in PREFILL_LENGTHS:              # the last length's inputs stay for the cases below
        qs = (torch.randn(1, cfg.heads, length, d, device="cuda", generator=gen) * 0.1).to(torch.bfloat16)
        ks = torch.randn(1, cfg.query_groups, length, d, device="cuda", generator=gen).to(torch.bfloat16)
        vs = torch.randn(1, cfg.query_groups, length, d, device="cuda", generator=gen).to(torch.bfloat16)
        pos = torch.arange(length, device="cuda").view(1, -1)
        ref = ta.attention(qs, ks, vs, pos)
        probes = tuple(p for p in (0, 255, 256, 1000, 4095, 8191) if p < length)

        def decode_equal(pre_out, **kw):
            return all(_same(ta.attention(qs[:, :, p:p + 1], ks[:, :, :p + 1], vs[:, :, :p + 1], pos[:, p:p + 1],
                                          **kw)[:, :, 0], pre_out[:, :, p]) for p in probes)

        def sdpa_prefill():
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)

        for pre in PREFILL_VARIANTS:
            kw = dict(prefill=pre[:3], fast=pre[3], heavy_first=pre[4], tma=pre[5])
            row = {"tokens": length, "config": list(pre)}
            try:
                out = ta.attention(qs, ks, vs, pos, **kw)
                row.update(same_as_default=_same(out, ref), decode_equal=decode_equal(out))
                row.update(side_by_side(lambda: ta.attention(qs, ks, vs, pos, **kw), sdpa_prefill, 5))
                row.update(_registers(ta))
            except Exception as exc:
                row["error"] = repr(exc)[:300]
            res["prefill_attention"].append(row)
            print("sweep prefill attention", row, flush=True)
    cases = {}
    for ctx in (2048, 7168):
        for batch in (1, 8, 64):
            q = (torch.randn(batch, cfg.heads, 1, d, device="cuda", generator=gen) * 0.1).to(torch.bfloat16)
            kc = torch.randn(batch, cfg.query_groups, ctx + 1, d, device="cuda", generator=gen).to(torch.bfloat16)
            cases[ctx, batch] = (q, kc, torch.randn_like(kc), torch.full((batch, 1), ctx, device="cuda"))
    for (ctx, batch), (q, kc, vc, qpos) in cases.items():
        base = ta.attention(q, kc, vc, qpos, combine_rows=64)
        for rows in DECODE_VARIANTS:
            equal = {"decode_equal": lambda: decode_equal(ref, combine_rows=rows)} if (batch, ctx) == (8, 2048) else {}
            _decode_row(res, "decode_attention", {"batch": batch, "kv_cache": ctx, "combine_rows": rows},
                        (q, kc, vc, qpos), base, "same_as_64_rows", equal, combine_rows=rows)
        for parts in DV_PARTS_VARIANTS:
            _decode_row(res, "decode_value_parts", {"batch": batch, "kv_cache": ctx, "dv_parts": parts},
                        (q, kc, vc, qpos), base, "same_as_one_part", {}, dv_parts=parts)
    for ctx in ONE_SPLIT_CACHES:              # one split: the split kernel writes the output itself
        for batch in (1, 64, 1024):
            q = (torch.randn(batch, cfg.heads, 1, d, device="cuda", generator=gen) * 0.1).to(torch.bfloat16)
            kc = torch.randn(batch, cfg.query_groups, ctx, d, device="cuda", generator=gen).to(torch.bfloat16)
            step = (q, kc, torch.randn_like(kc), torch.full((batch, 1), ctx - 1, device="cuda"))
            merged = ta.attention(*step, one_split=False)
            for one in (False, True):
                _decode_row(res, "decode_one_split", {"batch": batch, "kv_cache": ctx, "one_split": one},
                            step, merged, "same_as_merge_kernel", {}, one_split=one)
    default_split = ta.SPLIT
    for split in SPLIT_VARIANTS if split_sizes else ():
        ta.SPLIT = split
        try:
            out = ta.attention(qs, ks, vs, pos)
            row = {"split": split, "phase": "prefill", "tokens": length, "decode_equal": decode_equal(out)}
            row.update(side_by_side(lambda: ta.attention(qs, ks, vs, pos), sdpa_prefill, 5))
            res["split_size"].append(row)
            print("sweep split", row, flush=True)
            if split < length:
                for (ctx, batch), (q, kc, vc, qpos) in cases.items():
                    row = {"split": split, "phase": "decode", "batch": batch, "kv_cache": ctx}
                    row.update(side_by_side(lambda: ta.attention(q, kc, vc, qpos),
                                            lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True), 20))
                    res["split_size"].append(row)
                    print("sweep split", row, flush=True)
        except Exception as exc:
            res["split_size"].append({"split": split, "error": repr(exc)[:300]})
        finally:
            ta.SPLIT = default_split
    return res


# --- throughput --------------------------------------------------------------------------------------

def _module_calls(L, x, pos, kc, vc, targets) -> dict:
    """Each measured module as ``impl -> output`` on the same inputs ("RT": R with every GEMM on
    the strict Triton kernels, the certified cuBLAS path off -- the previous round's R)."""
    calls = {
        "attention": lambda i: attention(i, L, x, pos, kc, vc),
        "ffn": lambda i: ffn(i, L, x),
        "logp": lambda i: logp(i, L, x, targets),
        "layer": lambda i: layer(i, L, x, pos, kc, vc),
        "layer+logp": lambda i: logp(i, L, layer(i, L, x, pos, kc, vc), targets),
    }
    return {name: (lambda fn: lambda i: _vendor_off(fn) if i == "RT" else fn(i))(fn) for name, fn in calls.items()}


def _vendor_off(fn):
    import os
    before = os.environ.get("RLK_VENDOR_GEMM")
    os.environ["RLK_VENDOR_GEMM"] = "0"
    try:
        return fn("R")
    finally:
        if before is None:
            del os.environ["RLK_VENDOR_GEMM"]
        else:
            os.environ["RLK_VENDOR_GEMM"] = before


IMPLS = ("P", "P+", "R", "RT")   # eager production, fair production, strict, strict on Triton GEMMs only


def bootstrap_ci(values, n=2000, seed=0):
    """(median, 2.5th, 97.5th percentile of the bootstrap medians) of ``values``."""
    import random
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return statistics.median(values), meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def measure(fns, impls, reps, trials):
    """Each impl captured in a CUDA graph, then ``trials`` rounds timing every impl in turn (order
    rotated per round); per-round times give paired ratios, summarised by a bootstrap CI."""
    runs = {}
    for impl in impls:
        call = (lambda i: lambda: fns(i))(impl)
        try:
            runs[impl] = _graph(call)
        except Exception as exc:                                 # eager fallback, recorded
            print(f"  graph capture failed for {impl}: {exc!r}; timing eagerly")
            runs[impl] = call
    times = {impl: [] for impl in impls}
    for t in range(trials):
        order = impls[t % len(impls):] + impls[:t % len(impls)]
        for impl in order:
            times[impl].append(_time(runs[impl], reps))
    res = {f"{impl}_us": round(statistics.median(v), 2) for impl, v in times.items()}
    res["trials_us"] = {impl: [round(x, 2) for x in v] for impl, v in times.items()}
    for num, den in (("R", "P+"), ("R", "P"), ("P+", "P"), ("R0", "P+"), ("R", "R0"), ("RT", "P+"), ("R", "RT")):
        if num in times and den in times:
            ratios = [d / n for n, d in zip(times[num], times[den])]     # throughput num / den
            med, lo, hi = bootstrap_ci(ratios)
            res[f"{num}/{den}"] = [round(med, 3), round(lo, 3), round(hi, 3)]
    return res


def _pick_backends(L, batch, tokens, cap):
    import torch
    import fair_baseline as fb
    cfg = L.cfg
    q = torch.randn(batch, tokens, cfg.heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(batch, cfg.query_groups, cap, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    best, seen = fb.pick_backend(q, k, v, tokens > 1, lambda fn: _time(fn, 10))
    BACKEND_CHOICE[(batch, tokens, cap)] = best
    return {"batch": batch, "tokens": tokens, "kv": cap, "chosen": best, "times_us": seen}


def gpu_clocks():
    fields = "clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active"
    try:
        line = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:
        return {"error": repr(exc)}
    return dict(zip(fields.split(","), (v.strip() for v in line.split(","))))


def throughput(L, quick=False, trials=7):
    import torch
    cfg = L.cfg
    gen = torch.Generator(device="cuda").manual_seed(11)
    rows, backends = [], []
    clocks = {"before": gpu_clocks()}
    prefill = (4096,) if quick else (4096, 8192)
    for tokens in prefill:
        x = torch.randn(1, tokens, cfg.hidden, device="cuda", generator=gen).to(torch.bfloat16)
        pos = torch.arange(tokens, device="cuda").view(1, -1)
        targets = torch.randint(0, cfg.vocab, (tokens,), device="cuda", generator=gen)
        kc = torch.empty(1, cfg.query_groups, tokens, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
        vc = torch.empty_like(kc)
        backends.append(_pick_backends(L, 1, tokens, tokens))
        for module, fns in _module_calls(L, x, pos, kc, vc, targets).items():
            impls = IMPLS if module != "logp" else IMPLS[:3]
            res = measure(fns, impls, 3, trials)
            rows.append({"phase": "prefill", "tokens": tokens, "batch": 1, "module": module, **res})
            _print_row(rows[-1])
            torch.cuda.empty_cache()
    for ctx in ((2048,) if quick else (2048, 7168)):
        for batch in (1, 4, 8, 64):
            x = torch.randn(batch, 1, cfg.hidden, device="cuda", generator=gen).to(torch.bfloat16)
            pos = torch.full((batch, 1), ctx, device="cuda")
            targets = torch.randint(0, cfg.vocab, (batch,), device="cuda", generator=gen)
            kc = torch.randn(batch, cfg.query_groups, ctx + 1, cfg.head_dim, device="cuda", generator=gen).to(torch.bfloat16)
            vc = torch.randn_like(kc)
            backends.append(_pick_backends(L, batch, 1, ctx + 1))
            for module, fns in _module_calls(L, x, pos, kc, vc, targets).items():
                if module == "layer+logp":
                    continue
                res = measure(fns, IMPLS[:3], 30, trials)
                rows.append({"phase": "decode", "batch": batch, "kv_cache": ctx, "module": module, **res})
                _print_row(rows[-1])
            torch.cuda.empty_cache()
    clocks["after"] = gpu_clocks()
    return {"rows": rows, "attention_backends": backends, "clocks": clocks, "trials": trials}


def _print_row(r):
    shape = f"{r['tokens']} tok" if r["phase"] == "prefill" else f"b{r['batch']} kv{r['kv_cache']}"
    ci = r["R/P+"]
    print(f"{r['phase']:<7} {shape:<12} {r['module']:<10} P {r['P_us']:>8.1f}  P+ {r['P+_us']:>8.1f}  "
          f"R {r['R_us']:>8.1f}  R/P+ {ci[0]:.3f} [{ci[1]:.3f}, {ci[2]:.3f}]  R/P {r['R/P'][0]:.3f}"
          + (f"  RT/P+ {r['RT/P+'][0]:.3f}  R/RT {r['R/RT'][0]:.3f}" if "RT/P+" in r else ""), flush=True)


PROFILE_CASES = {"prefill_4096": (1, 4096, 4096), "decode_b1_kv2048": (1, 1, 2049), "decode_b8_kv2048": (8, 1, 2049),
                 "prefill_8192": (1, 8192, 8192), "decode_b64_kv7168": (64, 1, 7169)}


def profile(L, cases=None):
    """Where the time goes: every CUDA kernel of one R and one P+ decoder layer (torch profiler;
    time per layer and launches per layer, averaged over 3 layers), per case of :data:`PROFILE_CASES`."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile
    cfg = L.cfg
    out = {}
    for name in cases or PROFILE_CASES:
        batch, tokens, cap = PROFILE_CASES[name]
        x = torch.randn(batch, tokens, cfg.hidden, device="cuda").to(torch.bfloat16)
        pos = (torch.arange(tokens, device="cuda").view(1, -1) if tokens > 1
               else torch.full((batch, 1), cap - 1, device="cuda"))
        kc = torch.randn(batch, cfg.query_groups, cap, cfg.head_dim, device="cuda").to(torch.bfloat16)
        vc = torch.randn_like(kc)
        for impl in ("R", "P+"):
            layer(impl, L, x, pos, kc, vc)
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    layer(impl, L, x, pos, kc, vc)
                torch.cuda.synchronize()
            kernels = sorted(((e.key, e.self_device_time_total / 3, e.count / 3) for e in prof.key_averages()
                              if e.self_device_time_total > 0), key=lambda k: -k[1])
            total = sum(k[1] for k in kernels)
            out[f"{name} {impl}"] = {"kernel_us": round(total, 1), "launches": round(sum(k[2] for k in kernels), 1),
                                     "kernels": [[k[0][:120], round(k[1], 1), round(k[2], 2)] for k in kernels]}
            print(f"profile {name} {impl}: {total:.0f} us of kernels", flush=True)
            for k in kernels[:6]:
                print(f"    {k[1]:>9.1f} us  x{k[2]:<4.1f} {k[0][:80]}", flush=True)
        torch.cuda.empty_cache()
    return out


def gemm_candidates(L, configs=None):
    """The row-parallel strict GEMMs (o_proj, down) of the one-loop tree kernel under several launch
    configurations: bytes against the per-shard kernel, and time against it and cuBLAS (one GEMM
    over the whole K, the production projection), at 4096 and 8192 rows."""
    import torch
    import torch.nn.functional as F
    from rlk_kernels.gpu import triton_gemm as tg
    cfg = L.cfg
    configs = configs or GEMM_CANDIDATES
    gen = torch.Generator(device="cuda").manual_seed(5)
    rows_out = []
    for name, w_r, w_p, inner in (("o_proj", L.r_o, L.w["wo"], L.nq), ("down", L.r_down, L.w["w_down"], L.per)):
        for rows in (4096, 8192):
            xs = torch.randn(cfg.canonical_tp, rows, inner, device="cuda", generator=gen).to(torch.bfloat16)
            flat_x = xs.transpose(0, 1).reshape(rows, -1)
            old = tg.shard_matmul_tree(xs, w_r, flat=False)
            flops = 2.0 * rows * w_p.shape[0] * w_p.shape[1]
            for conf in configs:
                row = {"gemm": name, "rows": rows, "config": list(conf)}
                try:
                    new = tg.shard_matmul_tree(xs, w_r, flat=True, config=conf)
                    row["same_bits"] = _same(new, old)
                    fns = {"R": lambda: tg.shard_matmul_tree(xs, w_r, flat=True, config=conf),
                           "P+": lambda: F.linear(flat_x, w_p), "R0": lambda: tg.shard_matmul_tree(xs, w_r, flat=False)}
                    res = measure(lambda i: fns[i](), ("R", "P+", "R0"), 5, 5)
                    row.update({k: res[k] for k in ("R_us", "P+_us", "R0_us", "R/P+", "R/R0")})
                    row["R_tflops"] = round(flops / res["R_us"] / 1e6, 1)
                    row["P+_tflops"] = round(flops / res["P+_us"] / 1e6, 1)
                except Exception as exc:
                    row["error"] = repr(exc)[:300]
                rows_out.append(row)
                print("gemm", row, flush=True)
    return rows_out


def decode_gemm(L, configs=None, row_counts=(1, 8, 64, 128, 256)):
    """The strict GEMMs at decode row counts (at most ``SMALL_ROWS``: always the strict kernel) under
    candidate small launch configurations: the bits against the default's, the time against cuBLAS
    over the whole matrix (the P+ projection). Only the tile shape, warps and stages vary; a row's
    chain of K steps is the same in every configuration."""
    import torch
    import torch.nn.functional as F
    from rlk_kernels.gpu import triton_gemm as tg
    cfg = L.cfg
    configs = configs or DECODE_GEMM_CANDIDATES
    gen = torch.Generator(device="cuda").manual_seed(6)
    default = tg.SMALL, tg.SMALL_NARROW
    rows_out = []
    gemms = (("qkv", L.r_qkv, L.p_qkv, cfg.hidden, False), ("gate_up", L.r_gu, L.p_gu, cfg.hidden, False),
             ("o_proj", L.r_o, L.w["wo"], L.nq, True), ("down", L.r_down, L.w["w_down"], L.per, True),
             ("lm_head", L.r_lm, L.lm, cfg.hidden, False))
    try:
        for name, w_r, w_p, inner, tree in gemms:
            for rows in row_counts:
                if tree:
                    xs = torch.randn(cfg.canonical_tp, rows, inner, device="cuda", generator=gen).to(torch.bfloat16)
                    flat_x = xs.transpose(0, 1).reshape(rows, -1)
                    fn = (lambda xs=xs, w_r=w_r: tg.shard_matmul_tree(xs, w_r))
                else:
                    flat_x = torch.randn(rows, inner, device="cuda", generator=gen).to(torch.bfloat16)
                    fn = (lambda x=flat_x, w_r=w_r: tg.shard_matmul(x, w_r))
                tg.SMALL, tg.SMALL_NARROW = default
                reference = fn()
                for conf in configs:
                    row = {"gemm": name, "rows": rows, "config": list(conf)}
                    try:
                        tg.SMALL = tg.SMALL_NARROW = conf
                        row["same_bits"] = _same(fn(), reference)
                        calls = {"R": fn, "P+": (lambda x=flat_x, w=w_p: F.linear(x, w))}
                        res = measure(lambda i: calls[i](), ("R", "P+"), 20, 5)
                        row.update({k: res[k] for k in ("R_us", "P+_us", "R/P+")})
                    except Exception as exc:
                        row["error"] = repr(exc)[:300]
                    rows_out.append(row)
                    print("decode gemm", row, flush=True)
                torch.cuda.empty_cache()
    finally:
        tg.SMALL, tg.SMALL_NARROW = default
    return rows_out


DECODE_GEMM_CANDIDATES = ((64, 64, 128, 4, 4), (64, 32, 128, 4, 6), (64, 32, 128, 4, 8), (64, 128, 64, 4, 4),
                          (64, 128, 64, 4, 5), (64, 256, 64, 4, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3))


GEMM_CANDIDATES = ((128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 8, 5), (128, 256, 64, 8, 3),
                   (64, 256, 64, 4, 4))


def cold_check():
    """``run_check(device="cuda", shape="qwen3-8b")`` in a fresh process with an empty Triton cache
    (the cold check an image runs), timed from the process start; its steps' times too."""
    import tempfile
    code = ("import json,sys,time; t=time.perf_counter(); sys.path.insert(0, %r); import gpu_strict_kernels as g; "
            "g._bootstrap(); from rlk_kernels.conformance import run_check, format_table; tm={}; "
            "r=run_check(device='cuda', shape='qwen3-8b', timings=tm, "
            "progress=lambda m: print(f'{time.perf_counter()-t:6.1f} s  {m}', file=sys.stderr, flush=True)); "
            "print(format_table(r), file=sys.stderr); "
            "r['process_s']=round(time.perf_counter()-t,1); print(json.dumps({'report': r, 'timings': tm}))"
            ) % str(ROOT / "benchmarks")
    with tempfile.TemporaryDirectory() as cache:
        env = {**__import__("os").environ, "TRITON_CACHE_DIR": cache}
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=560)
        wall = round(time.perf_counter() - started, 1)
    sys.stderr.write(proc.stderr[-6000:])
    if proc.returncode:
        return {"error": f"exit {proc.returncode}", "wall_s": wall}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    report = result["report"]
    return {"cold_wall_s": wall, "process_s": report["process_s"], "elapsed_s": report["elapsed_s"],
            "passed": report["passed"], "fingerprint": report["fingerprint"], "timings": result["timings"],
            "variants_per_module": len(report["modules"][0]["variants"]), "report": report}


def _kernel_group(name: str) -> str:
    """The piece of the layer a profiled kernel belongs to (by its name)."""
    if name.startswith(("shard_mm", "shard_swiglu", "nvjet", "cutlass", "sm90_xmma")) or "gemm" in name.lower() \
            or "splitKreduce" in name or name == "_tree_kernel":
        return "GEMM"
    if "attn" in name or "sdpa" in name or "flash" in name or "_combine_kernel" in name:
        return "attention core"
    return "norms, RoPE, SwiGLU, adds, copies"


def markdown(doc: dict) -> str:
    """The throughput table and the per-kernel profiles of a result document, as markdown."""
    rows = doc.get("throughput", {}).get("rows", [])
    other = "RT" if any("RT/P+" in r for r in rows) else "R0"
    out = [f"| phase | shape | module | P eager µs | P+ µs | R µs | R ÷ P+ [95% CI] | R ÷ P | {other} µs | {other} ÷ P+ |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shape = f"{r['tokens']} tokens" if r["phase"] == "prefill" else f"batch {r['batch']}, KV {r['kv_cache']}"
        ci, r0 = r["R/P+"], r.get(f"{other}/P+")
        t0 = r.get(f"{other}_us")
        out.append(f"| {r['phase']} | {shape} | {r['module']} | {r['P_us']:.0f} | {r['P+_us']:.0f} | {r['R_us']:.0f} | "
                   f"{ci[0]:.2f} [{ci[1]:.2f}, {ci[2]:.2f}] | {r['R/P'][0]:.2f} | {f'{t0:.0f}' if t0 else '–'} | "
                   f"{f'{r0[0]:.2f}' if r0 else '–'} |")
    for case in PROFILE_CASES:
        r, p = doc.get("profile", {}).get(f"{case} R"), doc.get("profile", {}).get(f"{case} P+")
        if not (r and p):
            continue
        out += ["", f"### {case}: R {r['kernel_us']:.0f} µs in {r['launches']:.0f} launches, "
                    f"P+ {p['kernel_us']:.0f} µs in {p['launches']:.0f} launches (per layer)", "",
                "| piece | R kernel | R µs | × | P+ kernel | P+ µs | × |", "|---|---|---|---|---|---|---|"]
        for group in ("GEMM", "attention core", "norms, RoPE, SwiGLU, adds, copies"):
            rk = [k for k in r["kernels"] if _kernel_group(k[0]) == group]
            pk = [k for k in p["kernels"] if _kernel_group(k[0]) == group]
            for i in range(max(len(rk), len(pk))):
                cells = [f"`{k[0][:60]}` | {k[1]:.1f} | {k[2]:g}" if k else " | | "
                         for k in (rk[i] if i < len(rk) else None, pk[i] if i < len(pk) else None)]
                out.append(f"| {group if i == 0 else ''} | {cells[0]} | {cells[1]} |")
            out.append(f"| **{group}, total** | | **{sum(k[1] for k in rk):.0f}** | | | **{sum(k[1] for k in pk):.0f}** | |")
    return "\n".join(out)


def environment():
    import torch
    import triton
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        driver = "unknown"
    return {"gpu": torch.cuda.get_device_name(0), "driver": driver, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "python": platform.python_version()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-check", action="store_true", help="skip the cold conformance check")
    ap.add_argument("--fingerprint-only", action="store_true",
                    help="instead of the cold check, only the strict fingerprint (no variants), in this process")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--canonical-tp", type=int, default=8, choices=(1, 2, 4, 8),
                    help="the strict contract's canonical width: 8 (every TP layout up to 8, the default) or the "
                         "shard count an arm's layouts need (1: TP1 only, no shard tree)")
    ap.add_argument("--trials", type=int, default=7, help="timing rounds per case (bootstrap over them)")
    ap.add_argument("--sweep", action="store_true", help="also run the launch-configuration sweep")
    ap.add_argument("--no-split-sizes", action="store_true",
                    help="sweep without the other canonical split sizes (they change the bits; timing only)")
    ap.add_argument("--sections", default="invariance,throughput,profile,check",
                    help="comma list of: invariance, sweep, gemm, decode_gemm, throughput, profile, check")
    ap.add_argument("--markdown", action="store_true", help="print the tables of the existing --out document and stop")
    ap.add_argument("--profile-cases", default=",".join(PROFILE_CASES), help="comma list of " + ", ".join(PROFILE_CASES))
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(pathlib.Path(args.out).read_text())))
        return
    _bootstrap()
    import torch
    from rlk_kernels.gpu import triton_attention as ta
    from rlk_kernels.model import ModelConfig
    from rlk_kernels.gpu import triton_gemm as tg
    from rlk_kernels.gpu import vendor_gemm as vg
    doc = {"schema": "rlk-kit/bench-gpu-strict-kernels/v2", "environment": environment(),
           "strict_schedule": {"attention_block_n": ta.BLOCK_N, "attention_split": ta.SPLIT,
                               "attention_prefill": list(ta.PREFILL), "attention_decode": list(ta.DECODE),
                               "gemm_flat_tree": tg.FLAT_TREE, "gemm_flat_tree_config": list(tg.FLAT_TREE_CONFIG),
                               "gemm_vendor": vg.enabled(), "gemm_vendor_min_rows": vg.MIN_ROWS,
                               "qk_glue": "qkv_glue: one program per token, q/k/v in one launch"},
           "argv": sys.argv[1:], "canonical_tp": args.canonical_tp}
    print(json.dumps(doc["environment"]), flush=True)
    out = pathlib.Path(args.out)

    def save():
        out.write_text(json.dumps(doc, indent=2, sort_keys=True))

    def section(name, fn):
        started = time.perf_counter()
        try:
            doc[name] = fn()
        except Exception as exc:                                 # keep what the other sections measured
            import traceback
            traceback.print_exc()
            doc[name] = {"error": repr(exc)}
        doc[name + "_s"] = round(time.perf_counter() - started, 1)
        save()

    wanted = set(args.sections.split(",")) | ({"sweep"} if args.sweep else set())
    if args.skip_check or args.fingerprint_only:
        wanted.discard("check")
    if args.fingerprint_only:
        from rlk_kernels.conformance import conformance_fingerprint
        section("fingerprint", lambda: conformance_fingerprint(device="cuda", shape="qwen3-8b"))
        print(f"fingerprint {doc['fingerprint']} in {doc['fingerprint_s']} s", flush=True)
    elif "check" in wanted:
        # a fresh process with an empty Triton cache: the cold check, first, while this process holds no
        # GPU memory (its compile and check processes need most of an 80 GB card)
        section("conformance", cold_check)
        c = doc["conformance"]
        print(f"conformance: passed {c.get('passed')} in {c.get('process_s')} s cold "
              f"(fingerprint {c.get('fingerprint')})", flush=True)
    torch.manual_seed(0)
    with torch.no_grad():
        base = ModelConfig.qwen3_8b()
        L = Layer(type(base)(**{**base.to_json(), "canonical_tp": args.canonical_tp}))
        if "invariance" in wanted:
            section("invariance_at_scale", lambda: invariance_at_scale(L))
            print(json.dumps(doc["invariance_at_scale"], indent=1), flush=True)
        if "sweep" in wanted:
            section("sweep", lambda: sweep(L, split_sizes=not args.no_split_sizes))
        if "gemm" in wanted:
            section("gemm_candidates", lambda: gemm_candidates(L))
        if "decode_gemm" in wanted:
            section("decode_gemm", lambda: decode_gemm(L))
        if "throughput" in wanted:
            section("throughput", lambda: throughput(L, quick=args.quick, trials=args.trials))
        if "profile" in wanted:
            section("profile", lambda: profile(L, args.profile_cases.split(",")))
        doc["vendor_certifications"] = vg.report()
        doc["goals"] = {"prefill_layer": 0.90, "prefill_layer_logp": 0.95, "decode_layer": 0.98,
                        "denominator": "P+ (fair production baseline, benchmarks/fair_baseline.py)",
                        "anchors": {"thinking_machines_batch_invariant": 0.62, "sglang_deterministic": 0.74,
                                    "megatron_batch_invariant": 0.99}}
    save()


if __name__ == "__main__":
    main()
