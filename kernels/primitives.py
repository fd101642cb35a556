"""Numerical building blocks whose result for one element never depends on its neighbours.

Library kernels pick algorithms by shape: a GEMM over 3 rows and one over 300 rows may
accumulate a row's dot products differently, and a vectorised ``exp`` may round the tail of
a tensor (computed by the scalar fallback) differently from its body. The strict (R)
operators are written only with the primitives below, each of which fixes that choice:

- :func:`tiled_matmul`: rows are cut into tiles of exactly ``ROW_TILE`` rows (the last one
  zero-padded), columns are padded to ``COL_ALIGN``, and every tile goes through one GEMM of that
  fixed shape, so every row meets the same kernel, at no ragged edge, whatever the rows in the call.
- :func:`tree_sum`: a sum along one dimension as a fixed pairwise tree of element-wise adds.
- :func:`pointwise`: transcendental functions (exp, log) applied to flat, padded,
  single-thread-sized slices so every element goes through the same vector code path.

Example::

    >>> import torch
    >>> x, w = torch.randn(5, 16), torch.randn(16, 4)
    >>> bool((tiled_matmul(x, w)[:2] == tiled_matmul(x[:2], w)).all())
    True
"""

from __future__ import annotations

ROW_TILE = 16
COL_ALIGN = 64
# Longest slice given to one element-wise kernel: below ATen's parallel grain size (32768),
# so a slice is never split between threads at a point that is not a vector boundary.
_POINTWISE_SLICE = 16384
# A multiple of twice the widest vector (AVX-512: 16 floats), so no element hits the scalar tail.
_POINTWISE_ALIGN = 64


def tiled_matmul(x, w):
    """``x @ w`` for ``x`` [M, K] and ``w`` [K, N], row-invariant (a row's bits never depend on M).

    >>> import torch
    >>> tiled_matmul(torch.ones(1, 2), torch.ones(2, 3)).tolist()
    [[2.0, 2.0, 2.0]]
    """
    return tiled_matmul_shards(x, w.unsqueeze(0))[0]


def tiled_matmul_shards(x, w_shards):
    """One :func:`tiled_matmul` per shard: ``x`` [S, M, K] (or [M, K], shared), ``w_shards`` [S, K, N] -> [S, M, N].

    Every GEMM call has one shape, [ROW_TILE, K] x [K, N rounded up to COL_ALIGN]: the library picks
    its kernel by shape and strides, and with no ragged column edge a row's bits do not depend on
    its position inside the tile either (measured: with a ragged edge they do).
    """
    import torch

    shards, inner, cols = w_shards.shape
    if x.dim() == 2:
        x = x.unsqueeze(0).expand(shards, *x.shape)
    rows = x.shape[1]
    tiles = max(1, -(-rows // ROW_TILE))
    pad = tiles * ROW_TILE - rows
    if pad:
        x = torch.cat([x, x.new_zeros(shards, pad, inner)], dim=1)
    x = x.contiguous()
    wide = -(-cols // COL_ALIGN) * COL_ALIGN
    out = []
    for s in range(shards):
        w = w_shards[s]
        if wide != cols:
            w = torch.cat([w, w.new_zeros(inner, wide - cols)], dim=1)
        # small weights are made dense (faster small GEMMs); a large one keeps its view, whose strides
        # are the same at every call site in every layout, so the kernel choice stays fixed anyway
        if w.numel() <= 1 << 20:
            w = w.contiguous()
        out.append(torch.cat([torch.mm(x[s, t * ROW_TILE:(t + 1) * ROW_TILE], w) for t in range(tiles)]))
    return torch.stack(out)[:, :rows, :cols]


def tree_sum(x, dim: int):
    """Sum over ``dim`` as a fixed pairwise tree (size padded with zeros to a power of two).

    >>> import torch
    >>> tree_sum(torch.tensor([[1.0, 2.0, 3.0]]), -1).tolist()
    [6.0]
    """
    import torch

    dim = dim % x.dim()
    size = x.shape[dim]
    width = 1
    while width < size:
        width *= 2
    if width != size:
        pad_shape = list(x.shape)
        pad_shape[dim] = width - size
        x = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)
    while width > 1:
        width //= 2
        x = x.narrow(dim, 0, width) + x.narrow(dim, width, width)
    return x.squeeze(dim)


def tree_reduce(parts):
    """Fixed pairwise tree over a list: ((p0+p1)+(p2+p3))+... ; the list order is the canonical order."""
    parts = list(parts)
    while len(parts) > 1:
        nxt = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]


def pointwise(fn, x):
    """Apply an element-wise torch function so that each element's bits depend only on its value."""
    import torch

    flat = x.contiguous().reshape(-1)
    n = flat.numel()
    pieces = []
    for start in range(0, max(n, 1), _POINTWISE_SLICE):
        piece = flat[start:start + _POINTWISE_SLICE]
        size = piece.numel()
        padded = -(-max(size, 1) // _POINTWISE_ALIGN) * _POINTWISE_ALIGN
        if padded != size:
            piece = torch.cat([piece, piece.new_zeros(padded - size)])
        pieces.append(fn(piece)[:size])
    out = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
    return out[:n].reshape(x.shape)


def exp(x):
    import torch
    return pointwise(torch.exp, x)


def log(x):
    import torch
    return pointwise(torch.log, x)


def rms_norm(x, weight, eps: float):
    """RMSNorm over the last dimension with a tree-summed mean of squares (row-invariant)."""
    import torch

    mean_sq = tree_sum(x * x, -1) / x.shape[-1]
    inv = 1.0 / torch.sqrt(mean_sq + eps)
    return x * inv.unsqueeze(-1) * weight


def silu(x):
    """x * sigmoid(x) written with :func:`exp`, so it is row-invariant too."""
    return x / (1.0 + exp(-x))
