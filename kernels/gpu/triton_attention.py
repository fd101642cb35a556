"""Strict causal attention: fixed key blocks over global positions, fixed key splits merged in order.

A query at global position p attends keys 0..p. Keys are cut into splits of ``SPLIT`` positions
(0..SPLIT-1, SPLIT..2·SPLIT-1, ...) and each split into blocks of ``BLOCK_N``; inside a split an
online softmax runs over its blocks in order, starting from (m=-inf, l=0, acc=0); the splits'
(m, l, acc) are then merged in split order. A block or split after p leaves a query's state
untouched (selected with ``where``, not recomputed), so a query's bits do not depend on the other
queries of its tile, on the batch, on prefill against decode, or on the CP placement.

Rows of a tile are (query, head of the KV group) pairs: ``BLOCK_M`` rows = ``BLOCK_M / rep``
queries of all ``rep`` heads sharing one KV head. Two launches with the same per-row arithmetic:

- prefill (more than one row tile): one program per row tile walks every key block and, at each
  split's last block, merges the split into its running state in registers (:data:`PREFILL`:
  128-row tiles, two warp groups of 64 rows); row tiles start last-first (:data:`HEAVY_FIRST`),
  since under the causal mask the last tiles walk the most keys;
- decode (one row tile per sequence and KV head): one program per split writes the split's
  (m, l, acc) in fp32, and a second kernel merges them in split order with the same merge code
  (:data:`DECODE`: 64-row tiles, one warp group; the merge takes the real rows only). Over one
  split the split's program runs that merge itself and writes the output (:data:`ONE_SPLIT`).

What a row's bits depend on is the same in both: the score of a (row, key) pair is one 64-row
warp-group MMA chained over the head dimension in k16 steps, the key blocks (``BLOCK_N``) and the
splits (``SPLIT``) are fixed over global positions, the online softmax runs over a block's
``BLOCK_N`` columns held by one warp group, and the splits are merged in split order. Tile
height, warps per program, pipeline depth, launch order and the merge's row block only change
how many rows share a program and how work is scheduled. A block whose keys every row of the tile may
see is stepped without masks (:data:`FAST`): there the masks select every value, so the bits are
the same (the benchmark checks all of this byte for byte on the GPU).

Example (``TRITON_INTERPRET=1`` on a CPU)::

    >>> import torch
    >>> q = torch.randn(1, 4, 3, 128); k = v = torch.randn(1, 2, 3, 128)
    >>> out = attention(q, k, v, torch.arange(3).view(1, 3))      # doctest: +SKIP
    >>> out.shape
    torch.Size([1, 4, 3, 128])
"""

from __future__ import annotations

import triton
import triton.language as tl

from rlk_kernels.gpu.common import interpreting, mma

BLOCK_N = 64                 # keys per block: fixed (the online-softmax and P.V granularity). 128
                             # (FlashAttention's Hopper block; a different canonical schedule) was
                             # measured on the H200: prefill layer within the CI of 64, decode slower
                             # (batch 64, 7k KV: core 960 against 644 us), so 64 stays
SPLIT = 1024                 # keys per split: fixed over global positions (the H200 sweep of 256 /
                             # 512 / 1024: 1024 is the fastest for prefill and batch-64 decode and
                             # keeps batch-1 decode within the goal)
# (BLOCK_M, num_warps, num_stages) per launch; BLOCK_M / num_warps = 16 keeps 64-row warp groups.
# A pipeline too deep for shared memory falls back to fewer stages (same bits: scheduling only).
PREFILL = (128, 8, 3)
DECODE = (64, 4, 3)
BLOCK_M = DECODE[0]          # the row tile that decides prefill (more than one tile) against decode
FAST = True                  # unmasked steps for blocks every row of the tile sees (same bits)
HEAVY_FIRST = True           # prefill: launch the row tiles with the most keys first (same bits)
TMA = False                  # prefill: unmasked blocks through tensor descriptors on Hopper (same bits;
                             # slower on the H200: 1941 against 1778 us at 8192 tokens)
ONE_SPLIT = True             # decode over one split (at most SPLIT keys): the split kernel writes the
                             # output, no partials and no merge launch (same bits; see the kernel)
