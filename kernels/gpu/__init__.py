"""Strict (R) operators as Triton kernels for CUDA GPUs, and their CPU twins.

Each kernel fixes everything that could make a row's bits depend on the call: one tile shape per
kernel (a small-row and a large-row launch share the per-row instruction sequence: the same K
loop in steps of ``BK`` chained into one fp32 accumulator, the same MMA row block), no split of K
that depends on the row count, reductions over the canonical virtual shards in the fixed tree
((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)), attention over global key positions in fixed blocks and
fixed splits merged in split order (prefill and decode run the same code), and logp merged from
per-(shard, vocabulary tile) summaries in global vocabulary order.

The modules import Triton lazily; :func:`available` says whether the GPU path can run.
``TRITON_INTERPRET=1`` runs the same kernels on the CPU (what the tests do).

Example::

    >>> from rlk_kernels import gpu
    >>> isinstance(gpu.available(), bool)
    True
"""

from __future__ import annotations


def available() -> bool:
    """True when Triton imports (on CUDA, or on the CPU under ``TRITON_INTERPRET=1``)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def use_gpu_path(tensor) -> bool:
    """The strict entry points of :mod:`rlk_kernels.ops` take the Triton path for CUDA tensors.

    With ``TRITON_INTERPRET=1`` and ``RLK_TRITON_ON_CPU=1`` CPU tensors take it too (the kernels
    interpreted on the CPU: how the tests drive the operators through the GPU code).
    """
    import os
    if bool(getattr(tensor, "is_cuda", False)):
        return available()
    return (os.environ.get("RLK_TRITON_ON_CPU") == "1" and os.environ.get("TRITON_INTERPRET") == "1"
            and available())
