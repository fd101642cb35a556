"""Parallel layouts: training TP x CP, rollout TP, the canonical partition and the CP zigzag placement.

The strict operators partition every sharded dimension into ``canonical_tp`` *virtual* shards
(8 for Qwen3-8B, reference section 1.5); a physical TP rank ``t`` of ``tp`` hosts the contiguous
virtual shards ``t*(C/tp) .. (t+1)*(C/tp)-1``. Context parallelism uses the zigzag placement:
the sequence is cut into ``2*cp`` equal chunks and CP rank ``r`` holds chunks ``r`` and
``2*cp-1-r``, which balances causal-attention work.

Example::

    >>> zigzag_chunks(cp=2)
    [(0, 3), (1, 2)]
    >>> TrainLayout(tp=2, cp=4).label
    'TP2/CP4'
"""

from __future__ import annotations

from dataclasses import dataclass

PHYSICAL_SIZES = (1, 2, 4, 8)
MAX_GPUS = 8


@dataclass(frozen=True)
class TrainLayout:
    tp: int
    cp: int = 1

    @property
    def label(self) -> str:
        return f"TP{self.tp}/CP{self.cp}"


@dataclass(frozen=True)
class RolloutLayout:
    tp: int

    @property
    def label(self) -> str:
        return f"rollout TP{self.tp}"


def training_layouts() -> list[TrainLayout]:
    """TP in {1,2,4,8} x CP in {1,2,4,8} with TP*CP <= 8 (10 layouts)."""
    return [TrainLayout(t, c) for t in PHYSICAL_SIZES for c in PHYSICAL_SIZES if t * c <= MAX_GPUS]


def rollout_layouts() -> list[RolloutLayout]:
    return [RolloutLayout(t) for t in PHYSICAL_SIZES]


def virtual_shards(rank: int, tp: int, canonical: int) -> range:
    """Virtual shards hosted by physical TP rank ``rank`` of ``tp``."""
    if canonical % tp:
        raise ValueError(f"tp {tp} does not divide the canonical shard count {canonical}")
    per = canonical // tp
    return range(rank * per, (rank + 1) * per)


def zigzag_chunks(cp: int) -> list[tuple[int, int]]:
    """Chunk indices held by each CP rank: rank r holds (r, 2*cp-1-r)."""
    return [(r, 2 * cp - 1 - r) for r in range(cp)]


def zigzag_positions(length: int, cp: int) -> list[list[int]]:
    """Global token positions held by each CP rank; ``length`` must be a multiple of 2*cp."""
    if length % (2 * cp):
        raise ValueError(f"sequence length {length} is not a multiple of 2*cp = {2 * cp}")
    chunk = length // (2 * cp)
    out = []
    for first, second in zigzag_chunks(cp):
        out.append(list(range(first * chunk, (first + 1) * chunk)) + list(range(second * chunk, (second + 1) * chunk)))
    return out


def padded_vocab(vocab: int, multiple: int) -> int:
    """``ceil(vocab / multiple) * multiple``; Qwen3-8B: padded_vocab(152064, 1024) == 152576."""
    return -(-vocab // multiple) * multiple
