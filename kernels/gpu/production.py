"""Production kernels ("P+", fused production) of a Qwen3 decoder layer on one CUDA GPU (not strict).

What vLLM 0.16 (custom ops, or Inductor's fusions of the same ops under torch.compile) and
Megatron/Transformer Engine run for each piece of the layer, as plain fast kernels:

| piece | here | production counterpart |
|---|---|---|
| input / post-attention / final RMSNorm | one Triton kernel, several rows per program | vLLM ``rms_norm`` / TE fused RMSNorm |
| residual add + RMSNorm | one kernel (``fused_add_rms_norm``) | vLLM ``fused_add_rms_norm`` |
| QKV, gate/up, o_proj, down, LM head | cuBLAS, merged QKV and gate/up weights | vLLM ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` |
| q/k RMSNorm + RoPE + K/V cache write | one Triton kernel reading the QKV product, writing q in the attention's layout and K/V into the cache | vLLM's fused QK-norm+RoPE and ``reshape_and_cache`` |
| SwiGLU | one kernel (``silu_and_mul``) | vLLM ``SiluAndMul`` / TE ``swiglu`` |
| prefill attention | SDPA, the fastest of cuDNN and FlashAttention-2 measured per shape | vLLM FlashAttention / TE cuDNN fused attention |
| decode attention | SDPA, the fastest of FlashAttention-2, cuDNN and memory-efficient per shape | vLLM FlashAttention (no paged/FA3 kernel is installed on the machine) |
| selected-token log-prob | cuBLAS logits, one Triton pass for logsumexp and the target logit | fused log-prob kernels of RL trainers (verl, Liger) |

Every kernel here is allowed to vary a row's bits with the batch (that is what production does).
None has a backward: they serve no-grad passes (rollout, log-prob recomputes). Two users: the kernel
benchmark's P+ column (``benchmarks/gpu_strict_kernels.py``, through ``benchmarks/fair_baseline.py``)
and the GRPO workload's fused production (``rlk_kernels.grpo.fused``).

Example (``TRITON_INTERPRET=1`` on a CPU)::

    >>> import torch
    >>> rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6).shape   # doctest: +SKIP
    torch.Size([2, 8])
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rms_rows(x_ptr, r_ptr, w_ptr, o_ptr, ro_ptr, M, N, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr,
              ADD: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    ok = (rows[:, None] < M) & (cols[None, :] < N)
    at = rows[:, None].to(tl.int64) * N + cols[None, :]
    x = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    if ADD:                                    # residual stream: x + r, kept in bf16 as production does
        x = (x + tl.load(r_ptr + at, mask=ok, other=0.0).to(tl.float32)).to(ro_ptr.dtype.element_ty)
        tl.store(ro_ptr + at, x, mask=ok)
        x = x.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, 1) / N + eps)
    tl.store(o_ptr + at, (x * inv[:, None] * w[None, :]).to(o_ptr.dtype.element_ty), mask=ok)


def _rows_per_program(n: int) -> int:
    return max(1, min(16, 8192 // triton.next_power_of_2(n)))


def rms_norm(x, weight, eps: float):
    """RMSNorm over the last dimension (fp32 math, output in ``x``'s dtype)."""
    import torch
    flat = x.reshape(-1, x.shape[-1])
    out = torch.empty_like(flat)
    rows = _rows_per_program(flat.shape[1])
    _rms_rows[(triton.cdiv(flat.shape[0], rows),)](flat, flat, weight, out, out, flat.shape[0], flat.shape[1], eps,
                                                   ROWS=rows, BLOCK=triton.next_power_of_2(flat.shape[1]),
                                                   ADD=False, num_warps=8)
    return out.view(x.shape)


def fused_add_rms_norm(x, residual, weight, eps: float):
    """``(rms_norm(x + residual), x + residual)`` in one pass."""
    import torch
    flat, res = x.reshape(-1, x.shape[-1]), residual.reshape(-1, x.shape[-1])
    out, summed = torch.empty_like(flat), torch.empty_like(flat)
    rows = _rows_per_program(flat.shape[1])
    _rms_rows[(triton.cdiv(flat.shape[0], rows),)](flat, res, weight, out, summed, flat.shape[0], flat.shape[1],
                                                   eps, ROWS=rows, BLOCK=triton.next_power_of_2(flat.shape[1]),
                                                   ADD=True, num_warps=8)
    return out.view(x.shape), summed.view(x.shape)


@triton.jit
def _silu_mul(gu_ptr, o_ptr, n, per, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    row, col = i // per, i % per
    g = tl.load(gu_ptr + row * (2 * per) + col, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * (2 * per) + per + col, mask=ok, other=0.0).to(tl.float32)
    tl.store(o_ptr + i, (g * tl.sigmoid(g) * u).to(o_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(gate_up):
    """``silu(gate_up[..., :per]) * gate_up[..., per:]``, one kernel."""
    import torch
    per = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], per, dtype=gate_up.dtype, device=gate_up.device)
    n = out.numel()
    _silu_mul[(triton.cdiv(n, 4096),)](gate_up, out, n, per, BLOCK=4096, num_warps=8)
    return out


@triton.jit
def _qk_norm_rope(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, v_ptr,
                  T, HQ, HKV, start, eps, sqb, sqt, sqh, skb, skh, skt, svb, svh, svt,
                  D: tl.constexpr, HALF: tl.constexpr, HEADS: tl.constexpr):
    """One program per token: every q and k head normed and rotated, v copied into the cache."""
    tok = tl.program_id(0)
    b = tok // T
    t = tok % T
    half = HALF
    h = tl.arange(0, HEADS)
    d = tl.arange(0, HALF)
    pos = tl.load(pos_ptr + tok)
    c = tl.load(cos_ptr + pos * half + d)[None, :]
    s = tl.load(sin_ptr + pos * half + d)[None, :]
    width = (HQ + 2 * HKV) * D
    row = qkv_ptr + tok.to(tl.int64) * width
    for part in tl.static_range(2):           # 0: q heads, 1: k heads
        n_heads = HQ if part == 0 else HKV
        first = 0 if part == 0 else HQ
        w_ptr = qw_ptr if part == 0 else kw_ptr
        ok = h[:, None] < n_heads
        at = row + (first + h[:, None]) * D + d[None, :]
        x1 = tl.load(at, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(at + half, mask=ok, other=0.0).to(tl.float32)
        inv = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)[:, None]
        x1 = x1 * inv * tl.load(w_ptr + d).to(tl.float32)[None, :]
        x2 = x2 * inv * tl.load(w_ptr + half + d).to(tl.float32)[None, :]
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
        if part == 0:
            dst = q_ptr + b * sqb + t * sqt + h[:, None] * sqh + d[None, :]
        else:
            dst = k_ptr + b * skb + h[:, None] * skh + (start + t) * skt + d[None, :]
        tl.store(dst, y1.to(q_ptr.dtype.element_ty), mask=ok)
        tl.store(dst + half, y2.to(q_ptr.dtype.element_ty), mask=ok)
    okv = h[:, None] < HKV
    dd = tl.arange(0, D)
    vals = tl.load(row + (HQ + HKV + h[:, None]) * D + dd[None, :], mask=okv, other=0.0)
    tl.store(v_ptr + b * svb + h[:, None] * svh + (start + t) * svt + dd[None, :], vals, mask=okv)


def qk_norm_rope(qkv, b, t, heads, groups, dim, q_weight, k_weight, cos, sin, pos, kcache, vcache, eps):
    """q [B, Hq, T, D] (a view of a [B, T, Hq, D] buffer, FlashAttention's layout), and K/V written
    into the caches [B, Hkv, cap, D] at their last ``t`` positions (the whole cache in prefill)."""
    import torch
    q = torch.empty(b, t, heads, dim, dtype=qkv.dtype, device=qkv.device)
    start = kcache.shape[2] - t
    _qk_norm_rope[(b * t,)](qkv, q_weight, k_weight, cos, sin, pos.reshape(-1).to(torch.int32), q, kcache, vcache,
                            t, heads, groups, start, eps, *q.stride()[:3], kcache.stride(0), kcache.stride(1),
                            kcache.stride(2), vcache.stride(0), vcache.stride(1), vcache.stride(2),
                            D=dim, HALF=dim // 2, HEADS=triton.next_power_of_2(max(heads, groups)), num_warps=4)
    return q.transpose(1, 2)


@triton.jit
def _logp_rows(logit_ptr, tgt_ptr, o_ptr, V, stride, temperature, BLOCK: tl.constexpr, SCALE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    for v0 in range(0, V, BLOCK):
        x = tl.load(logit_ptr + row * stride + v0 + cols, mask=v0 + cols < V, other=float("-inf")).to(tl.float32)
        if SCALE:                                # logits / temperature in fp32, as the samplers take them
            x = x / temperature
        m_new = tl.maximum(m, x)
        seen = m_new > float("-inf")             # lanes past the vocabulary stay (-inf, 0)
        s = tl.where(seen, s * tl.exp(m - m_new) + tl.exp(x - m_new), 0.0)
        m = m_new
    top = tl.max(m, 0)
    total = tl.sum(tl.where(m > float("-inf"), s * tl.exp(m - top), 0.0), 0)
    target = tl.load(logit_ptr + row * stride + tl.load(tgt_ptr + row)).to(tl.float32)
    if SCALE:
        target = target / temperature
    tl.store(o_ptr + row, target - top - tl.log(total))


def logp_from_logits(logits, targets, vocab: int, temperature: float = 1.0):
    """log-softmax of ``logits / temperature`` (fp32) over the first ``vocab`` columns at ``targets``: one read
    of the bf16 logits [N, V'] (rows contiguous), no fp32 copy of them; fp32 [N]."""
    import torch
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    if logits.shape[0] == 0:
        return out
    _logp_rows[(logits.shape[0],)](logits, targets, out, vocab, logits.stride(0), float(temperature), BLOCK=4096,
                                   SCALE=float(temperature) != 1.0, num_warps=8)
    return out


# --- attention backends: the fastest available one per shape -----------------------------------------

BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")


def sdpa(q, k, v, causal: bool, backend: str):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def pick_backend(q, k, v, causal: bool, time_fn) -> tuple[str, dict]:
    """The fastest backend that runs these shapes (``time_fn(callable) -> µs``), and every time seen."""
    seen = {}
    for name in BACKENDS:
        try:
            sdpa(q, k, v, causal, name)
            seen[name] = round(time_fn(lambda: sdpa(q, k, v, causal, name)), 2)
        except Exception as exc:                    # not built for these shapes / this GPU
            seen[name] = f"unavailable: {type(exc).__name__}"
    timed = {n: t for n, t in seen.items() if isinstance(t, float)}
    return min(timed, key=timed.get), seen


def time_us(fn, reps: int = 5) -> float:
    """Mean µs of ``fn()`` on the current CUDA stream (one warm-up call, then ``reps`` between two events);
    wall-clock time where no CUDA device is present (the interpreted kernels of the tests)."""
    import time

    import torch
    fn()
    if not torch.cuda.is_available():
        started = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - started) * 1e6 / reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / reps


class BackendChoice:
    """The fastest SDPA backend per (batch, query tokens, key length), timed once per shape and cached.

    A backend whose output differs from the math backend's by more than bf16 attention's rounding
    (``atol``) is not chosen, whatever its time: a fast wrong kernel is no baseline. ``log(line)``
    receives one ``[RL-Kernel][sdpa]`` line per shape chosen. Example::

        choice = BackendChoice(log=print)
        out = sdpa(q, k, v, True, choice.backend(q, k, v, True))
    """

    def __init__(self, log=None, reps: int = 5, atol: float = 2e-2):
        self.chosen: dict = {}
        self.seen: dict = {}
        self.log, self.reps, self.atol = log, reps, atol

    def backend(self, q, k, v, causal: bool) -> str:
        key = (q.shape[0], q.shape[2], k.shape[2])
        name = self.chosen.get(key)
        if name is None:
            name = self.chosen[key] = self._pick(q, k, v, causal, key)
        return name

    def _pick(self, q, k, v, causal, key) -> str:
        import json
        reference = sdpa(q, k, v, causal, "MATH").float()
        seen = {}
        for name in BACKENDS:
            try:
                out = sdpa(q, k, v, causal, name)
                diff = float((out.float() - reference).abs().max())
                if not diff <= self.atol:
                    seen[name] = f"disagrees: max |d| {diff:.3g} with the math backend"
                    continue
                seen[name] = round(time_us(lambda: sdpa(q, k, v, causal, name), self.reps), 2)
            except Exception as exc:                    # not built for these shapes / this GPU
                seen[name] = f"unavailable: {type(exc).__name__}"
        timed = {n: t for n, t in seen.items() if isinstance(t, float)}
        best = min(timed, key=timed.get) if timed else "MATH"
        self.seen[key] = seen
        if self.log is not None:
            self.log(f"[RL-Kernel][sdpa] batch={key[0]} tokens={key[1]} kv={key[2]} causal={str(causal).lower()} "
                     f"chosen={best} times_us={json.dumps(seen, sort_keys=True)}")
        return best
