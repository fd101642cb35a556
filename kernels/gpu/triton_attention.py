"""Strict causal attention: fixed key blocks over global positions, fixed key splits merged in order.

A query at global position p attends keys 0..p. Keys are cut into splits of ``SPLIT`` positions
(0..SPLIT-1, SPLIT..2·SPLIT-1, ...) and each split into blocks of ``BLOCK_N``; inside a split an
online softmax runs over its blocks in order, starting from (m=-inf, l=0, acc=0); the splits'
(m, l, acc) are then merged in split order. A block or split after p leaves a query's state
untouched (selected with ``where``, not recomputed), so a query's bits do not depend on the other
queries of its tile, on the batch, on prefill against decode, or on the CP placement.

Rows of a tile are (query, head of the KV group) pairs: ``BLOCK_M`` rows = ``BLOCK_M / rep``
queries of all ``rep`` heads sharing one KV head. Two launches with the same per-row arithmetic:

- prefill (more than one row tile): one program per row tile walks every split and merges it in
  registers (:data:`PREFILL`: 128-row tiles, two warp groups of 64 rows);
- decode (one row tile per sequence and KV head): one program per split writes the split's
  (m, l, acc) in fp32, and a second kernel merges them in split order with the same merge code
  (:data:`DECODE`: 64-row tiles, one warp group).

What a row's bits depend on is the same in both: the score of a (row, key) pair is one 64-row
warp-group MMA chained over the head dimension in k16 steps, the key blocks (``BLOCK_N``) and the
splits (``SPLIT``) are fixed over global positions, the online softmax runs over a block's
``BLOCK_N`` columns held by one warp group, and the splits are merged in split order. Tile
height, warps per program and pipeline depth only change how many rows share a program and how
loads are scheduled (the benchmark checks prefill against decode byte for byte on the GPU).

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

BLOCK_N = 64                 # keys per block: fixed (the online-softmax and P.V granularity)
SPLIT = 256                  # keys per split: fixed over global positions
# (BLOCK_M, num_warps, num_stages) per launch; BLOCK_M / num_warps = 16 keeps 64-row warp groups
PREFILL = (128, 8, 3)
FLAT = True                  # prefill: one loop over key blocks (False: a loop per split; same bits)
DECODE = (64, 4, 3)
BLOCK_M = DECODE[0]          # the row tile that decides prefill (more than one tile) against decode


@triton.jit
def _split_state(q, k_ptr, v_ptr, pos, first, last, Lk, skn, skd, svn, svd,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, INTERP: tl.constexpr):
    """Online softmax over key blocks first, first+BLOCK_N, ... < last (in order)."""
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    dims = tl.arange(0, D)
    for start in range(first, last, BLOCK_N):
        kpos = start + tl.arange(0, BLOCK_N)
        kmask = kpos < Lk
        k = tl.load(k_ptr + kpos[:, None] * skn + dims[None, :] * skd, mask=kmask[:, None], other=0.0)
        scores = mma(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), INTERP)
        valid = (kpos[None, :] <= pos[:, None]) & kmask[None, :]
        scores = tl.where(valid, scores, float("-inf"))
        active = start <= pos
        m_new = tl.where(active, tl.maximum(m, tl.max(scores, 1)), m)
        p = tl.where(valid, tl.exp(scores - m_new[:, None]), 0.0)
        alpha = tl.where(active, tl.exp(m - m_new), 1.0)
        v = tl.load(v_ptr + kpos[:, None] * svn + dims[None, :] * svd, mask=kmask[:, None], other=0.0)
        acc_new = mma(p, v, acc * alpha[:, None], INTERP)
        l = tl.where(active, l * alpha + tl.sum(p, 1), l)
        acc = tl.where(active[:, None], acc_new, acc)
        m = m_new
    return m, l, acc


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
def _rows(pid_r, Lq, REP: tl.constexpr, BLOCK_M: tl.constexpr):
    r = pid_r * BLOCK_M + tl.arange(0, BLOCK_M)
    return r, r < Lq * REP, r // REP, r % REP


@triton.jit(do_not_specialize=["Lq", "Lk", "n_splits"])
def _attn_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, pm_ptr, pl_ptr, pacc_ptr,
                 Lq, Lk, HKV, n_splits,
                 sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod,
                 REP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                 SPLIT: tl.constexpr, PER_SPLIT: tl.constexpr, INTERP: tl.constexpr, FLAT: tl.constexpr = True):
    pid_r = tl.program_id(0)
    bg = tl.program_id(1)
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
    if PER_SPLIT:
        s = tl.program_id(2)
        first = s * SPLIT
        last = tl.minimum(first + SPLIT, tl.max(pos, 0) + 1)
        m, l, acc = _split_state(q, kb, vb, pos, first, last, Lk, skn, skd, svn, svd, BLOCK_M, BLOCK_N, D, INTERP)
        base = (bg * n_splits + s) * (Lq * REP) + r
        tl.store(pm_ptr + base, m, mask=row_ok)
        tl.store(pl_ptr + base, l, mask=row_ok)
        tl.store(pacc_ptr + base[:, None] * D + dims[None, :], acc, mask=row_ok[:, None])
    elif FLAT:
        # one loop over every key block (pipelined across split boundaries): the block update of
        # _split_state, and at a split's last block the merge of _merge followed by a fresh split
        # state, selected with ``where`` -- the same operations on the same values as the nested form
        top = tl.max(pos, 0) + 1
        M = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        L = tl.zeros((BLOCK_M,), tl.float32)
        ACC = tl.zeros((BLOCK_M, D), tl.float32)
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, D), tl.float32)
        for start in range(0, top, BLOCK_N):
            kpos = start + tl.arange(0, BLOCK_N)
            kmask = kpos < Lk
            k = tl.load(kb + kpos[:, None] * skn + dims[None, :] * skd, mask=kmask[:, None], other=0.0)
            scores = mma(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), INTERP)
            valid = (kpos[None, :] <= pos[:, None]) & kmask[None, :]
            scores = tl.where(valid, scores, float("-inf"))
            active = start <= pos
            m_new = tl.where(active, tl.maximum(m, tl.max(scores, 1)), m)
            pr = tl.where(valid, tl.exp(scores - m_new[:, None]), 0.0)
            alpha = tl.where(active, tl.exp(m - m_new), 1.0)
            v = tl.load(vb + kpos[:, None] * svn + dims[None, :] * svd, mask=kmask[:, None], other=0.0)
            acc_new = mma(pr, v, acc * alpha[:, None], INTERP)
            l = tl.where(active, l * alpha + tl.sum(pr, 1), l)
            acc = tl.where(active[:, None], acc_new, acc)
            m = m_new
            split_first = start - start % SPLIT
            if (start + BLOCK_N == split_first + SPLIT) | (start + BLOCK_N >= top):
                M, L, ACC = _merge(M, L, ACC, m, l, acc, split_first <= pos)
                m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
                l = tl.zeros((BLOCK_M,), tl.float32)
                acc = tl.zeros((BLOCK_M, D), tl.float32)
        out = ACC / L[:, None]
        tl.store(o_ptr + b * sob + head[:, None] * soh + qi[:, None] * son + dims[None, :] * sod,
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        top = tl.max(pos, 0) + 1
        M = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        L = tl.zeros((BLOCK_M,), tl.float32)
        ACC = tl.zeros((BLOCK_M, D), tl.float32)
        for first in range(0, top, SPLIT):
            last = tl.minimum(first + SPLIT, top)
            m, l, acc = _split_state(q, kb, vb, pos, first, last, Lk, skn, skd, svn, svd, BLOCK_M, BLOCK_N, D, INTERP)
            M, L, ACC = _merge(M, L, ACC, m, l, acc, first <= pos)
        out = ACC / L[:, None]
        tl.store(o_ptr + b * sob + head[:, None] * soh + qi[:, None] * son + dims[None, :] * sod,
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit(do_not_specialize=["Lq", "n_splits"])
def _combine_kernel(pos_ptr, o_ptr, pm_ptr, pl_ptr, pacc_ptr, Lq, HKV, n_splits, sob, soh, son, sod,
                    REP: tl.constexpr, BLOCK_M: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr):
    pid_r = tl.program_id(0)
    bg = tl.program_id(1)
    b = bg // HKV
    g = bg % HKV
    r, row_ok, qi, hh = _rows(pid_r, Lq, REP, BLOCK_M)
    head = g * REP + hh
    pos = tl.load(pos_ptr + b * Lq + qi, mask=row_ok, other=-1)
    dims = tl.arange(0, D)
    M = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    L = tl.zeros((BLOCK_M,), tl.float32)
    ACC = tl.zeros((BLOCK_M, D), tl.float32)
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


def attention(q, k, v, q_pos, *, out_dtype=None, per_split: bool | None = None, prefill=None, decode=None,
              flat: bool | None = None):
    """Causal attention of ``q`` [B, Hq, Lq, D] (already scaled) at positions ``q_pos`` [B, Lq] over
    ``k``/``v`` [B, Hkv, Lk, D] holding key positions 0..Lk-1. ``per_split`` None: decode launch when
    every sequence's rows fit one decode tile, prefill launch otherwise (both give the same bits).
    ``prefill`` / ``decode``: (BLOCK_M, warps, stages) overrides of :data:`PREFILL` / :data:`DECODE`
    (the benchmark's sweep); ``flat``: override of :data:`FLAT`."""
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
    consts = dict(REP=rep, BLOCK_N=BLOCK_N, D=dim, SPLIT=SPLIT, INTERP=interpreting(), enable_fp_fusion=False)
    if not per_split:
        bm, warps, stages = prefill or PREFILL
        row_tiles = -(-lq * rep // bm)
        _attn_kernel[(row_tiles, batch * hkv, 1)](q, k, v, pos, out, out, out, out, lq, lk, hkv, n_splits,
                                                  *strides, PER_SPLIT=False, FLAT=FLAT if flat is None else flat,
                                                  BLOCK_M=bm, num_warps=warps,
                                                  num_stages=stages, **consts)
        return out
    row_tiles = -(-lq * rep // dec_m)
    rows = lq * rep
    pm = torch.empty(batch * hkv * n_splits * rows, dtype=torch.float32, device=q.device)
    pl = torch.empty_like(pm)
    pacc = torch.empty(batch * hkv * n_splits * rows, dim, dtype=torch.float32, device=q.device)
    _attn_kernel[(row_tiles, batch * hkv, n_splits)](q, k, v, pos, out, pm, pl, pacc, lq, lk, hkv, n_splits,
                                                     *strides, PER_SPLIT=True, BLOCK_M=dec_m, num_warps=dec_warps,
                                                     num_stages=dec_stages, **consts)
    _combine_kernel[(row_tiles, batch * hkv)](pos, out, pm, pl, pacc, lq, hkv, n_splits, *out.stride(),
                                              REP=rep, BLOCK_M=dec_m, D=dim, SPLIT=SPLIT, num_warps=4,
                                              enable_fp_fusion=False)
    return out
