"""Strict row-wise and element-wise kernels: RMSNorm and SwiGLU.

RMSNorm: one program per row, the whole row in one block, the mean of squares as Triton's
in-block reduction — the same code for every row whatever the row count (a library reduction
may split a row across blocks when there are few rows, which changes its bits). SwiGLU:
element-wise, ``g / (1 + exp(-g)) * u`` in fp32, the same instructions for every element.

Example (``TRITON_INTERPRET=1`` on a CPU)::

    >>> import torch
    >>> rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6).shape   # doctest: +SKIP
    torch.Size([2, 8])
"""

from __future__ import annotations

import triton
import triton.language as tl

SWIGLU_BLOCK = 512


@triton.jit
def _rms_kernel(x_ptr, w_ptr, o_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
    tl.store(o_ptr + row * N + cols, (x * inv * w).to(o_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _norm_rope_heads(row, w_ptr, c, s, eps, H, HPS, COL0, sxs, HP2: tl.constexpr, D: tl.constexpr,
                     HALF: tl.constexpr, HB: tl.constexpr, SCALE: tl.constexpr, scale):
    """One token's ``H`` heads of q or k as one [heads, D/2] x 2 tile: each head's RMSNorm (its sum
    of squares over both halves), then RoPE and the scale rounded to bf16 after every operation
    exactly as the eager bf16 ops round (``x1*c - x2*s``, ``x2*c + x1*s``, ``* scale``). Head ``h``
    is read from shard ``h // HPS`` of the per-shard product at column ``COL0 + (h % HPS) * D``."""
    h = tl.arange(0, HP2)
    d = tl.arange(0, HB)
    dm = d < HALF
    live = (h < H)[:, None] & dm[None, :]
    src = row + (h // HPS).to(tl.int64)[:, None] * sxs + COL0 + (h % HPS)[:, None] * D + d[None, :]
    x1 = tl.load(src, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=live, other=0.0).to(tl.float32)
    inv = (1.0 / tl.sqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps))[:, None]
    y1 = (x1 * inv * tl.load(w_ptr + d, mask=dm, other=0.0).to(tl.float32)[None, :]).to(tl.bfloat16).to(tl.float32)
    y2 = (x2 * inv * tl.load(w_ptr + HALF + d, mask=dm, other=0.0).to(tl.float32)[None, :]).to(tl.bfloat16).to(tl.float32)
    o1 = ((y1 * c).to(tl.bfloat16).to(tl.float32) - (y2 * s).to(tl.bfloat16).to(tl.float32)).to(tl.bfloat16)
    o2 = ((y2 * c).to(tl.bfloat16).to(tl.float32) + (y1 * s).to(tl.bfloat16).to(tl.float32)).to(tl.bfloat16)
    if SCALE:
        o1 = (o1.to(tl.float32) * scale).to(tl.bfloat16)
        o2 = (o2.to(tl.float32) * scale).to(tl.bfloat16)
    return o1, o2, live


@triton.jit
def _glue_kernel(x_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, v_ptr, eps, scale, T,
                 HQ, HKV, QPS, KPS, sxs, sxm, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
                 HQ2: tl.constexpr, HKV2: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                 HB: tl.constexpr, SCALE: tl.constexpr, KV: tl.constexpr):
    """One program per token (the same code whatever the token count, so prefill and decode rows
    get the same bits): q's heads normed, rotated and scaled into q [B, HQ, T, D]; with ``KV``, k's
    heads normed and rotated into k and v's heads copied into v (the head split of the per-shard
    product [S, M, q | k | v columns] in the same launch)."""
    tok = tl.program_id(0).to(tl.int64)
    b = tok // T
    t = tok % T
    p = tl.load(pos_ptr + tok)
    d = tl.arange(0, HB)
    c = tl.load(cos_ptr + p * HALF + d, mask=d < HALF, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + p * HALF + d, mask=d < HALF, other=0.0).to(tl.float32)[None, :]
    row = x_ptr + tok * sxm
    h = tl.arange(0, HQ2)
    o1, o2, live = _norm_rope_heads(row, qw_ptr, c, s, eps, HQ, QPS, 0, sxs, HQ2, D, HALF, HB, SCALE, scale)
    dst = q_ptr + b * sqb + h[:, None] * sqh + t * sqt + d[None, :]
    tl.store(dst, o1, mask=live)
    tl.store(dst + HALF, o2, mask=live)
    if KV:
        g = tl.arange(0, HKV2)
        k1, k2, live = _norm_rope_heads(row, kw_ptr, c, s, eps, HKV, KPS, QPS * D, sxs, HKV2, D, HALF, HB, False,
                                        1.0)
        dst = k_ptr + b * skb + g[:, None] * skh + t * skt + d[None, :]
        tl.store(dst, k1, mask=live)
        tl.store(dst + HALF, k2, mask=live)
        dd = tl.arange(0, 2 * HB)
        live = (g < HKV)[:, None] & (dd < D)[None, :]
        src = row + (g // KPS).to(tl.int64)[:, None] * sxs + (QPS + KPS) * D + (g % KPS)[:, None] * D + dd[None, :]
        tl.store(v_ptr + b * svb + g[:, None] * svh + t * svt + dd[None, :], tl.load(src, mask=live, other=0.0),
                 mask=live)


@triton.jit(do_not_specialize=["n"])
def _swiglu_kernel(gu_ptr, o_ptr, n, per, BLOCK: tl.constexpr):
    # one program per (row, block of columns): no 64-bit division per element (the flat form's
    # i // per and i % per made it 1.8x slower than the production kernel at 4096 rows on the H200)
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = col < per
    g = tl.load(gu_ptr + row * (2 * per) + col, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * (2 * per) + per + col, mask=ok, other=0.0).to(tl.float32)
    tl.store(o_ptr + row * per + col, (g / (1.0 + tl.exp(-g)) * u).to(o_ptr.dtype.element_ty), mask=ok)


def rms_norm(x, weight, eps: float):
    """RMSNorm over the last dimension; the result has ``x``'s dtype."""
    import torch
    shape = x.shape
    flat = x.contiguous().view(-1, shape[-1])
    out = torch.empty_like(flat)
    if flat.shape[0]:
        _rms_kernel[(flat.shape[0],)](flat, weight.contiguous(), out, shape[-1], eps,
                                      BLOCK=triton.next_power_of_2(shape[-1]), num_warps=4,
                                      enable_fp_fusion=False)
    return out.view(shape)


def swiglu(gate_up, per: int, out_dtype=None):
    """``silu(gate_up[..., :per]) * gate_up[..., per:]`` for ``gate_up`` [..., 2*per]."""
    import torch
    gu = gate_up.contiguous()
    out = torch.empty(*gu.shape[:-1], per, dtype=out_dtype or gu.dtype, device=gu.device)
    n = out.numel()
    if n:
        block = min(SWIGLU_BLOCK, triton.next_power_of_2(per))
        _swiglu_kernel[(n // per, -(-per // block))](gu, out, n, per, BLOCK=block, num_warps=4,
                                                       enable_fp_fusion=False)
    return out


def rms_norm_rope(x_shards, weight, eps: float, cos, sin, pos, *, heads: int, scale: float | None = None):
    """RMSNorm over each head of the per-shard product ``x_shards`` [S, B*T, heads/S * D] (the q or
    k columns of the strict QKV GEMM), RoPE at positions ``pos`` [B, T] with the bf16 tables
    ``cos``/``sin`` [positions, D/2], and the optional ``scale``; returns [B, heads, T, D] bf16,
    rounded where the eager bf16 ops round, in one launch of one program per token."""
    import torch
    shards, rows, width = x_shards.shape
    dim = width * shards // heads
    b, t = pos.shape
    out = torch.empty(b, heads, t, dim, dtype=torch.bfloat16, device=x_shards.device)
    if rows:
        _glue_kernel[(rows,)](
            x_shards, weight.contiguous(), weight, cos, sin, pos.to(torch.int32).contiguous(), out, out, out, eps,
            1.0 if scale is None else scale, t, heads, 0, heads // shards, 1, x_shards.stride(0), x_shards.stride(1),
            *out.stride()[:3], 0, 0, 0, 0, 0, 0, HQ2=triton.next_power_of_2(heads), HKV2=1, D=dim,
            HALF=dim // 2, HB=triton.next_power_of_2(dim // 2), SCALE=scale is not None, KV=False, num_warps=4, enable_fp_fusion=False)
    return out


def qkv_glue(qkv_shards, q_weight, k_weight, eps: float, cos, sin, pos, *, heads: int, groups: int, scale: float):
    """The strict QKV GEMM's per-shard product [S, B*T, (heads + 2*groups)/S * D] to attention's
    inputs in one launch: q [B, heads, T, D] normed, rotated and scaled, k [B, groups, T, D] normed
    and rotated (the bits of :func:`rms_norm_rope`), v [B, groups, T, D] copied."""
    import torch
    shards, rows, width = qkv_shards.shape
    dim = width * shards // (heads + 2 * groups)
    b, t = pos.shape
    x = qkv_shards if qkv_shards.stride(2) == 1 else qkv_shards.contiguous()
    q = torch.empty(b, heads, t, dim, dtype=torch.bfloat16, device=x.device)
    k = torch.empty(b, groups, t, dim, dtype=torch.bfloat16, device=x.device)
    v = torch.empty_like(k)
    if rows:
        _glue_kernel[(rows,)](
            x, q_weight.contiguous(), k_weight.contiguous(), cos, sin, pos.to(torch.int32).contiguous(), q, k, v,
            eps, scale, t, heads, groups, heads // shards, groups // shards, x.stride(0), x.stride(1),
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], HQ2=triton.next_power_of_2(heads),
            HKV2=triton.next_power_of_2(groups), D=dim, HALF=dim // 2,
            HB=triton.next_power_of_2(dim // 2), SCALE=True, KV=True, num_warps=4,
            enable_fp_fusion=False)
    return q, k, v
