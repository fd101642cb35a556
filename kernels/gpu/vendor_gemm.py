"""Certified vendor GEMMs: cuBLAS where it computes the strict GEMM's bits on this GPU and build.

The strict contract fixes a GEMM's reduction order, not its implementation: a row's element is the
chain of k16 MMA steps over K from 0 upward into one fp32 accumulator (``triton_gemm``). A cuBLAS
kernel without split-K chains the same steps, whatever its tile, so it can give the same bits;
with split-K (which cuBLAS picks for few rows) it does not. Which kernel cuBLAS picks is its
heuristic's choice for this GPU, this cuBLAS build and the call's shape and strides, so nothing is
assumed: before the first vendor call of a (kind, shape, layout) the process *certifies* it --
cuBLAS and the strict Triton kernel on the same seeded random operands, laid out like the call,
at every row count of :data:`CERT_ROWS` (partials with few rows: every count from 1 to
:data:`MIN_ROWS`), byte for byte -- and a call takes cuBLAS only where that held. Column products
of at most :data:`MIN_ROWS` rows always take the strict kernel (there cuBLAS chooses split-K for
some of these shapes on the H200: qkv under TP2-8, gate/up under TP8). A cuBLAS update that changes the choice fails the
certification and the strict kernel runs; one that changes it only at untested row counts is
caught by the conformance oracle, whose fingerprint is that of the strict kernels.

Two kinds:

- ``columns``: column-parallel products of a shared input ``x`` [M, K] with a rank's per-shard
  weights [S, K, n] whose [S, n, K] transpose is contiguous: one cuBLAS call over the rank's
  S·n columns, viewed as [S, M, n];
- ``partials``: the fp32 per-shard partials [S, M, N] of a row-parallel product (one batched
  ``torch.bmm`` with an fp32 output), which the caller reduces in the fixed shard tree (certified
  as the reduced result against the strict kernels' tree).

``RLK_VENDOR_GEMM=0`` turns the vendor path off (every GEMM on the strict kernels; the same bits
wherever the certification held). :func:`report` lists what was certified in this process.

Example::

    >>> enabled() in (True, False)
    True
"""

from __future__ import annotations

import functools
import os
import time

MIN_ROWS = 256               # columns: up to this many rows always the strict kernel
SMALL_CERT_ROWS = tuple(range(1, MIN_ROWS + 1))      # partials: every decode-size row count
CERT_ROWS = (257, 300, 511, 512, 1000, 2047, 4096)
_CERT: dict = {}             # key -> {"ok": bool, ...}


def enabled() -> bool:
    from rlk_kernels.gpu.common import interpreting
    return os.environ.get("RLK_VENDOR_GEMM", "1") != "0" and not interpreting()


def _recording() -> bool:
    """True inside the precompile dry run (Triton launches are skipped there: nothing to compare)."""
    try:
        from triton import knobs
        return knobs.runtime.jit_cache_hook is not None
    except Exception:
        return False


def report() -> list:
    """The certifications of this process: kind, shape, layout, result, rows checked, seconds."""
    return [dict(v) for v in _CERT.values()]


def _like(shape, stride, gen, device, rows_dim, rows):
    """Seeded bf16 values of ``shape`` (with ``rows`` at ``rows_dim``) in the stride order of ``stride``."""
    import torch
    shape = list(shape)
    shape[rows_dim] = rows
    order = sorted(range(len(shape)), key=lambda d: -stride[d])
    base = torch.randn([shape[d] for d in order], device=device, generator=gen).to(torch.bfloat16)
    inverse = [order.index(d) for d in range(len(shape))]
    return base.permute(*inverse)


def _layout(t) -> tuple:
    return tuple(sorted(range(t.dim()), key=lambda d: -t.stride(d)))


@functools.lru_cache(maxsize=None)
def _gpu_name(device) -> str:
    import torch
    return torch.cuda.get_device_name(device)