COMBINE_ROWS = 16            # decode: most rows per program of the split merge (same bits)
DV_PARTS = 8                 # decode with few split programs: programs sharing one split's value
DV_FEW_PROGRAMS = 24         # columns (same bits: each recomputes the split's scores and accumulates
                             # its columns) where at most DV_FEW_PROGRAMS (sequence x KV head x split)
                             # programs would run. H100 sweep, batch 1: 2k keys (24 programs) 37.2 ->
                             # 31.8 us with 8 parts; 7k keys (64) 38.8 -> 38.0 with 2, slower with
                             # more; batch 8 (192) slower with any

@triton.jit
def _block(q, kb, vb, dims, vdims, pos, start, Lk, m, l, acc, skn, skd, svn, svd,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, INTERP: tl.constexpr,
           TMA: tl.constexpr = False):
    """One key block's online-softmax step. ``MASKED`` False is for a block whose keys every row of
    the tile may see (below every row's position and inside the cache): there the masks select
    every value, so leaving them out gives the same bits with less work. ``TMA``: ``kb``/``vb`` are
    tensor descriptors (the copy engine loads the same values). ``vdims``: the value columns this
    program accumulates (all of ``dims``, or one part of them: a column's sum over the keys is the
    same chain of MMA steps whatever the other columns)."""
    kpos = start + tl.arange(0, BLOCK_N)
    if MASKED:
        kmask = kpos < Lk
        k = tl.load(kb + kpos[:, None] * skn + dims[None, :] * skd, mask=kmask[:, None], other=0.0)
        scores = mma(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), INTERP)
        valid = (kpos[None, :] <= pos[:, None]) & kmask[None, :]
        scores = tl.where(valid, scores, float("-inf"))
        active = start <= pos
        m_new = tl.where(active, tl.maximum(m, tl.max(scores, 1)), m)
        p = tl.where(valid, tl.exp(scores - m_new[:, None]), 0.0)
        alpha = tl.where(active, tl.exp(m - m_new), 1.0)
        v = tl.load(vb + kpos[:, None] * svn + vdims[None, :] * svd, mask=kmask[:, None], other=0.0)
        acc_new = mma(p, v, acc * alpha[:, None], INTERP)
        l = tl.where(active, l * alpha + tl.sum(p, 1), l)
        acc = tl.where(active[:, None], acc_new, acc)
    else:
        if TMA:
            k = kb.load([start, 0])
        else:
            k = tl.load(kb + kpos[:, None] * skn + dims[None, :] * skd)
        scores = mma(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), INTERP)
        m_new = tl.maximum(m, tl.max(scores, 1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        if TMA:
            v = vb.load([start, 0])
        else:
            v = tl.load(vb + kpos[:, None] * svn + vdims[None, :] * svd)
        acc = mma(p, v, acc * alpha[:, None], INTERP)
        l = l * alpha + tl.sum(p, 1)
    return m_new, l, acc


@triton.jit
def _merge(M, L, ACC, m, l, acc, active):
    """Fold one split's (m, l, acc) into the running state (rows where ``active``)."""
    m_new = tl.maximum(M, m)
    a = tl.exp(M - m_new)
    b = tl.exp(m - m_new)
    L2 = L * a + l * b
    ACC2 = ACC * a[:, None] + acc * b[:, None]
    return tl.where(active, m_new, M), tl.where(active, L2, L), tl.where(active[:, None], ACC2, ACC)


@triton.jit
def _prefill_step(q, kb, vb, dims, pos, start, top, Lk, M, L, ACC, m, l, acc, skn, skd, svn, svd,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr,
                  MASKED: tl.constexpr, INTERP: tl.constexpr, TMA: tl.constexpr):
    """One key block of the prefill walk; at a split's last block the split's state is merged into
    the running (M, L, ACC) and the next split starts fresh."""
    m, l, acc = _block(q, kb, vb, dims, dims, pos, start, Lk, m, l, acc, skn, skd, svn, svd,
                       BLOCK_M, BLOCK_N, MASKED, INTERP, TMA)
    split_first = start - start % SPLIT
    if (start + BLOCK_N == split_first + SPLIT) | (start + BLOCK_N >= top):
        M, L, ACC = _merge(M, L, ACC, m, l, acc, split_first <= pos)
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, D), tl.float32)
    return M, L, ACC, m, l, acc


@triton.jit
def _rows(pid_r, Lq, REP: tl.constexpr, BLOCK_M: tl.constexpr):
    r = pid_r * BLOCK_M + tl.arange(0, BLOCK_M)
    return r, r < Lq * REP, r // REP, r % REP


