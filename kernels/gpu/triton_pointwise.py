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

SWIGLU_BLOCK = 1024


@triton.jit
def _rms_kernel(x_ptr, w_ptr, o_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
    tl.store(o_ptr + row * N + cols, (x * inv * w).to(o_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["n"])
def _swiglu_kernel(gu_ptr, o_ptr, n, per, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    row = i // per
    col = i % per
    g = tl.load(gu_ptr + row * (2 * per) + col, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * (2 * per) + per + col, mask=ok, other=0.0).to(tl.float32)
    tl.store(o_ptr + i, (g / (1.0 + tl.exp(-g)) * u).to(o_ptr.dtype.element_ty), mask=ok)


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
        _swiglu_kernel[(-(-n // SWIGLU_BLOCK),)](gu, out, n, per, BLOCK=SWIGLU_BLOCK, num_warps=4,
                                                  enable_fp_fusion=False)
    return out
