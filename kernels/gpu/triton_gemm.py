"""Strict GEMMs: per-virtual-shard products and row-parallel products reduced in the fixed shard tree.

Two launch configurations share the per-row arithmetic: a row's output element is the chain of
``BK``-wide MMA steps over K from 0 upward into one fp32 accumulator, in the same MMA row block
(a warp group's 64 rows) whatever the launch. The small configuration (few rows: decode) uses
narrow column tiles so that there are enough programs to stream the weights; the large one
(prefill) uses wide tiles. Neither splits K by row count; the only split of K is the canonical
partition into virtual shards, the same for every call.

- :func:`shard_matmul` — ``x @ w[s]`` for every shard s: [S, M, N] (column-parallel projections,
  and the per-shard partials of a row-parallel one).
- :func:`shard_swiglu` — ``silu(x @ g[s]) * (x @ u[s])`` per shard for gate/up weights laid out
  ``[gate | up]``: large row counts run one kernel holding the gate and up tiles of the same
  columns in two accumulators (one load of ``x`` feeds both) with SwiGLU in the epilogue; small
  row counts write the bf16 gate/up products and run the element-wise kernel. The epilogue rounds
  gate and up to the product's dtype before SwiGLU exactly as the stored path does, so a row's
  bits are the same.
- :func:`shard_matmul_tree` — ``tree_s(x[s] @ w[s])``: the row-parallel projection reduced over
  its (power-of-two, aligned) shards in the fixed pairwise tree. Large row counts run one fused
  kernel that keeps two accumulators in registers and the upper tree levels in an fp32 scratch
  tile; small row counts write the fp32 partials and add them level by level. Both add the same
  fp32 values in the same tree, so the bits are the same.

Example (``TRITON_INTERPRET=1`` on a CPU)::

    >>> import torch
    >>> x, w = torch.randn(3, 32), torch.randn(2, 32, 16)
    >>> out = shard_matmul(x, w)                         # doctest: +SKIP
    >>> torch.allclose(out, torch.einsum("mk,skn->smn", x, w), atol=1e-2)   # doctest: +SKIP
    True
"""

from __future__ import annotations

import triton
import triton.language as tl

from rlk_kernels.gpu.common import interpreting, mma

# (BM, BN, BK, warps, stages): the per-row MMA chain is the same in all (K steps, 64-row warp groups)
SMALL = (64, 64, 128, 4, 4)
# decode-size launches by rows and columns (over all shards): the H100 sweep of round 9
# (benchmarks/gpu_strict_kernels.py --sections decode_gemm), every one bit-identical to SMALL
SMALL_NARROW = (64, 32, 128, 4, 6)     # <= 64 rows, <= NARROW_COLS columns: twice the programs
MID_NARROW = (64, 128, 64, 4, 5)       # 129-256 rows, <= NARROW_COLS columns
MID_WIDE = (128, 128, 64, 8, 3)        # 65-256 rows, more columns (qkv, gate/up, the LM head)
NARROW_COLS = 4096                     # (o_proj and down at width 1: 64 tiles of 64 columns on 132 SMs)
NARROW_ROWS = 64
LARGE = (128, 256, 64, 8, 3)
LARGE_TREE = (128, 128, 64, 8, 3)      # two fp32 accumulators must fit in registers
LARGE_SWIGLU = (128, 128, 64, 8, 3)    # gate and up accumulators: the registers of one 128x256 tile
SMALL_ROWS = 256                       # up to this many rows: the small configuration
FLAT_TREE = False                      # row-parallel products above SMALL_ROWS: one loop over all shards
FLAT_TREE_CONFIG = (128, 128, 64, 8, 4)
TREE_BLOCK = 1024                      # elements per program of the small-row shard tree


def _config(rows: int, tree: bool = False, cols: int | None = None):
    """The launch for ``rows`` rows (and ``cols`` output columns over all shards, when known)."""
    if rows > SMALL_ROWS:
        return LARGE_TREE if tree else LARGE
    if cols is None:
        return SMALL
    narrow = cols <= NARROW_COLS
    if rows <= NARROW_ROWS:
        return SMALL_NARROW if narrow else SMALL
    if narrow:
        return SMALL if rows <= 2 * NARROW_ROWS else MID_NARROW
    return MID_WIDE


