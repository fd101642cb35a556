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

import os

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
def _rms_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, o_ptr, N, eps, scale, T, HPS, HEADS,
                     sxs, sxm, sob, soh, sot, BLOCK: tl.constexpr, HALF: tl.constexpr, SCALE: tl.constexpr):
    """One (token, head) row: ``_rms_kernel``'s arithmetic, then RoPE and the scale rounded to bf16
    after every operation exactly as the eager bf16 ops round (``x1*c - x2*s``, ``x2*c + x1*s``,
    ``* scale``). The row is read from the per-shard product [S, M, ...] and written in [B, H, T, D]."""
    pid = tl.program_id(0).to(tl.int64)
    tok = pid // HEADS
    head = pid % HEADS
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    src = x_ptr + (head // HPS) * sxs + tok * sxm + (head % HPS) * N
    x = tl.load(src + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
    y = (x * inv * w).to(tl.bfloat16).to(tl.float32)
    first = cols < HALF
    partner = tl.where(first, cols + HALF, cols - HALF)
    xp = tl.load(src + partner, mask=ok, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=ok, other=0.0).to(tl.float32)
    yp = (xp * inv * wp).to(tl.bfloat16).to(tl.float32)
    p = tl.load(pos_ptr + tok)
    at = tl.where(first, cols, cols - HALF)
    c = tl.load(cos_ptr + p * HALF + at, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + p * HALF + at, mask=ok, other=0.0).to(tl.float32)
    a = (y * c).to(tl.bfloat16).to(tl.float32)
    b = (yp * s).to(tl.bfloat16).to(tl.float32)
    out = tl.where(first, a - b, a + b).to(tl.bfloat16)
    if SCALE:
        out = (out.to(tl.float32) * scale).to(tl.bfloat16)
    dst = o_ptr + (tok // T) * sob + head * soh + (tok % T) * sot
    tl.store(dst + cols, out, mask=ok)


@triton.jit
def _rms_rope_tile_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, o_ptr, R, N, eps, scale, T, HPS, HEADS,
                          sxs, sxm, sob, soh, sot, ROWS: tl.constexpr, BLOCK: tl.constexpr, HALF: tl.constexpr,
                          SCALE: tl.constexpr):
    """:func:`_rms_rope_kernel` on a [ROWS, BLOCK] tile, launched with 4 warps per row: Triton lays
    such a tile out one element per thread, 32 lanes and 4 warps along the row, so a row's sum is
    the one-row kernel's in-block reduction (the benchmark checks the bytes on a GPU)."""
    pid = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = pid < R
    tok = pid // HEADS
    head = pid % HEADS
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    m = live[:, None] & ok[None, :]
    first = cols < HALF
    partner = tl.where(first, cols + HALF, cols - HALF)
    at = tl.where(first, cols, cols - HALF)
    src = x_ptr + (head // HPS) * sxs + tok * sxm + (head % HPS) * N
    x = tl.load(src[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, 1) / N + eps)
    y = (x * inv[:, None] * w[None, :]).to(tl.bfloat16).to(tl.float32)
    xp = tl.load(src[:, None] + partner[None, :], mask=m, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=ok, other=0.0).to(tl.float32)
    yp = (xp * inv[:, None] * wp[None, :]).to(tl.bfloat16).to(tl.float32)
    p = tl.load(pos_ptr + tok, mask=live, other=0)
    c = tl.load(cos_ptr + p[:, None] * HALF + at[None, :], mask=m, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + p[:, None] * HALF + at[None, :], mask=m, other=0.0).to(tl.float32)
    a = (y * c).to(tl.bfloat16).to(tl.float32)
    b = (yp * s).to(tl.bfloat16).to(tl.float32)
    out = tl.where(first[None, :], a - b, a + b).to(tl.bfloat16)
    if SCALE:
        out = (out.to(tl.float32) * scale).to(tl.bfloat16)
    dst = o_ptr + (tok // T) * sob + head * soh + (tok % T) * sot
    tl.store(dst[:, None] + cols[None, :], out, mask=m)


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


# (token, head) rows per program of the q/k glue as one [rows, D] tile with 4 warps per row
# (0: the one-row kernel; the same bits either way). Unrolling rows inside one program measured
# slower than one row per program on the H200 (4096 tokens: 201 against 187 us at 4 rows, 238 at
# 32; decode batch 8: 11 against 8 us: benchmarks/results/h200-gemm-certify.json) and was removed.
ROPE_TILE = int(os.environ.get("RLK_ROPE_TILE_ROWS", "0"))


def rms_norm_rope(x_shards, weight, eps: float, cos, sin, pos, *, heads: int, scale: float | None = None,
                  tile: int | None = None):
    """RMSNorm over each head of the per-shard product ``x_shards`` [S, B*T, heads/S * D] (the q or
    k columns of the strict QKV GEMM), RoPE at positions ``pos`` [B, T] with the bf16 tables
    ``cos``/``sin`` [positions, D/2], and the optional ``scale``; returns [B, heads, T, D] bf16. The
    same bits as :func:`rms_norm`, the eager bf16 rotate-half RoPE and ``* scale`` one after another,
    in one kernel instead of about a dozen (head split copies, norm, slices, products, cat, scale)."""
    import torch
    shards, rows, width = x_shards.shape
    dim = width * shards // heads
    b, t = pos.shape
    out = torch.empty(b, heads, t, dim, dtype=torch.bfloat16, device=x_shards.device)
    tile = ROPE_TILE if tile is None else tile
    if rows and tile > 1:
        total = rows * heads
        _rms_rope_tile_kernel[(-(-total // tile),)](
            x_shards, weight.contiguous(), cos, sin, pos.to(torch.int32).contiguous(), out, total, dim, eps,
            1.0 if scale is None else scale, t, heads // shards, heads, x_shards.stride(0), x_shards.stride(1),
            *out.stride()[:3], ROWS=tile, BLOCK=triton.next_power_of_2(dim), HALF=dim // 2,
            SCALE=scale is not None, num_warps=4 * tile, enable_fp_fusion=False)
    elif rows:
        _rms_rope_kernel[(rows * heads,)](
            x_shards, weight.contiguous(), cos, sin, pos.to(torch.int32).contiguous(), out, dim, eps,
            1.0 if scale is None else scale, t, heads // shards, heads, x_shards.stride(0), x_shards.stride(1),
            *out.stride()[:3], BLOCK=triton.next_power_of_2(dim), HALF=dim // 2, SCALE=scale is not None,
            num_warps=4, enable_fp_fusion=False)
    return out
