"""Strict selected-token logp from the LM head's logits: per-(shard, vocabulary tile) summaries.

The logits come from the strict column GEMM of :mod:`rlk_kernels.gpu.triton_gemm` (bf16 operands, fp32
accumulation) in the rows' dtype (bf16 in the GPU passes, as production's LM head writes them; the CPU
twin's fp32 rows give fp32 logits): row-invariant by construction, and above
``vendor_gemm.MIN_ROWS`` rows from cuBLAS where this process certified the same bits. A summary
kernel then reads each [rows, ``BN``] tile of one virtual shard (``BN`` fixed, one launch shape for
every call, so a row's reductions have one order), masks padded vocabulary, and writes the tile's
(max, sum of exp(logit - max)) per row, plus the target logit when the target falls in the tile. A
shard kernel folds, per row and shard, the shard's tiles in vocabulary order into the shard's (max,
sum-exp) -- a shard with no valid token gets (0, 0), as the CPU reference's safe max does -- and a
merge kernel folds the shards in global order exactly as :func:`rlk_kernels.ops.strict_logp` merges
them: logp = target - (max + log(sum)).

Example (``TRITON_INTERPRET=1`` on a CPU)::

    >>> import torch
    >>> h = torch.randn(3, 64); lm = torch.randn(8, 64, 128); t = torch.tensor([0, 5, 900])
    >>> logp(h, lm, t, vocab=1000).shape                         # doctest: +SKIP
    torch.Size([3])
"""

from __future__ import annotations

import triton
import triton.language as tl

BN = 128                      # vocabulary tile: fixed for every launch (the summary granularity)
SUMMARY = (32, 4)             # (rows per summary program, warps): one launch shape for every row count
MERGE_ROWS = 128
MERGE_PROGRAMS = 128          # fold programs wanted before the row block shrinks
MERGE_CHUNK = 8               # vocabulary tiles read per load in the merge (does not touch the order)


@triton.jit(do_not_specialize=["M"])
def _summary_kernel(lg_ptr, tgt_ptr, sm_ptr, sl_ptr, tl_ptr, M, width, shard0, vocab, n_tiles, grid_tiles, inv_temp,
                    sls, slm, sln, BM: tl.constexpr, BN: tl.constexpr, SCALE: tl.constexpr):
    # one program per (row block, vocabulary tile) of one shard, over the first ``grid_tiles`` tiles (those
    # the fold reads); tiles of a row block are neighbours in the launch order, so the logits rows stream
    # through once
    pid_m = tl.program_id(0) // grid_tiles
    pid_n = tl.program_id(0) % grid_tiles
    local = tl.program_id(1)
    shard = shard0 + local
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    row_ok = rows < M
    in_shard = cols < width
    at_logits = lg_ptr + local.to(tl.int64) * sls + rows[:, None].to(tl.int64) * slm + cols[None, :] * sln
    logits = tl.load(at_logits, mask=row_ok[:, None] & in_shard[None, :], other=0.0).to(tl.float32)
    if SCALE:
        logits = logits * inv_temp
    token = shard * width + cols
    valid = in_shard & (token < vocab)
    logits = tl.where(valid[None, :], logits, float("-inf"))
    tile_max = tl.max(logits, 1)
    safe = tl.where(tile_max == float("-inf"), 0.0, tile_max)
    tile_sum = tl.sum(tl.where(valid[None, :], tl.exp(logits - safe[:, None]), 0.0), 1)
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
def _shard_kernel(sm_ptr, sl_ptr, shm_ptr, shl_ptr, M, n_tiles, width, vocab, BN: tl.constexpr, BLOCK: tl.constexpr,
                  CHUNK: tl.constexpr):
    # one program per (row block, shard): the shards' folds are independent, so they run side by
    # side (decode has a handful of rows; one program walking all 8 x 149 tiles was latency-bound).
    # Tiles are read CHUNK at a time and folded one by one in tile order. Only the shard's tiles with
    # a token below ``vocab`` are folded: a tile of padding only is (-inf, 0), whose fold is exactly a
    # no-op, so leaving the trailing ones out changes no bit (and their summaries need not exist).
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    s = tl.program_id(1)
    ok = rows < M
    js = tl.arange(0, CHUNK)
    sm = tl.full((BLOCK,), float("-inf"), tl.float32)
    sl = tl.zeros((BLOCK,), tl.float32)
    valid = tl.minimum(tl.maximum(vocab - s * width, 0), n_tiles * BN)
    n_live = (valid + BN - 1) // BN
    for c in range(0, n_live, CHUNK):
        t = c + js
        at = (s * n_tiles + t[None, :]) * M + rows[:, None]
        live = ok[:, None] & (t[None, :] < n_live)
        tms = tl.load(sm_ptr + at, mask=live, other=float("-inf"))
        tss = tl.load(sl_ptr + at, mask=live, other=0.0)
        for j in tl.static_range(CHUNK):
            pick = js[None, :] == j
            tm = tl.max(tl.where(pick, tms, float("-inf")), 1)         # column j, exactly
            ts = tl.sum(tl.where(pick, tss, 0.0), 1)                   # x + zeros: exactly x
            new_m, new_l = _fold(sm, sl, tm, ts)
            inside = c + j < n_live
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
    from rlk_kernels.gpu.triton_gemm import shard_matmul

    sm, sl, tgt_logit = buffers
    rows, _ = h.shape
    local, _, width = lm_shards.shape
    if rows == 0:
        return
    # bf16 operands, the logits in the rows' dtype (bf16 in the GPU passes, as production's LM head writes them)
    logits = shard_matmul(h.to(torch.bfloat16), lm_shards.to(torch.bfloat16), out_dtype=h.dtype)   # [S, M, W]
    tgt = targets.to(torch.int32).contiguous()
    bm, warps = SUMMARY
    n_tiles = -(-width // BN)
    live = live_tiles(shard0, width, vocab)                  # the first shard has the most
    if live == 0:
        return
    grid = ((-(-rows // bm)) * live, local)
    _summary_kernel[grid](logits, tgt, sm, sl, tgt_logit, rows, width, shard0, vocab, n_tiles, live, 1.0 / temperature,
                          logits.stride(0), logits.stride(1), logits.stride(2),
                          BM=bm, BN=BN, SCALE=temperature != 1.0, num_warps=warps, enable_fp_fusion=False)


def live_tiles(shard: int, width: int, vocab: int) -> int:
    """Tiles of ``shard`` (``width`` columns from token ``shard * width``) holding a token below ``vocab``:
    the ones the fold reads (the kernel's rule, :func:`_shard_kernel`)."""
    valid = min(max(vocab - shard * width, 0), -(-width // BN) * BN)
    return -(-valid // BN)


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


def merge(buffers, rows: int, canonical: int, width: int, vocab: int):
    import torch
    sm, sl, tgt_logit = buffers
    out = torch.empty(rows, dtype=torch.float32, device=sm.device)
    if rows:
        shard_max = torch.empty(canonical * rows, dtype=torch.float32, device=sm.device)
        shard_sum = torch.empty_like(shard_max)
        block = merge_rows(rows, canonical)
        blocks = -(-rows // block)
        _shard_kernel[(blocks, canonical)](sm, sl, shard_max, shard_sum, rows, -(-width // BN), width, vocab,
                                           BN=BN, BLOCK=block, CHUNK=MERGE_CHUNK, num_warps=4, enable_fp_fusion=False)
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
    return merge(buffers, rows, canonical, width, vocab)