@triton.jit(do_not_specialize=["Lq", "Lk", "n_splits", "n_tiles"])
def _attn_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, pm_ptr, pl_ptr, pacc_ptr,
                 Lq, Lk, HKV, n_splits, n_tiles,
                 sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod,
                 REP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                 SPLIT: tl.constexpr, PER_SPLIT: tl.constexpr, FAST: tl.constexpr,
                 HEAVY_FIRST: tl.constexpr, INTERP: tl.constexpr, TMA: tl.constexpr = False,
                 DV_PARTS: tl.constexpr = 1, ONE_SPLIT: tl.constexpr = False):
    if PER_SPLIT:                            # grid (row tile, sequence x KV head, split group)
        pid_r = tl.program_id(0)
        bg = tl.program_id(1)
    else:                                    # grid (sequence x KV head, row tile)
        bg = tl.program_id(0)
        pid_r = tl.program_id(1)
        if HEAVY_FIRST:
            pid_r = n_tiles - 1 - pid_r
    b = bg // HKV
    g = bg % HKV
    r, row_ok, qi, hh = _rows(pid_r, Lq, REP, BLOCK_M)
    head = g * REP + hh
    pos = tl.load(pos_ptr + b * Lq + qi, mask=row_ok, other=-1)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + b * sqb + head[:, None] * sqh + qi[:, None] * sqn + dims[None, :] * sqd,
                mask=row_ok[:, None], other=0.0)
    kb = k_ptr + b * skb + g * skh
    vb = v_ptr + b * svb + g * svh
    top = tl.max(pos, 0) + 1                 # keys any row of the tile sees: 0 .. top-1
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)         # the current split's state
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    if PER_SPLIT:
        # decode: this program's split, every block masked (a decode tile's rows see all but its
        # last block; unmasked steps did not pay on the H200). With DV_PARTS > 1 the split's value
        # columns are shared out over DV_PARTS programs: each computes the same scores and softmax
        # state (the same instructions on the same keys) and accumulates its part of the columns
        s = tl.program_id(2) // DV_PARTS
        part = tl.program_id(2) % DV_PARTS
        vdims = part * (D // DV_PARTS) + tl.arange(0, D // DV_PARTS)
        acc_part = tl.zeros((BLOCK_M, D // DV_PARTS), tl.float32)
        for start in range(s * SPLIT, tl.minimum(s * SPLIT + SPLIT, top), BLOCK_N):
            m, l, acc_part = _block(q, kb, vb, dims, vdims, pos, start, Lk, m, l, acc_part, skn, skd, svn, svd,
                                    BLOCK_M, BLOCK_N, True, INTERP)
        if ONE_SPLIT:
            # the only split: the program merges it into the empty state itself, with the merge
            # kernel's code, and writes the output (the merge kernel's bits, no partials, one launch)
            M, L, ACC = _merge(tl.full((BLOCK_M,), float("-inf"), tl.float32), tl.zeros((BLOCK_M,), tl.float32),
                               tl.zeros((BLOCK_M, D // DV_PARTS), tl.float32), m, l, acc_part, (0 <= pos) & row_ok)
            tl.store(o_ptr + b * sob + head[:, None] * soh + qi[:, None] * son + vdims[None, :] * sod,
                     (ACC / L[:, None]).to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
        else:
            at = (bg * n_splits + s) * (Lq * REP) + r
            tl.store(pm_ptr + at, m, mask=row_ok)            # every part holds the same (m, l)
            tl.store(pl_ptr + at, l, mask=row_ok)
            tl.store(pacc_ptr + at[:, None] * D + vdims[None, :], acc_part, mask=row_ok[:, None])
    else:
        fast_end = 0
        if FAST:                             # keys 0 .. low-1 are seen by every row of the tile
            low = tl.min(tl.where(row_ok, pos, 1 << 30), 0) + 1
            fast_end = tl.minimum(tl.minimum(low, Lk) // BLOCK_N * BLOCK_N, top)
        M = tl.full((BLOCK_M,), float("-inf"), tl.float32)     # the merged state
        L = tl.zeros((BLOCK_M,), tl.float32)
        ACC = tl.zeros((BLOCK_M, D), tl.float32)
        kd = kb
        vd = vb
        if TMA:                              # unmasked blocks through the copy engine
            kd = tl.make_tensor_descriptor(kb, shape=[Lk, D], strides=[skn, 1], block_shape=[BLOCK_N, D])
            vd = tl.make_tensor_descriptor(vb, shape=[Lk, D], strides=[svn, 1], block_shape=[BLOCK_N, D])
        # two loops over the blocks in order: unmasked, then masked
        for start in range(0, fast_end, BLOCK_N):
            M, L, ACC, m, l, acc = _prefill_step(q, kd, vd, dims, pos, start, top, Lk, M, L, ACC, m, l, acc,
                                                 skn, skd, svn, svd, BLOCK_M, BLOCK_N, D, SPLIT, False, INTERP, TMA)
        for start in range(fast_end, top, BLOCK_N):
            M, L, ACC, m, l, acc = _prefill_step(q, kb, vb, dims, pos, start, top, Lk, M, L, ACC, m, l, acc,
                                                 skn, skd, svn, svd, BLOCK_M, BLOCK_N, D, SPLIT, True, INTERP, False)
        out = ACC / L[:, None]
        tl.store(o_ptr + b * sob + head[:, None] * soh + qi[:, None] * son + dims[None, :] * sod,
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit(do_not_specialize=["Lq", "n_splits"])
def _combine_kernel(pos_ptr, o_ptr, pm_ptr, pl_ptr, pacc_ptr, Lq, HKV, n_splits, sob, soh, son, sod,
                    REP: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr):
    # the merge has no MMA, so its row block is the real rows only (a decode step has REP rows per
    # KV head, not the 64 of the split kernel's tile)
    pid_r = tl.program_id(0)
    bg = tl.program_id(1)
    b = bg // HKV
    g = bg % HKV
    r, row_ok, qi, hh = _rows(pid_r, Lq, REP, ROWS)
    head = g * REP + hh
    pos = tl.load(pos_ptr + b * Lq + qi, mask=row_ok, other=-1)
    dims = tl.arange(0, D)
    M = tl.full((ROWS,), float("-inf"), tl.float32)
    L = tl.zeros((ROWS,), tl.float32)
    ACC = tl.zeros((ROWS, D), tl.float32)
    for s in range(0, n_splits):
        active = (s * SPLIT <= pos) & row_ok
        base = (bg * n_splits + s) * (Lq * REP) + r
        m = tl.load(pm_ptr + base, mask=active, other=float("-inf"))
        l = tl.load(pl_ptr + base, mask=active, other=0.0)
        acc = tl.load(pacc_ptr + base[:, None] * D + dims[None, :], mask=active[:, None], other=0.0)
        M, L, ACC = _merge(M, L, ACC, m, l, acc, active)
    out = ACC / L[:, None]
    tl.store(o_ptr + b * sob + head[:, None] * soh + qi[:, None] * son + dims[None, :] * sod,
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


_STAGES = {}                 # (launch constants, asked stages) -> the stages that fit shared memory
LAST_KERNEL = None           # the attention kernel launched last (the benchmark reads its registers)


def _launch(grid, stages, *args, **consts):
    """Launch the attention kernel with ``stages`` pipeline stages, or fewer where that many do not
    fit the GPU's shared memory (the stage count schedules loads; it changes no bit)."""
    from triton.runtime.errors import OutOfResources
    global LAST_KERNEL

    key = (tuple(sorted(consts.items())), stages)
    fit = _STAGES.get(key, stages)
    while True:
        try:
            LAST_KERNEL = _attn_kernel[grid](*args, num_stages=fit, **consts)
            _STAGES[key] = fit
            return
        except OutOfResources:
            if fit <= 1:
                raise
            fit -= 1


def _tma_ok(k, v) -> bool:
    """Tensor descriptors need Hopper or later, unit-stride rows and 16-byte aligned row strides."""
    import torch

    if not (TMA and k.is_cuda and torch.cuda.get_device_capability(k.device)[0] >= 9):
        return False
    return not any(t.stride(3) != 1 or (t.stride(2) * t.element_size()) % 16 or t.data_ptr() % 16 for t in (k, v))


def _set_scratch_allocator():
    """Descriptors made inside a kernel need a global scratch buffer from the launcher."""
    import torch

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, device="cuda", dtype=torch.int8)

    triton.set_allocator(alloc)


def attention(q, k, v, q_pos, *, out_dtype=None, per_split: bool | None = None, prefill=None, decode=None,
              fast: bool | None = None, heavy_first: bool | None = None, combine_rows: int | None = None,
              tma: bool | None = None, dv_parts: int | None = None, one_split: bool | None = None):
    """Causal attention of ``q`` [B, Hq, Lq, D] (already scaled) at positions ``q_pos`` [B, Lq] over
    ``k``/``v`` [B, Hkv, Lk, D] holding key positions 0..Lk-1. ``per_split`` None: decode launch when
    every sequence's rows fit one decode tile, prefill launch otherwise (both give the same bits).
    Scheduling overrides, none of which changes a bit (the benchmark's sweep): ``prefill`` /
    ``decode`` (BLOCK_M, warps, stages) for :data:`PREFILL` / :data:`DECODE`, ``fast`` for
    :data:`FAST`, ``heavy_first`` for :data:`HEAVY_FIRST`, ``combine_rows`` for :data:`COMBINE_ROWS`,
    ``tma`` for :data:`TMA` (used where the GPU and the strides allow it), ``dv_parts`` for
    :data:`DV_PARTS` (1, 2, 4 or 8, leaving at least 16 value columns a program; by default
    :data:`DV_PARTS` where at most :data:`DV_FEW_PROGRAMS` split programs would run, else 1), ``one_split`` for
    :data:`ONE_SPLIT`."""
    import torch

    batch, heads, lq, dim = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    rep = heads // hkv
    out_dtype = out_dtype or q.dtype
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    pos = q_pos.to(torch.int32).contiguous()
    out = torch.empty(batch, heads, lq, dim, dtype=out_dtype, device=q.device)
    n_splits = max(1, -(-lk // SPLIT))
    dec_m, dec_warps, dec_stages = decode or DECODE
    if per_split is None:
        per_split = lq * rep <= dec_m
    strides = (*q.stride(), *k.stride(), *v.stride(), *out.stride())
    consts = dict(REP=rep, BLOCK_N=BLOCK_N, D=dim, SPLIT=SPLIT, INTERP=interpreting(),
                  FAST=FAST if fast is None else fast, enable_fp_fusion=False)
    if not per_split:
        bm, warps, stages = prefill or PREFILL
        row_tiles = -(-lq * rep // bm)
        use_tma = _tma_ok(k, v) if tma is None else tma
        if use_tma and k.is_cuda:
            _set_scratch_allocator()
        _launch((batch * hkv, row_tiles, 1), stages,
                 q, k, v, pos, out, out, out, out, lq, lk, hkv, n_splits, row_tiles, *strides,
                 PER_SPLIT=False, HEAVY_FIRST=HEAVY_FIRST if heavy_first is None else heavy_first,
                 BLOCK_M=bm, num_warps=warps, TMA=use_tma, **consts)
        return out
    if dv_parts is None:
        dv_parts = DV_PARTS if batch * hkv * n_splits * -(-lq * rep // dec_m) <= DV_FEW_PROGRAMS else 1
        while dv_parts > 1 and (dim % dv_parts or dim // dv_parts < 16):
            dv_parts //= 2
    parts = dv_parts
    if parts not in (1, 2, 4, 8) or parts > 1 and (dim % parts or dim // parts < 16):
        raise ValueError(f"dv_parts must be 1, 2, 4 or 8 and leave at least 16 of the {dim} value columns "
                         f"a program, got {parts}")
    row_tiles = -(-lq * rep // dec_m)
    rows = lq * rep
    one_split = n_splits == 1 and (ONE_SPLIT if one_split is None else one_split)
    partials = 1 if one_split else batch * hkv * n_splits * rows
    pm = torch.empty(partials, dtype=torch.float32, device=q.device)
    pl = torch.empty_like(pm)
    pacc = torch.empty(partials, dim, dtype=torch.float32, device=q.device)
    _launch((row_tiles, batch * hkv, n_splits * parts), dec_stages,
            q, k, v, pos, out, pm, pl, pacc, lq, lk, hkv, n_splits, row_tiles, *strides,
            PER_SPLIT=True, HEAVY_FIRST=False, BLOCK_M=dec_m, num_warps=dec_warps, DV_PARTS=parts,
            ONE_SPLIT=one_split, **consts)
    if one_split:
        return out
    combine_rows = combine_rows or min(COMBINE_ROWS, triton.next_power_of_2(rows))
    _combine_kernel[(-(-rows // combine_rows), batch * hkv)](
        pos, out, pm, pl, pacc, lq, hkv, n_splits, *out.stride(), REP=rep, ROWS=combine_rows, D=dim,
        SPLIT=SPLIT, num_warps=4, enable_fp_fusion=False)
    return out
