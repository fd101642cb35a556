"""Strict selected-token logp fused with the LM head: per-(shard, vocabulary tile) summaries.

One program computes a [BM, BN] logits tile of one virtual shard (full K loop, fp32 accumulator,
``BN`` fixed for every launch so the summaries have one granularity), masks padded vocabulary,
and writes the tile's (max, sum of exp(logit - max)) per row, plus the target logit when the target
falls in the tile. The logits never reach memory. A shard kernel folds, per row and shard, the
shard's tiles in vocabulary order into the shard's (max, sum-exp) — a shard with no valid token
gets (0, 0), as the CPU reference's safe max does — and a merge kernel folds the shards in global
order exactly as :func:`rlk_kernels.ops.strict_logp` merges them: logp = target - (max + log(sum)).

Example (``TRITON_INTERPRET=1`` on a CPU)::

    >>> import torch
    >>> h = torch.randn(3, 64); lm = torch.randn(8, 64, 128); t = torch.tensor([0, 5, 900])
    >>> logp(h, lm, t, vocab=1000).shape                         # doctest: +SKIP
    torch.Size([3])
"""

from __future__ import annotations

import triton
import triton.language as tl

from rlk_kernels.gpu.common import interpreting
from rlk_kernels.gpu.triton_gemm import SMALL_ROWS, tile_dot, tile_ids

BN = 128                      # vocabulary tile: fixed for every launch (the summary granularity)
SMALL = (64, BN, 128, 4, 4)
LARGE = (128, BN, 64, 8, 3)
MERGE_ROWS = 128
MERGE_PROGRAMS = 128          # fold programs wanted before the row block shrinks
MERGE_CHUNK = 8               # vocabulary tiles read per load in the merge (does not touch the order)


@triton.jit(do_not_specialize=["M"])
def _tiles_kernel(h_ptr, w_ptr, tgt_ptr, sm_ptr, sl_ptr, tl_ptr, M, K, width, shard0, vocab, n_tiles, inv_temp,
                  shm, shk, sws, swk, swn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                  SCALE: tl.constexpr, INTERP: tl.constexpr):
    pid_m, pid_n = tile_ids(tl.program_id(0), M, width, BM, BN, GROUP)
    local = tl.program_id(1)
    shard = shard0 + local
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    logits = tile_dot(h_ptr, w_ptr + local * sws, rows, cols, M, width, K, shm, shk, swk, swn, BM, BN, BK, INTERP)
    if SCALE:
        logits = logits * inv_temp
    token = shard * width + cols
    valid = (cols < width) & (token < vocab)
    logits = tl.where(valid[None, :], logits, float("-inf"))
    tile_max = tl.max(logits, 1)
    safe = tl.where(tile_max == float("-inf"), 0.0, tile_max)
    tile_sum = tl.sum(tl.where(valid[None, :], tl.exp(logits - safe[:, None]), 0.0), 1)
    row_ok = rows < M
    at = (shard * n_tiles + pid_n) * M + rows
    tl.store(sm_ptr + at, tile_max, mask=row_ok)
    tl.store(sl_ptr + at, tile_sum, mask=row_ok)
    tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=-1)
    hit = token[None, :] == tgt[:, None]
    picked = tl.sum(tl.where(hit, logits, 0.0), 1)
    inside = (tgt >= shard * width + pid_n * BN) & (tgt < shard * width + pid_n * BN + BN) & (tgt < vocab)
    tl.store(tl_ptr + rows, picked, mask=row_ok & inside)


@triton.jit
def _fold(sm, sl, tm, ts):
    """Fold one tile's (max, sum-exp) into a shard's running pair (an all-padding tile is a no-op)."""
    new = tl.maximum(sm, tm)
    a = tl.where(sm == float("-inf"), 0.0, tl.exp(sm - new))
    b = tl.where(tm == float("-inf"), 0.0, tl.exp(tm - new))
    return new, sl * a + ts * b


