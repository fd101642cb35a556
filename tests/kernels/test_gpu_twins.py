"""The Triton strict kernels, interpreted on the CPU (TRITON_INTERPRET=1), against their CPU twins.

The CPU reference (``rlk_kernels.primitives`` / ``rlk_kernels.ops``) is what each GPU path must
match up to bf16 rounding; bitwise invariance on the GPU itself is checked by the H200 run of
``benchmarks/gpu_strict_kernels.py`` (results in benchmarks/results/h200-strict-kernels.json).
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported by the kernels

from rlk_kernels import ops, primitives as pr  # noqa: E402
from rlk_kernels.gpu import triton_attention, triton_gemm, triton_logp, triton_pointwise  # noqa: E402


def bf(t):
    return t.to(torch.bfloat16).float()


def test_shard_matmul_matches_cpu_tiles():
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(70, 96, generator=gen), torch.randn(4, 96, 80, generator=gen)
    out = triton_gemm.shard_matmul(x, w, out_dtype=torch.float32)
    ref = pr.tiled_matmul_shards(bf(x), bf(w))
    assert out.shape == (4, 70, 80)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    # a row's bits do not depend on the other rows of the call (same launch configuration)
    assert torch.equal(triton_gemm.shard_matmul(x[:3], w, out_dtype=torch.float32), out[:, :3])


@pytest.mark.parametrize("shards", [1, 2, 4, 8])
def test_tree_matches_cpu_tree_and_fused_equals_level_adds(shards):
    gen = torch.Generator().manual_seed(shards)
    xs, w = torch.randn(shards, 300, 32, generator=gen), torch.randn(shards, 32, 24, generator=gen)
    fused = triton_gemm.shard_matmul_tree(xs, w)                     # 300 rows: the fused kernel
    ref = pr.tree_reduce(pr.tiled_matmul_shards(bf(xs), bf(w)).unbind(0))
    torch.testing.assert_close(fused, ref, atol=1e-4, rtol=1e-4)
    # the fused tree adds the same fp32 partials in the same tree as the level-by-level adds
    partials = triton_gemm.shard_matmul(xs, w, out_dtype=torch.float32)
    level = triton_gemm.tree_reduce_shards(partials)
    torch.testing.assert_close(fused, level, atol=1e-5, rtol=1e-5)


def test_fused_swiglu_equals_stored_gate_up_path_bitwise():
    gen = torch.Generator().manual_seed(2)
    per = 40
    x, w = torch.randn(70, 64, generator=gen), torch.randn(2, 64, 2 * per, generator=gen) / 8
    x, w = x.to(torch.bfloat16), w.to(torch.bfloat16)
    fused = triton_gemm.shard_swiglu(x, w, per, fused=True)
    stored = triton_gemm.shard_swiglu(x, w, per, fused=False)
    assert fused.shape == (2, 70, per) and fused.dtype == torch.bfloat16
    assert torch.equal(fused.view(torch.int16), stored.view(torch.int16))
    gu = pr.tiled_matmul_shards(x.float(), w.float()).to(torch.bfloat16).float()
    torch.testing.assert_close(fused.float(), pr.silu(gu[..., :per]) * gu[..., per:], atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="2\\*per"):
        triton_gemm.shard_swiglu(x, w, per + 1, fused=True)


@pytest.mark.parametrize("shards", [1, 2, 4, 8])
def test_flat_tree_kernel_equals_the_per_shard_tree_bitwise(shards):
    # one loop over every shard's K steps: the same per-shard MMA chains and the same fixed tree
    gen = torch.Generator().manual_seed(10 + shards)
    xs, w = torch.randn(shards, 300, 128, generator=gen), torch.randn(shards, 128, 40, generator=gen)
    old = triton_gemm.shard_matmul_tree(xs, w, flat=False)
    new = triton_gemm.shard_matmul_tree(xs, w, flat=True)
    assert torch.equal(old.view(torch.int32), new.view(torch.int32))
    ref = pr.tree_reduce(pr.tiled_matmul_shards(bf(xs), bf(w)).unbind(0))
    torch.testing.assert_close(new, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shards", [2, 4, 8])
def test_tree_kernel_equals_one_add_per_level_bitwise(shards):
    partials = torch.randn(shards, 5, 300, generator=torch.Generator().manual_seed(shards))
    levels = partials
    while levels.shape[0] > 1:
        levels = levels[0::2] + levels[1::2]
    assert torch.equal(triton_gemm.tree_reduce_shards(partials).view(torch.int32), levels[0].view(torch.int32))


@pytest.mark.parametrize("shards", [1, 2, 8])
def test_tree_with_residual_is_the_residual_plus_the_rounded_tree(shards):
    # on the GPU the bytes equal the eager ops (benchmarks/gpu_strict_kernels.py,
    # fused_residual_equals_eager_residual); the interpreter rounds fp32 to bf16 by truncation
    gen = torch.Generator().manual_seed(shards)
    partials = torch.randn(shards, 5, 300, generator=gen)
    residual = torch.randn(5, 300, generator=gen).to(torch.bfloat16)
    out = triton_gemm.tree_reduce_shards(partials, residual)
    ref = residual + triton_gemm.tree_reduce_shards(partials).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.shape == residual.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=0.05, rtol=2 ** -6)


def test_residual_add_fuses_the_cast_and_add_of_a_strict_fp32_output(monkeypatch):
    monkeypatch.setenv("RLK_TRITON_ON_CPU", "1")                   # the GPU path, interpreted
    calls = []
    real = triton_gemm.tree_reduce_shards
    monkeypatch.setattr(triton_gemm, "tree_reduce_shards", lambda *a, **k: calls.append(a) or real(*a, **k))
    gen = torch.Generator().manual_seed(12)
    h, out = torch.randn(2, 3, 300, generator=gen).to(torch.bfloat16), torch.randn(2, 3, 300, generator=gen)
    got = ops.residual_add(h, out)
    assert len(calls) == 1 and got.dtype == torch.bfloat16 and got.shape == h.shape
    torch.testing.assert_close(got.float(), (h + out.to(torch.bfloat16)).float(), atol=0.05, rtol=2 ** -6)
    # a bf16 output (production's) is the plain add
    assert torch.equal(ops.residual_add(h, out.to(torch.bfloat16)), h + out.to(torch.bfloat16)) and len(calls) == 1


def test_few_rows_over_few_columns_take_the_narrow_tiles():
    # o_proj and down at width 1 (4096 columns): 32-wide tiles, twice the programs; the per-row chain
    # of K steps is the same in every launch (the GPU benchmark's decode_gemm section checks the bytes)
    assert triton_gemm._config(8, cols=4096) == triton_gemm.SMALL_NARROW
    assert triton_gemm._config(8, cols=6144) == triton_gemm._config(65, cols=4096) == triton_gemm.SMALL
    assert triton_gemm._config(200, cols=4096) == triton_gemm.MID_NARROW
    assert triton_gemm._config(65, cols=6144) == triton_gemm._config(256, cols=24576) == triton_gemm.MID_WIDE
    assert triton_gemm._config(300, cols=4096) == triton_gemm.LARGE


@pytest.mark.parametrize("rows,cols", [(8, 64), (8, 96), (70, 64), (140, 64), (70, 96)])
def test_every_decode_launch_gives_the_same_bits(monkeypatch, rows, cols):
    # each row-and-column class against the small launch's tile. The interpreter sums a BK-wide dot in
    # one numpy product, so it compares launches of the same BK (on the GPU every BK is the same chain
    # of k16 MMA steps: the benchmark's decode_gemm section checks those bytes)
    monkeypatch.setattr(triton_gemm, "NARROW_COLS", 64)
    gen = torch.Generator().manual_seed(rows + cols)
    x, w = bf(torch.randn(rows, 256, generator=gen)), bf(torch.randn(1, 256, cols, generator=gen))
    chosen = triton_gemm._config(rows, cols=cols)
    out = triton_gemm.shard_matmul(x, w, out_dtype=torch.float32)
    bm, bn, _, warps, stages = triton_gemm.SMALL
    monkeypatch.setattr(triton_gemm, "_config", lambda *a, **k: (bm, bn, chosen[2], warps, stages))
    assert torch.equal(out, triton_gemm.shard_matmul(x, w, out_dtype=torch.float32))


def test_tree_refuses_non_power_of_two():
    with pytest.raises(ValueError, match="1, 2, 4 or 8"):
        triton_gemm.shard_matmul_tree(torch.randn(3, 4, 16), torch.randn(3, 16, 8))


@pytest.fixture
def short_splits(monkeypatch):
    """256-key splits, so that the interpreter's short sequences span several splits (the split
    size is a constant of the schedule; the GPU default is exercised by the H200 benchmark)."""
    monkeypatch.setattr(triton_attention, "SPLIT", 256)


def test_attention_matches_cpu_and_decode_launch_equals_prefill_launch(short_splits):
    gen = torch.Generator().manual_seed(3)
    b, hq, hkv, length, d = 2, 8, 2, 300, 128
    q = bf(torch.randn(b, hq, length, d, generator=gen) * d ** -0.5)
    k, v = bf(torch.randn(b, hkv, length, d, generator=gen)), bf(torch.randn(b, hkv, length, d, generator=gen))
    pos = torch.arange(length).view(1, -1).expand(b, -1)
    out = triton_attention.attention(q, k, v, pos, out_dtype=torch.float32)
    ref = ops.strict_attention(q, k, v, pos)
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)       # P in bf16 before P·V on the GPU path
    p = 290                                                          # two splits of 256 keys
    split = triton_attention.attention(q[:, :, p:p + 1], k[:, :, :p + 1], v[:, :, :p + 1], pos[:, p:p + 1],
                                       out_dtype=torch.float32, per_split=True)
    # the interpreter's dot is a NumPy product whose bits depend on the tile's shape, so the CPU twin
    # compares the two launches at one tile height; the GPU's 128-row prefill tile (two 64-row warp
    # groups) against the 64-row decode tile is checked byte for byte by benchmarks/gpu_strict_kernels.py
    whole = triton_attention.attention(q[:, :, p:p + 1], k[:, :, :p + 1], v[:, :, :p + 1], pos[:, p:p + 1],
                                       out_dtype=torch.float32, per_split=False,
                                       prefill=triton_attention.DECODE)
    assert torch.equal(split, whole)
    default = triton_attention.attention(q[:, :, p:p + 1], k[:, :, :p + 1], v[:, :, :p + 1], pos[:, p:p + 1],
                                         out_dtype=torch.float32, per_split=False)
    torch.testing.assert_close(default, whole, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(split[:, :, 0], ref[:, :, p], atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("parts", [2, 4, 8])
def test_decode_value_columns_shared_out_keep_the_bits(short_splits, parts):
    # programs sharing one split's value columns: each computes the split's scores and softmax state
    # with the same instructions and accumulates its columns (per column the same chain over the keys)
    gen = torch.Generator().manual_seed(20 + parts)
    b, hq, hkv, length, d = 3, 8, 2, 600, 128                        # 3 splits, the last one partial
    q = bf(torch.randn(b, hq, 1, d, generator=gen) * d ** -0.5)
    k, v = bf(torch.randn(b, hkv, length, d, generator=gen)), bf(torch.randn(b, hkv, length, d, generator=gen))
    pos = torch.tensor([[599], [256], [17]])
    one = triton_attention.attention(q, k, v, pos, out_dtype=torch.float32, per_split=True)
    assert torch.equal(triton_attention.attention(q, k, v, pos, out_dtype=torch.float32, per_split=True,
                                                  dv_parts=parts), one)


@pytest.mark.parametrize("parts", [1, 2])
def test_decode_over_one_split_writes_the_merge_kernels_bits(short_splits, parts):
    # over one split the split's program runs the merge into the empty state itself
    gen = torch.Generator().manual_seed(40 + parts)
    b, hq, hkv, length, d = 3, 8, 2, 200, 128                        # one split of 256 keys
    q = bf(torch.randn(b, hq, 1, d, generator=gen) * d ** -0.5)
    k, v = bf(torch.randn(b, hkv, length, d, generator=gen)), bf(torch.randn(b, hkv, length, d, generator=gen))
    pos = torch.tensor([[199], [64], [0]])
    merged = triton_attention.attention(q, k, v, pos, per_split=True, dv_parts=parts, one_split=False)
    direct = triton_attention.attention(q, k, v, pos, per_split=True, dv_parts=parts)
    assert triton_attention.ONE_SPLIT and torch.equal(direct, merged)
    prefill = triton_attention.attention(q, k, v, pos, per_split=False, prefill=triton_attention.DECODE)
    assert torch.equal(direct, prefill)


def test_decode_value_parts_are_checked():
    q, k = torch.zeros(1, 4, 1, 32), torch.zeros(1, 1, 8, 32)
    for parts in (3, 4, 16):                                         # 32 columns: at most 2 parts of 16
        with pytest.raises(ValueError, match="dv_parts must be 1, 2, 4 or 8 and leave at least 16"):
            triton_attention.attention(q, k, k, torch.tensor([[7]]), per_split=True, dv_parts=parts)


def test_scheduling_choices_keep_the_bits_and_decode_equals_prefill(short_splits):
    gen = torch.Generator().manual_seed(9)
    b, hq, hkv, length, d = 1, 8, 2, 600, 128                        # 3 splits, the last one partial
    q = bf(torch.randn(b, hq, length, d, generator=gen) * d ** -0.5)
    k, v = bf(torch.randn(b, hkv, length, d, generator=gen)), bf(torch.randn(b, hkv, length, d, generator=gen))
    pos = torch.arange(length).view(1, -1)
    tile = triton_attention.DECODE                                   # one tile height (see above)
    fast = triton_attention.attention(q, k, v, pos, out_dtype=torch.float32, prefill=tile, fast=True)
    masked = triton_attention.attention(q, k, v, pos, out_dtype=torch.float32, prefill=tile, fast=False,
                                        heavy_first=False)
    assert torch.equal(fast, masked)                                 # unmasked interior blocks, launch order
    copy_engine = triton_attention.attention(q, k, v, pos, out_dtype=torch.float32, prefill=tile, tma=True)
    assert torch.equal(copy_engine, masked)                          # tensor-descriptor loads
    # (the interpreter's dot is a NumPy product, so the CPU twin compares launches over the same
    # tile contents; prefill rows against decode steps are compared byte for byte on the GPU)
    for p in (255, 256, 511, 599):
        args = (q[:, :, p:p + 1], k[:, :, :p + 1], v[:, :, :p + 1], pos[:, p:p + 1])
        whole = triton_attention.attention(*args, out_dtype=torch.float32, per_split=False, prefill=tile)
        for rows in (1, 2, 4):                                       # rows per merge program
            split = triton_attention.attention(*args, out_dtype=torch.float32, per_split=True, combine_rows=rows)
            assert torch.equal(split, whole), (p, rows)
    # a tile holding rows of different positions (a chunk of 3 queries) over a cache longer than
    # the positions: the unmasked blocks stop at the tile's lowest position
    rows = torch.tensor([[300, 301, 599]])
    args = (q[:, :, [300, 301, 599]], k, v, rows)
    chunk = triton_attention.attention(*args, out_dtype=torch.float32, per_split=True)
    masked = triton_attention.attention(*args, out_dtype=torch.float32, per_split=False, prefill=tile, fast=False)
    whole = triton_attention.attention(*args, out_dtype=torch.float32, per_split=False, prefill=tile)
    assert torch.equal(chunk, masked) and torch.equal(chunk, whole)
    torch.testing.assert_close(chunk, fast[:, :, [300, 301, 599]], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_logp_matches_cpu_and_ignores_rank_split(temperature):
    gen = torch.Generator().manual_seed(4)
    canonical, width, hidden = 8, 256, 64
    vocab = canonical * width - 100                                   # the last shard is partly padding
    h = bf(torch.randn(40, hidden, generator=gen))
    lm = bf(torch.randn(canonical, hidden, width, generator=gen) / 8)
    targets = torch.randint(0, vocab, (40,), generator=gen)
    out = triton_logp.logp(h, lm, targets, vocab=vocab, temperature=temperature)
    ref = ops.strict_logp(h, lm, targets, vocab=vocab, temperature=temperature)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for tp in (2, 4, 8):
        ranks = [range(r * canonical // tp, (r + 1) * canonical // tp) for r in range(tp)]
        assert torch.equal(triton_logp.logp(h, lm, targets, vocab=vocab, temperature=temperature, ranks=ranks), out)


def test_logp_merge_reads_tiles_in_chunks_without_changing_bits(monkeypatch):
    gen = torch.Generator().manual_seed(8)
    canonical, width, hidden = 2, 128 * 11, 32                         # 11 tiles per shard: a partial chunk
    h = bf(torch.randn(9, hidden, generator=gen))
    lm = bf(torch.randn(canonical, hidden, width, generator=gen) / 4)
    targets = torch.randint(0, canonical * width - 50, (9,), generator=gen)
    chunked = triton_logp.logp(h, lm, targets, vocab=canonical * width - 50)
    monkeypatch.setattr(triton_logp, "MERGE_CHUNK", 1)
    assert torch.equal(triton_logp.logp(h, lm, targets, vocab=canonical * width - 50), chunked)
    torch.testing.assert_close(chunked, ops.strict_logp(h, lm, targets, vocab=canonical * width - 50),
                               atol=1e-5, rtol=1e-5)


def test_logp_fold_leaves_out_padding_tiles_without_changing_bits():
    # a tile of padding only is summarised as (-inf, 0) and folding it is exactly a no-op, so the fold
    # stops at a shard's last tile holding a real token: the same bits as folding every tile
    gen = torch.Generator().manual_seed(9)
    rows, canonical, n_tiles = 6, 2, 5
    width = triton_logp.BN * n_tiles
    sm = torch.randn(canonical, n_tiles, rows, generator=gen) * 4
    sl = torch.rand(canonical, n_tiles, rows, generator=gen) * 100
    live = 2                                                          # shard 0: tiles 0-1; shard 1: none
    sm[0, live:], sl[0, live:], sm[1], sl[1] = float("-inf"), 0.0, float("-inf"), 0.0
    vocab = triton_logp.BN * live - 3
    assert [triton_logp.live_tiles(s, width, vocab) for s in range(canonical)] == [live, 0]

    def fold(v):
        out = torch.empty(canonical * rows), torch.empty(canonical * rows)
        triton_logp._shard_kernel[(1, canonical)](sm.reshape(-1), sl.reshape(-1), *out, rows, n_tiles, width, v,
                                                  BN=triton_logp.BN, BLOCK=16, CHUNK=4)
        return out

    stopped, every_tile = fold(vocab), fold(canonical * width)
    assert all(torch.equal(a, b) for a, b in zip(stopped, every_tile))
    assert torch.equal(stopped[0][rows:], torch.zeros(rows))         # the all-padding shard's safe max


def test_logp_shard_of_padding_only_merges_like_the_reference():
    # smoke-like vocabulary: 14 real tokens in 8 shards of 2 -> shard 7 holds only padding
    gen = torch.Generator().manual_seed(5)
    h, lm = bf(torch.randn(5, 32, generator=gen)), bf(torch.randn(8, 32, 2, generator=gen))
    targets = torch.tensor([0, 3, 7, 12, 13])
    out = triton_logp.logp(h, lm, targets, vocab=14)
    torch.testing.assert_close(out, ops.strict_logp(h, lm, targets, vocab=14), atol=1e-5, rtol=1e-5)


def test_rms_norm_and_swiglu_match_cpu():
    gen = torch.Generator().manual_seed(6)
    x, w = torch.randn(7, 4, 128, generator=gen), torch.randn(128, generator=gen)
    torch.testing.assert_close(triton_pointwise.rms_norm(x, w, 1e-6), pr.rms_norm(x, w, 1e-6), atol=1e-5, rtol=1e-5)
    gu = torch.randn(3, 5, 40, generator=gen)
    torch.testing.assert_close(triton_pointwise.swiglu(gu, 20), pr.silu(gu[..., :20]) * gu[..., 20:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("b,t,heads,scale", [(1, 5, 8, 128 ** -0.5), (3, 1, 4, None)])
def test_rms_norm_rope_equals_the_eager_glue_up_to_rounding(b, t, heads, scale):
    # the fused kernel reads heads from the per-shard product and rounds where the eager bf16 ops
    # round; the interpreter converts fp32 to bf16 by truncation, so here the two agree to a bf16
    # step (benchmarks/gpu_strict_kernels.py records the GPU's difference: fused_glue_vs_eager_glue)
    gen = torch.Generator().manual_seed(5)
    shards, d = 4, 128
    x = torch.randn(shards, b * t, heads // shards * d, generator=gen).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(d, generator=gen)).to(torch.bfloat16)
    angles = torch.arange(12, dtype=torch.float64)[:, None] * (1e4 ** (-torch.arange(d // 2) * 2 / d))[None]
    cos, sin = torch.cos(angles).to(torch.bfloat16), torch.sin(angles).to(torch.bfloat16)
    pos = torch.arange(12 - t, 12).view(1, -1).expand(b, -1)
    out = triton_pointwise.rms_norm_rope(x, w, 1e-6, cos, sin, pos, heads=heads, scale=scale)
    rows = x.permute(1, 0, 2).reshape(b, t, heads, d).float()
    normed = (rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(torch.bfloat16)
    n = normed.transpose(1, 2).float()
    c, s = cos[pos].float().unsqueeze(1), sin[pos].float().unsqueeze(1)
    ref = torch.cat([n[..., :d // 2] * c - n[..., d // 2:] * s, n[..., d // 2:] * c + n[..., :d // 2] * s], -1)
    ref = ref * (scale or 1.0)
    assert out.shape == (b, heads, t, d) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=4 * 2 ** -8 * (scale or 1.0) * 4, rtol=4 * 2 ** -8)
    # one token alone (a decode row) gives that token's bytes of the whole batch (a prefill)
    one = triton_pointwise.rms_norm_rope(x[:, -1:], w, 1e-6, cos, sin, pos[-1:, -1:], heads=heads, scale=scale)
    assert torch.equal(one[0, :, 0].view(torch.int16), out[-1, :, -1].view(torch.int16))


@pytest.mark.parametrize("b,t,shards", [(1, 5, 4), (2, 3, 2), (3, 1, 1)])
def test_qkv_glue_gives_rms_norm_rope_bits_and_the_v_heads(b, t, shards):
    # q, k and v of the per-shard product [S, M, q | k | v] in one launch: q and k are the bytes of
    # rms_norm_rope on their column slices, v the heads copied into [B, groups, T, D]
    gen = torch.Generator().manual_seed(7)
    heads, groups, d = 8, 4, 8
    width = (heads + 2 * groups) // shards * d
    x = torch.randn(shards, b * t, width, generator=gen).to(torch.bfloat16)
    qw, kw = ((1 + 0.1 * torch.randn(d, generator=gen)).to(torch.bfloat16) for _ in range(2))
    angles = torch.arange(12, dtype=torch.float64)[:, None] * (1e4 ** (-torch.arange(d // 2) * 2 / d))[None]
    cos, sin = torch.cos(angles).to(torch.bfloat16), torch.sin(angles).to(torch.bfloat16)
    pos = torch.arange(12 - t, 12).view(1, -1).expand(b, -1)
    q, k, v = triton_pointwise.qkv_glue(x, qw, kw, 1e-6, cos, sin, pos, heads=heads, groups=groups, scale=d ** -0.5)
    nq, nk = heads // shards * d, groups // shards * d
    q_ref = triton_pointwise.rms_norm_rope(x[..., :nq], qw, 1e-6, cos, sin, pos, heads=heads, scale=d ** -0.5)
    k_ref = triton_pointwise.rms_norm_rope(x[..., nq:nq + nk], kw, 1e-6, cos, sin, pos, heads=groups)
    v_ref = x[..., nq + nk:].reshape(shards, b * t, -1, d).permute(1, 0, 2, 3).reshape(b, t, groups, d).transpose(1, 2)
    for got, ref in ((q, q_ref), (k, k_ref), (v, v_ref)):
        assert got.shape == ref.shape and torch.equal(got.view(torch.int16), ref.contiguous().view(torch.int16))


def test_operator_modules_through_the_triton_path_match_cpu():
    """The ops hooks (what `kit kernels check --device cuda` runs), driven through the interpreter."""
    script = textwrap.dedent("""
        import torch
        from rlk_kernels import ops
        from rlk_kernels.model import ModelConfig, init_weights, layer_weights, rope_table
        cfg = ModelConfig.smoke(); W = init_weights(cfg, 0, layers=1); w = layer_weights(W, 0)
        x = torch.randn(6, cfg.hidden, generator=torch.Generator().manual_seed(0))
        t = torch.randint(0, cfg.vocab, (6,), generator=torch.Generator().manual_seed(1))
        rope = rope_table(cfg, 16)
        xs = x.view(2, 3, cfg.hidden)
        res = {
            "ffn": [ops.ffn_module("R", w, cfg, x, tp=tp) for tp in (1, 4)],
            "logp": [ops.logp_module("R", W, cfg, x, t, tp) for tp in (1, 8)],
            "attention": [ops.attention_module_train("R", w, cfg, rope, [xs], [[0, 1, 2]], tp)[0] for tp in (1, 2)],
        }
        torch.save(res, "out.pt")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1", RLK_TRITON_ON_CPU="1")
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-c", script], cwd=tmp, env=env, check=True, capture_output=True)
        triton_res = torch.load(os.path.join(tmp, "out.pt"))
        env.pop("RLK_TRITON_ON_CPU")
        subprocess.run([sys.executable, "-c", script], cwd=tmp, env=env, check=True, capture_output=True)
        cpu_res = torch.load(os.path.join(tmp, "out.pt"))
    for name in ("ffn", "logp", "attention"):
        a, b = triton_res[name]
        assert torch.equal(a, b), f"{name}: Triton path differs across TP"
        torch.testing.assert_close(a, cpu_res[name][0], atol=5e-2, rtol=5e-2)


