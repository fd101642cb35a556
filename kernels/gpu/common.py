"""Pieces shared by the strict Triton kernels.

``INTERPRET`` is true when Triton runs the kernels on the CPU (``TRITON_INTERPRET=1``): its bf16
``tl.dot`` is not usable there, so :func:`mma` multiplies the same bf16 values in fp32 (the
products of two bf16 numbers are exact in fp32), which is the CPU twin of the tensor-core step.

Example::

    >>> isinstance(interpreting(), bool)
    True
"""

from __future__ import annotations

import os

import triton
import triton.language as tl


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def mma(a, b, acc, INTERP: tl.constexpr):
    """``acc + a @ b`` with bf16 operands and an fp32 accumulator."""
    if INTERP:
        return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), acc,
                      input_precision="ieee")
    else:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