@triton.jit(do_not_specialize=["M"])
def _shard_kernel(sm_ptr, sl_ptr, shm_ptr, shl_ptr, M, n_tiles, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    # one program per (row block, shard): the shards' folds are independent, so they run side by
    # side (decode has a handful of rows; one program walking all 8 x 149 tiles was latency-bound).
    # Tiles are read CHUNK at a time and folded one by one in tile order.
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    s = tl.program_id(1)
    ok = rows < M
    js = tl.arange(0, CHUNK)
    sm = tl.full((BLOCK,), float("-inf"), tl.float32)
    sl = tl.zeros((BLOCK,), tl.float32)
    for c in range(0, n_tiles, CHUNK):
        t = c + js
        at = (s * n_tiles + t[None, :]) * M + rows[:, None]
        live = ok[:, None] & (t[None, :] < n_tiles)
        tms = tl.load(sm_ptr + at, mask=live, other=float("-inf"))
        tss = tl.load(sl_ptr + at, mask=live, other=0.0)
        for j in tl.static_range(CHUNK):
            pick = js[None, :] == j
            tm = tl.max(tl.where(pick, tms, float("-inf")), 1)         # column j, exactly
            ts = tl.sum(tl.where(pick, tss, 0.0), 1)                   # x + zeros: exactly x
            new_m, new_l = _fold(sm, sl, tm, ts)
            inside = c + j < n_tiles
            sm = tl.where(inside, new_m, sm)
            sl = tl.where(inside, new_l, sl)
    sm = tl.where(sm == float("-inf"), 0.0, sm)           # the reference's safe max of an all-padding shard
    tl.store(shm_ptr + s * M + rows, sm, mask=ok)
    tl.store(shl_ptr + s * M + rows, sl, mask=ok)


@triton.jit(do_not_specialize=["M"])
def _merge_kernel(shm_ptr, shl_ptr, tl_ptr, out_ptr, M, SHARDS: tl.constexpr, BLOCK: tl.constexpr):
    # the shards' (max, sum-exp) in global shard order, as rlk_kernels.ops.strict_logp merges them
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < M
    run_max = tl.load(shm_ptr + rows, mask=ok, other=0.0)
    run_sum = tl.load(shl_ptr + rows, mask=ok, other=0.0)
    for s in range(1, SHARDS):
        sm = tl.load(shm_ptr + s * M + rows, mask=ok, other=0.0)
        sl = tl.load(shl_ptr + s * M + rows, mask=ok, other=0.0)
        new = tl.maximum(run_max, sm)
        run_sum = run_sum * tl.exp(run_max - new) + sl * tl.exp(sm - new)
        run_max = new
    target = tl.load(tl_ptr + rows, mask=ok, other=0.0)
    tl.store(out_ptr + rows, target - (run_max + tl.log(run_sum)), mask=ok)


def shard_summaries(h, lm_shards, targets, buffers, *, shard0: int, vocab: int, temperature: float = 1.0):
    """Fill ``buffers`` (see :func:`new_buffers`) for shards shard0 .. shard0+S-1 of ``lm_shards`` [S, K, W]."""
    import torch

    sm, sl, tgt_logit = buffers
    rows, inner = h.shape
    local, _, width = lm_shards.shape
    if rows == 0:
        return
    h = h.to(torch.bfloat16)
    w = lm_shards.to(torch.bfloat16)
    tgt = targets.to(torch.int32).contiguous()
    bm, bn, bk, warps, stages = SMALL if rows <= SMALL_ROWS else LARGE
    assert bn == BN, "the vocabulary tile is the summary granularity: fixed"
    n_tiles = -(-width // BN)
    grid = ((-(-rows // bm)) * n_tiles, local)
    _tiles_kernel[grid](h, w, tgt, sm, sl, tgt_logit, rows, inner, width, shard0, vocab, n_tiles,
                        1.0 / temperature, h.stride(0), h.stride(1), w.stride(0), w.stride(1), w.stride(2),
                        BM=bm, BN=bn, BK=bk, GROUP=8, SCALE=temperature != 1.0, INTERP=interpreting(),
                        num_warps=warps, num_stages=stages, enable_fp_fusion=False)


def new_buffers(rows: int, canonical: int, width: int, device):
    import torch
    n_tiles = -(-width // BN)
    sm = torch.empty(canonical * n_tiles * rows, dtype=torch.float32, device=device)
    return sm, torch.empty_like(sm), torch.zeros(rows, dtype=torch.float32, device=device)


def merge_rows(rows: int, canonical: int) -> int:
    """Rows per fold program: fewer where there are few (row block, shard) programs (one wide shard walks
    all its tiles in one program per block). Each row folds its own tiles in order whatever the block."""
    block = MERGE_ROWS
    while block > 16 and -(-rows // block) * canonical < MERGE_PROGRAMS:
        block //= 2
    return block


def merge(buffers, rows: int, canonical: int, width: int):
    import torch
    sm, sl, tgt_logit = buffers
    out = torch.empty(rows, dtype=torch.float32, device=sm.device)
    if rows:
        shard_max = torch.empty(canonical * rows, dtype=torch.float32, device=sm.device)
        shard_sum = torch.empty_like(shard_max)
        block = merge_rows(rows, canonical)
        blocks = -(-rows // block)
        _shard_kernel[(blocks, canonical)](sm, sl, shard_max, shard_sum, rows, -(-width // BN),
                                           BLOCK=block, CHUNK=MERGE_CHUNK, num_warps=4, enable_fp_fusion=False)
        _merge_kernel[(blocks,)](shard_max, shard_sum, tgt_logit, out, rows, SHARDS=canonical, BLOCK=block,
                                 num_warps=4, enable_fp_fusion=False)
    return out


def logp(h, lm_shards, targets, *, vocab: int, temperature: float = 1.0, ranks=None):
    """Selected-token logp [N] of final-normed ``h`` [N, K] with ``lm_shards`` [C, K, V/C], ``targets`` [N].

    ``ranks``: the shard ranges each (emulated) TP rank computes; the summaries land in one buffer in
    global shard order, so the result does not depend on them.
    """
    canonical, _, width = lm_shards.shape
    rows = h.shape[0]
    buffers = new_buffers(rows, canonical, width, h.device)
    for shards in ranks or [range(canonical)]:
        shard_summaries(h, lm_shards[shards.start:shards.stop], targets, buffers, shard0=shards.start,
                        vocab=vocab, temperature=temperature)
    return merge(buffers, rows, canonical, width)