@triton.jit
def tile_dot(x_ptr, w_ptr, rows, cols, M, N, K, sxm, sxk, swk, swn,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INTERP: tl.constexpr):
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    ks = tl.arange(0, BK)
    for k0 in range(0, K, BK):
        kk = k0 + ks
        a = tl.load(x_ptr + rows[:, None] * sxm + kk[None, :] * sxk,
                    mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(w_ptr + kk[:, None] * swk + cols[None, :] * swn,
                    mask=(kk[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = mma(a, b, acc, INTERP)
    return acc

@triton.jit
def tile_dot2(x_ptr, w_ptr, rows, cols, off2, M, N, K, sxm, sxk, swk, swn,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INTERP: tl.constexpr):
    """Two tiles of the same rows: columns ``cols`` and ``cols + off2``, each the chain of
    :func:`tile_dot` (same K steps into its own fp32 accumulator), sharing the loads of ``x``."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc2 = tl.zeros((BM, BN), dtype=tl.float32)
    ks = tl.arange(0, BK)
    for k0 in range(0, K, BK):
        kk = k0 + ks
        a = tl.load(x_ptr + rows[:, None] * sxm + kk[None, :] * sxk,
                    mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
        bmask = (kk[:, None] < K) & (cols[None, :] < N)
        b = tl.load(w_ptr + kk[:, None] * swk + cols[None, :] * swn, mask=bmask, other=0.0)
        b2 = tl.load(w_ptr + kk[:, None] * swk + (cols[None, :] + off2) * swn, mask=bmask, other=0.0)
        acc = mma(a, b, acc, INTERP)
        acc2 = mma(a, b2, acc2, INTERP)
    return acc, acc2

@triton.jit
def tile_ids(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    # grouped order of output tiles (L2 reuse of the weight columns); does not touch the arithmetic
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    per_group = GROUP * grid_n
    group = pid // per_group
    first_m = group * GROUP
    size_m = tl.minimum(grid_m - first_m, GROUP)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n

@triton.jit(do_not_specialize=["M"])
def shard_mm(x_ptr, w_ptr, o_ptr, M, N, K, sxs, sxm, sxk, sws, swk, swn, sos, som, son,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, INTERP: tl.constexpr):
    pid_m, pid_n = tile_ids(tl.program_id(0), M, N, BM, BN, GROUP)
    s = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    acc = tile_dot(x_ptr + s * sxs, w_ptr + s * sws, rows, cols, M, N, K, sxm, sxk, swk, swn, BM, BN, BK, INTERP)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(o_ptr + s * sos + rows[:, None] * som + cols[None, :] * son,
             acc.to(o_ptr.dtype.element_ty), mask=mask)

@triton.jit(do_not_specialize=["M"])
def shard_swiglu_mm(x_ptr, w_ptr, o_ptr, M, PER, K, sxs, sxm, sxk, sws, swk, swn, sos, som, son,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                    INTERP: tl.constexpr):
    # w[s] is [K, 2*PER] = [gate | up]; out[s] is [M, PER]
    pid_m, pid_n = tile_ids(tl.program_id(0), M, PER, BM, BN, GROUP)
    s = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    g, u = tile_dot2(x_ptr + s * sxs, w_ptr + s * sws, rows, cols, PER, M, PER, K, sxm, sxk, swk, swn,
                     BM, BN, BK, INTERP)
    # the stored path's rounding: gate/up in the output dtype, SwiGLU in fp32 (as triton_pointwise)
    g = g.to(o_ptr.dtype.element_ty).to(tl.float32)
    u = u.to(o_ptr.dtype.element_ty).to(tl.float32)
    act = g / (1.0 + tl.exp(-g)) * u
    mask = (rows[:, None] < M) & (cols[None, :] < PER)
    tl.store(o_ptr + s * sos + rows[:, None] * som + cols[None, :] * son,
             act.to(o_ptr.dtype.element_ty), mask=mask)

@triton.jit
def pair(x_ptr, w_ptr, s, rows, cols, M, N, K, sxs, sxm, sxk, sws, swk, swn,
         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INTERP: tl.constexpr):
    a = tile_dot(x_ptr + s * sxs, w_ptr + s * sws, rows, cols, M, N, K, sxm, sxk, swk, swn, BM, BN, BK, INTERP)
    b = tile_dot(x_ptr + (s + 1) * sxs, w_ptr + (s + 1) * sws, rows, cols, M, N, K, sxm, sxk, swk, swn, BM, BN, BK, INTERP)
    return a + b

@triton.jit(do_not_specialize=["M"])
def shard_mm_tree(x_ptr, w_ptr, o_ptr, t_ptr, M, N, K, sxs, sxm, sxk, sws, swk, swn,
                  SHARDS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  GROUP: tl.constexpr, INTERP: tl.constexpr):
    # out and scratch are [M, N] fp32, row-major
    pid_m, pid_n = tile_ids(tl.program_id(0), M, N, BM, BN, GROUP)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    where = rows[:, None] * N + cols[None, :]
    if SHARDS == 1:
        total = tile_dot(x_ptr, w_ptr, rows, cols, M, N, K, sxm, sxk, swk, swn, BM, BN, BK, INTERP)
    elif SHARDS == 2:
        total = pair(x_ptr, w_ptr, 0, rows, cols, M, N, K, sxs, sxm, sxk, sws, swk, swn, BM, BN, BK, INTERP)
    elif SHARDS == 4:
        tl.store(o_ptr + where, pair(x_ptr, w_ptr, 0, rows, cols, M, N, K, sxs, sxm, sxk, sws, swk, swn, BM, BN, BK, INTERP), mask=mask)
        p23 = pair(x_ptr, w_ptr, 2, rows, cols, M, N, K, sxs, sxm, sxk, sws, swk, swn, BM, BN, BK, INTERP)
        total = tl.load(o_ptr + where, mask=mask, other=0.0) + p23
    else:
        tl.store(o_ptr + where, pair(x_ptr, w_ptr, 0, rows, cols, M, N, K, sxs, sxm, sxk, sws, swk, swn, BM, BN, BK, INTERP), mask=mask)
        p23 = pair(x_ptr, w_ptr, 2, rows, cols, M, N, K, sxs, sxm, sxk, sws, swk, swn, BM, BN, BK, INTERP)
        tl.store(o_ptr + where, tl.load(o_ptr + where, mask=mask, other=0.0) + p23, mask=mask)
        tl.store(t_ptr + where, pair(x_ptr, w_ptr, 4, rows, cols, M, N, K, sxs, sxm, sxk, sws, swk, swn, BM, BN, BK, INTERP), mask=mask)
        p67 = pair(x_ptr, w_ptr, 6, rows, cols, M, N, K, sxs, sxm, sxk, sws, swk, swn, BM, BN, BK, INTERP)
        p4567 = tl.load(t_ptr + where, mask=mask, other=0.0) + p67
        total = tl.load(o_ptr + where, mask=mask, other=0.0) + p4567
    tl.store(o_ptr + where, total, mask=mask)


@triton.jit
def _pair_done(p, j, o_ptr, t_ptr, where, mask, SHARDS: tl.constexpr):
    """Pair j = (s_2j + s_2j+1) of the tree ((p0+p1)+(p2+p3)): the upper levels wait in fp32
    scratch (``o_ptr`` holds a pending pair, ``t_ptr`` a pending quad) until their partner is done."""
    if SHARDS == 2:
        tl.store(o_ptr + where, p, mask=mask)
    elif SHARDS == 4:
        if j == 0:
            tl.store(o_ptr + where, p, mask=mask)
        else:
            tl.debug_barrier()                  # the pending pair, stored by any thread of the program
            tl.store(o_ptr + where, tl.load(o_ptr + where, mask=mask, other=0.0) + p, mask=mask)
    else:
        if j % 2 == 0:
            tl.store(o_ptr + where, p, mask=mask)
        else:
            tl.debug_barrier()
            quad = tl.load(o_ptr + where, mask=mask, other=0.0) + p
            if j == 1:
                tl.store(t_ptr + where, quad, mask=mask)
            else:
                tl.debug_barrier()
                tl.store(o_ptr + where, tl.load(t_ptr + where, mask=mask, other=0.0) + quad, mask=mask)


@triton.jit(do_not_specialize=["M"])
def shard_mm_tree_flat(x_ptr, w_ptr, o_ptr, t_ptr, M, N, KS, sxs, sxm, sxk, sws, swk, swn,
                       SHARDS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       GROUP: tl.constexpr, INTERP: tl.constexpr):
    """:func:`shard_mm_tree` as one pipelined loop over every shard's K steps (``KS`` a multiple of
    ``BK``): each shard's partial is the same chain of MMA steps from zero as :func:`tile_dot`'s,
    and the partials meet in the same fixed tree, so the bits are the same; the loads run ahead
    across shard boundaries instead of draining the pipeline at each of the 8 shards."""
    pid_m, pid_n = tile_ids(tl.program_id(0), M, N, BM, BN, GROUP)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    where = rows[:, None] * N + cols[None, :]
    steps = KS // BK
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    even = tl.zeros((BM, BN), dtype=tl.float32)
    for i in range(0, SHARDS * steps):
        s = i // steps
        kk = (i - s * steps) * BK + ks
        a = tl.load(x_ptr + s * sxs + rows[:, None] * sxm + kk[None, :] * sxk, mask=rows[:, None] < M, other=0.0)
        b = tl.load(w_ptr + s * sws + kk[:, None] * swk + cols[None, :] * swn, mask=cols[None, :] < N, other=0.0)
        acc = mma(a, b, acc, INTERP)
        if i % steps == steps - 1:              # shard s is complete
            if SHARDS == 1:
                tl.store(o_ptr + where, acc, mask=mask)
            elif s % 2 == 0:
                even = acc
            else:
                _pair_done(even + acc, s // 2, o_ptr, t_ptr, where, mask, SHARDS)
            acc = tl.zeros((BM, BN), dtype=tl.float32)


def _grid(rows, cols, bm, bn, shards):
    return ((-(-rows // bm)) * (-(-cols // bn)), shards)


def _operands(x, w_shards):
    import torch
    shards, inner, cols = w_shards.shape
    if x.dim() == 2:
        x = x.unsqueeze(0).expand(shards, *x.shape)        # shared input: stride 0 over shards
    if x.dtype != torch.bfloat16:
        x = x.to(torch.bfloat16)
    if w_shards.dtype != torch.bfloat16:
        w_shards = w_shards.to(torch.bfloat16)
    return x, w_shards


def shard_matmul(x, w_shards, out_dtype=None, vendor: bool = True):
    """Per-shard products [S, M, N] of ``x`` [M, K] (shared) or [S, M, K] with ``w_shards`` [S, K, N].

    bf16 operands, fp32 accumulation; the result has ``out_dtype`` (default: ``x``'s dtype). With
    ``vendor`` a shared ``x`` of more than :data:`vendor_gemm.MIN_ROWS` rows takes cuBLAS where this
    process certified it gives these bits (:mod:`rlk_kernels.gpu.vendor_gemm`; the result is then a
    [S, M, N] view of an [M, S·N] product).
    """
    import torch

    out_dtype = out_dtype or x.dtype
    if vendor and x.dim() == 2:
        from rlk_kernels.gpu import vendor_gemm
        fast = vendor_gemm.columns(x, w_shards, out_dtype)
        if fast is not None:
            return fast
    x, w = _operands(x, w_shards)
    shards, inner, cols = w.shape
    rows = x.shape[1]
    out = torch.empty(shards, rows, cols, dtype=out_dtype, device=x.device)
    if rows == 0:
        return out
    bm, bn, bk, warps, stages = _config(rows, cols=shards * cols)
    shard_mm[_grid(rows, cols, bm, bn, shards)](
        x, w, out, rows, cols, inner, x.stride(0), x.stride(1), x.stride(2),
        w.stride(0), w.stride(1), w.stride(2), out.stride(0), out.stride(1), out.stride(2),
        BM=bm, BN=bn, BK=bk, GROUP=8, INTERP=interpreting(), num_warps=warps, num_stages=stages)
    return out


def shard_swiglu(x, w_shards, per: int, out_dtype=None, fused: bool | None = None, vendor: bool = True):
    """SwiGLU of the per-shard gate/up products: [S, M, per] from ``x`` [M, K] and ``w_shards``
    [S, K, 2*per] (``[gate | up]`` columns). ``fused`` None: the fused kernel above
    :data:`SMALL_ROWS` rows, or with ``vendor`` the certified cuBLAS gate/up product and the
    element-wise SwiGLU kernel (all give the same bits)."""
    import torch

    out_dtype = out_dtype or x.dtype
    rows = x.shape[-2]
    if fused is None:
        fused = rows > SMALL_ROWS
    if vendor and fused and x.dim() == 2:
        from rlk_kernels.gpu import vendor_gemm
        from rlk_kernels.gpu.triton_pointwise import swiglu
        gate_up = vendor_gemm.columns(x, w_shards, out_dtype)            # [S, M, 2*per] view of [M, S, 2*per]
        if gate_up is not None:
            return swiglu(gate_up.permute(1, 0, 2), per).permute(1, 0, 2)
    if not fused:
        from rlk_kernels.gpu.triton_pointwise import swiglu
        return swiglu(shard_matmul(x, w_shards, out_dtype=out_dtype, vendor=vendor), per)
    x, w = _operands(x, w_shards)
    shards, inner, cols = w.shape
    if cols != 2 * per:
        raise ValueError(f"gate/up weights need 2*per = {2 * per} columns, got {cols}")
    out = torch.empty(shards, rows, per, dtype=out_dtype, device=x.device)
    if rows == 0:
        return out
    bm, bn, bk, warps, stages = LARGE_SWIGLU
    shard_swiglu_mm[_grid(rows, per, bm, bn, shards)](
        x, w, out, rows, per, inner, x.stride(0), x.stride(1), x.stride(2),
        w.stride(0), w.stride(1), w.stride(2), out.stride(0), out.stride(1), out.stride(2),
        BM=bm, BN=bn, BK=bk, GROUP=8, INTERP=interpreting(), num_warps=warps, num_stages=stages,
        enable_fp_fusion=False)
    return out


@triton.jit(do_not_specialize=["n"])
def _tree_kernel(p_ptr, o_ptr, r_ptr, n, SHARDS: tl.constexpr, BLOCK: tl.constexpr, RESIDUAL: tl.constexpr):
    # the partials [SHARDS, n] (fp32) added in the fixed tree ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)) (one
    # partial: itself):
    # element-wise, so the same fp32 additions as one torch add per tree level. With RESIDUAL the
    # sum is rounded to the residual's dtype and added to it in fp32, rounded once more: the bits of
    # ``residual + tree.to(residual.dtype)`` in eager torch, in one pass instead of three
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    a = tl.load(p_ptr + i, mask=ok, other=0.0)
    if SHARDS >= 2:
        a = a + tl.load(p_ptr + n + i, mask=ok, other=0.0)
    if SHARDS >= 4:
        a = a + (tl.load(p_ptr + 2 * n + i, mask=ok, other=0.0) + tl.load(p_ptr + 3 * n + i, mask=ok, other=0.0))
    if SHARDS == 8:
        b = tl.load(p_ptr + 4 * n + i, mask=ok, other=0.0) + tl.load(p_ptr + 5 * n + i, mask=ok, other=0.0)
        b = b + (tl.load(p_ptr + 6 * n + i, mask=ok, other=0.0) + tl.load(p_ptr + 7 * n + i, mask=ok, other=0.0))
        a = a + b
    if RESIDUAL:
        res = tl.load(r_ptr + i, mask=ok, other=0.0)
        a = (res.to(tl.float32) + a.to(res.dtype).to(tl.float32)).to(o_ptr.dtype.element_ty)
    tl.store(o_ptr + i, a, mask=ok)


def tree_reduce_shards(partials, residual=None):
    """Fixed pairwise tree over dim 0 (1, 2, 4 or 8 fp32 partials): one kernel for the whole tree
    (the same additions as one element-wise add per tree level; a decode step saves 2 launches
    per row-parallel product). ``residual`` (the shape of one partial): returns
    ``residual + tree.to(residual.dtype)`` with the bits of those eager ops, in the same kernel
    (one pass instead of a cast and an add, also for a single partial)."""
    import torch

    shards = partials.shape[0]
    fused = residual is not None and shards in (1, 2, 4, 8) and partials.dtype == torch.float32 \
        and residual.dtype in (torch.bfloat16, torch.float16) and tuple(residual.shape) == tuple(partials.shape[1:])
    if residual is not None and not fused:
        return residual + tree_reduce_shards(partials).to(residual.dtype)
    if shards == 1 and not fused:
        return partials[0]
    if not fused and (shards not in (2, 4, 8) or partials.dtype != torch.float32):
        while partials.shape[0] > 1:
            partials = partials[0::2] + partials[1::2]
        return partials[0]
    flat = partials.contiguous()
    res = residual.contiguous() if fused else flat
    out = torch.empty(flat.shape[1:], dtype=residual.dtype if fused else torch.float32, device=flat.device)
    n = out.numel()
    if n:
        _tree_kernel[(-(-n // TREE_BLOCK),)](flat, out, res, n, SHARDS=shards, BLOCK=TREE_BLOCK, RESIDUAL=fused,
                                             num_warps=4, enable_fp_fusion=False)
    return out


def shard_matmul_tree(x, w_shards, *, flat: bool | None = None, config=None, vendor: bool = True, residual=None):
    """fp32 ``tree_s(x[s] @ w[s])`` [M, N] for ``x`` [S, M, K] and ``w_shards`` [S, K, N], S in 1, 2, 4, 8.
    Above :data:`SMALL_ROWS` rows ``flat`` (default :data:`FLAT_TREE`) takes the one-loop kernel
    where ``BK`` divides K (``config``: its launch, default :data:`FLAT_TREE_CONFIG`). With ``vendor``
    (and not ``flat``) the per-shard partials come from cuBLAS where this process certified them
    equal to the strict kernel's (:func:`vendor_gemm.partials`), reduced by :func:`tree_reduce_shards`.
    Every choice gives the same bits. ``residual`` [M, N] (bf16): returns ``residual +
    tree.to(bf16)`` (the same bits as those eager ops; fused into the tree kernel where it runs)."""
    import torch

    x, w = _operands(x, w_shards)
    shards, inner, cols = w.shape
    if shards not in (1, 2, 4, 8):
        raise ValueError(f"the shard tree needs 1, 2, 4 or 8 shards, got {shards}")
    rows = x.shape[1]
    if vendor and not flat:
        from rlk_kernels.gpu import vendor_gemm
        parts = vendor_gemm.partials(x, w)                                # certified cuBLAS partials
        if parts is not None:
            return tree_reduce_shards(parts, residual)
    if rows <= SMALL_ROWS:
        return tree_reduce_shards(shard_matmul(x, w, out_dtype=torch.float32), residual)
    if residual is not None:
        return residual + shard_matmul_tree(x, w, flat=flat, config=config, vendor=vendor).to(residual.dtype)
    flat = FLAT_TREE if flat is None else flat
    bm, bn, bk, warps, stages = (config or FLAT_TREE_CONFIG) if flat else _config(rows, tree=True)
    out = torch.empty(rows, cols, dtype=torch.float32, device=x.device)
    scratch = torch.empty_like(out) if shards == 8 else out
    if flat and inner % bk == 0:
        shard_mm_tree_flat[_grid(rows, cols, bm, bn, 1)](
            x, w, out, scratch, rows, cols, inner, x.stride(0), x.stride(1), x.stride(2),
            w.stride(0), w.stride(1), w.stride(2),
            SHARDS=shards, BM=bm, BN=bn, BK=bk, GROUP=8, INTERP=interpreting(), num_warps=warps, num_stages=stages)
        return out
    bm, bn, bk, warps, stages = _config(rows, tree=True)
    shard_mm_tree[_grid(rows, cols, bm, bn, 1)](
        x, w, out, scratch, rows, cols, inner, x.stride(0), x.stride(1), x.stride(2),
        w.stride(0), w.stride(1), w.stride(2),
        SHARDS=shards, BM=bm, BN=bn, BK=bk, GROUP=8, INTERP=interpreting(), num_warps=warps, num_stages=stages)
    return out