def _certified(kind: str, x, w, vendor, strict, rows_checked=CERT_ROWS) -> bool:
    import torch
    # built on every call (a decode step makes several): the device's name is looked up once
    key = (kind, tuple(w.shape), tuple(w.stride()), _layout(x), str(x.device), _gpu_name(x.device))
    if key in _CERT:
        return _CERT[key]["ok"]
    if _recording():
        return False
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("vendor GEMM certification inside a CUDA graph capture: run the call once first")
    started = time.perf_counter()
    gen = torch.Generator(device=x.device).manual_seed(20261206)
    wc = torch.empty_strided(w.shape, w.stride(), dtype=torch.bfloat16, device=x.device)
    wc.copy_(torch.randn(w.shape, device=x.device, generator=gen).to(torch.bfloat16) * 0.05)
    rows_dim = x.dim() - 2
    big = _like(x.shape, x.stride(), gen, x.device, rows_dim, max(rows_checked))
    bad = []
    for rows in rows_checked:
        xr = big.narrow(rows_dim, 0, rows)
        a, b = vendor(xr, wc), strict(xr, wc)
        if a is None or not torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)):
            bad.append(rows)
    _CERT[key] = {"kind": kind, "weight_shape": list(w.shape), "weight_stride": list(w.stride()),
                  "input_layout": list(_layout(x)), "gpu": key[-1], "cublas": torch.version.cuda,
                  "rows_checked": _spans(rows_checked), "rows_differing": bad, "ok": not bad,
                  "seconds": round(time.perf_counter() - started, 3)}
    return not bad


def _spans(rows) -> list:
    """Row counts as [first, last] spans of consecutive values."""
    spans = []
    for r in rows:
        if spans and spans[-1][1] == r - 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return spans


def _columns_weight(w):
    t = w.transpose(1, 2)
    return t.reshape(-1, t.shape[-1]) if t.is_contiguous() else None


def _columns_vendor(x, w, out_dtype=None):
    import torch
    import torch.nn.functional as F
    wt = _columns_weight(w)
    if wt is None:
        return None
    shards, _, cols = w.shape
    rows = x.shape[0]
    if out_dtype is None or out_dtype == torch.bfloat16:
        out = F.linear(x, wt)
    else:
        out = torch.mm(x, wt.t(), out_dtype=out_dtype)
    return out.view(rows, shards, cols).permute(1, 0, 2)


def columns(x, w, out_dtype=None):
    """``x`` [M, K] bf16 times every shard of ``w`` [S, K, n] as [S, M, n] (a view of [M, S·n]), or
    None where the strict kernel must run (few rows, off, uncertified, another layout)."""
    import torch
    if not (enabled() and x.is_cuda and x.dim() == 2 and x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16
            and x.shape[0] > MIN_ROWS and out_dtype in (None, torch.bfloat16, torch.float32)
            and _columns_weight(w) is not None):
        return None
    from rlk_kernels.gpu import triton_gemm as tg

    def strict(xr, wr):
        return tg.shard_matmul(xr, wr, out_dtype=out_dtype, vendor=False)

    if not _certified(f"columns:{out_dtype}", x, w, lambda xr, wr: _columns_vendor(xr, wr, out_dtype), strict):
        return None
    return _columns_vendor(x, w, out_dtype)


def _partials_vendor(x, w):
    import torch
    return torch.bmm(x, w, out_dtype=torch.float32)


def partials(x, w):
    """fp32 per-shard products [S, M, N] of ``x`` [S, M, k] and ``w`` [S, k, N] (bf16), or None.
    One strided-batched cuBLAS call over the shards. Certified through the caller's use: the
    partials reduced by the fixed shard tree against the strict kernels' tree (the kernels a cold
    run has already compiled), at every row count from 1 to :data:`MIN_ROWS` (decode) and at
    :data:`CERT_ROWS` above, as two certifications: few rows and many rows."""
    import torch
    if not (enabled() and x.is_cuda and x.dim() == 3 and x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16
            and x.shape[1] > 0):
        return None
    small = x.shape[1] <= MIN_ROWS
    from rlk_kernels.gpu import triton_gemm as tg

    def vendor(xr, wr):
        return tg.tree_reduce_shards(_partials_vendor(xr, wr))

    def strict(xr, wr):
        return tg.shard_matmul_tree(xr, wr, vendor=False)

    if not _certified("partials:few" if small else "partials", x, w, vendor, strict,
                      SMALL_CERT_ROWS if small else CERT_ROWS):
        return None
    return _partials_vendor(x, w)