def test_project_heads_on_the_fused_glue_matches_the_eager_glue_and_ignores_tp(monkeypatch):
    # bf16 tensors on the Triton path take ops._project_heads_fused (the GPU bits are checked by
    # the H200 check's fingerprint); here it must agree with the eager glue and across TP layouts
    from rlk_kernels.model import ModelConfig, init_weights, layer_weights, rope_table
    monkeypatch.setenv("RLK_TRITON_ON_CPU", "1")
    cfg = ModelConfig.smoke()
    w32 = layer_weights(init_weights(cfg, 0, layers=1), 0)
    w16 = {k: v.to(torch.bfloat16) for k, v in w32.items()}
    rope32 = rope_table(cfg, 16)
    rope16 = tuple(t.to(torch.bfloat16) for t in rope32)
    x = torch.randn(2, 5, cfg.hidden, generator=torch.Generator().manual_seed(4))
    pos = torch.arange(3, 8).expand(2, 5)
    fused = {tp: ops._project_heads("R", w16, cfg, rope16, x.to(torch.bfloat16), pos, tp) for tp in (1, 4)}
    eager = ops._project_heads("R", {k: bf(v) for k, v in w32.items()}, cfg, tuple(bf(t) for t in rope32), bf(x), pos, 1)
    for a, b, ref in zip(fused[1], fused[4], eager):
        assert a.dtype == torch.bfloat16 and a.shape == ref.shape
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        torch.testing.assert_close(a.float(), ref, atol=6e-2, rtol=6e-2)
