"""Explicit collectives over a communicator, so operator code reads the same emulated or distributed.

Operator code is written per rank ("SPMD"): it computes a value for every rank it hosts,
``{rank: tensor}``, and calls a collective that returns the values of *all* ranks of the group
in rank order. A :class:`VirtualGroup` hosts every rank in one process (the emulation used on
CPU and by the conformance oracle); a process-group backed communicator (one rank per process,
``local_ranks() == [rank]``) implements the same three methods with ``torch.distributed``
gathers. Reductions are never delegated to the backend's all-reduce: they are gathers followed
by a fixed-order reduction written here, so their order is part of the code, not of the library.

Example::

    >>> import torch
    >>> g = VirtualGroup(2)
    >>> parts = all_gather(g, {r: torch.tensor([float(r)]) for r in g.local_ranks()})
    >>> [float(p) for p in parts]
    [0.0, 1.0]
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

from rlk_kernels.primitives import tree_reduce


@dataclass(frozen=True)
class VirtualGroup:
    """``size`` ranks emulated in one process; every rank's value is held locally."""

    size: int

    def local_ranks(self) -> list[int]:
        return list(range(self.size))

    def gather_all(self, local: dict):
        missing = [r for r in range(self.size) if r not in local]
        if missing:
            raise ValueError(f"virtual group of {self.size}: no value for ranks {missing}")
        return [local[r] for r in range(self.size)]


# Set only inside one-process-per-rank runs (rlk_kernels.distributed); None means emulate every rank.
_RESOLVER: contextvars.ContextVar = contextvars.ContextVar("rlk_kernels_group_resolver", default=None)


def group_for(axis: str, size: int):
    """The communicator of parallel axis ``axis`` ("tp" or "cp") with ``size`` ranks.

    A :class:`VirtualGroup` unless :func:`use_groups` installed a resolver, which is how a run
    with one process per rank hands its real process groups to unchanged operator code.

    >>> group_for("tp", 4)
    VirtualGroup(size=4)
    """
    resolver = _RESOLVER.get()
    return VirtualGroup(size) if resolver is None else resolver(axis, size)


@contextlib.contextmanager
def use_groups(resolver):
    """Within the block, ``group_for(axis, size)`` returns ``resolver(axis, size)``."""
    token = _RESOLVER.set(resolver)
    try:
        yield
    finally:
        _RESOLVER.reset(token)


def all_gather(group, local: dict) -> list:
    """Every rank receives every rank's tensor, in rank order."""
    return group.gather_all(local)


def all_reduce_fixed_tree(group, local: dict):
    """Sum over ranks as the fixed pairwise tree of :func:`tree_reduce` (strict side)."""
    return tree_reduce(all_gather(group, local))


def all_reduce_rank_order(group, local: dict):
    """Sum over ranks left to right, ((r0 + r1) + r2) + ...: what a ring/NCCL all-reduce
    amounts to for the production side, where the grouping changes with the group size."""
    parts = all_gather(group, local)
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total
