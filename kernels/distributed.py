"""Real ranks: a torch.distributed communicator for the operators, and a one-process-per-rank launcher.

:class:`TorchDistGroup` implements the two methods operator code uses (``local_ranks()`` and
``gather_all({rank: value})``) over a ``torch.distributed`` process group, so the code that runs on
a :class:`~rlk_kernels.collectives.VirtualGroup` runs unchanged with one rank per process. Values
may be tensors or (nested) tuples/lists of tensors of any dtype, and their shapes may differ from
rank to rank: every value is packed into one byte buffer, the buffer sizes are gathered first, and
the padded buffers are exchanged with one ``all_gather``. Only gathers move data; every reduction
stays the fixed-order code of :mod:`rlk_kernels.collectives`, never the backend's all-reduce.

:func:`launch` spawns ``world`` processes (``torch.multiprocessing``), rendezvous through a file
in a fresh temporary folder, backend ``gloo`` on CPU or ``nccl`` with one GPU per rank, and
returns what the target returned on each rank. Multicast/NVLS stays off in every process
(:data:`RANK_ENV`): it can take a shared host's GPUs out of service.

Rank placement follows Megatron: tensor parallelism is innermost, so global rank
``g = cp_rank * tp + tp_rank`` (training) and ``g = replica * tp + tp_rank`` (rollout).

Example::

    >>> def target(ctx, payload):                                  # doctest: +SKIP
    ...     group = ctx.prepare_groups([list(range(ctx.world))])[0]
    ...     return [int(t) for t in group.gather_all({group.rank: torch.tensor(ctx.rank * payload)})]
    >>> launch(target, 2, backend="gloo", payload=10)                # doctest: +SKIP
    [[0, 10], [0, 10]]
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

BACKENDS = ("gloo", "nccl")

# Set by the launcher before spawning and asserted in every rank: NVLink SHARP / multicast off.
RANK_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

# Fixed dtype codes of the packed metadata (index in this tuple); names resolve lazily via torch.
_ALIGN = 8   # every leaf starts on an 8-byte boundary, so received bytes view as any dtype without a copy
_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")


class RankFailed(RuntimeError):
    """A rank process raised or died; the message carries its traceback."""


def require_rank_env(environ=None) -> None:
    """Raise unless every variable of :data:`RANK_ENV` holds its value (checked in each rank)."""
    environ = os.environ if environ is None else environ
    wrong = {k: environ.get(k) for k, v in RANK_ENV.items() if environ.get(k) != v}
    if wrong:
        expected = ", ".join(f"{k}={v}" for k, v in RANK_ENV.items())
        raise RuntimeError(f"rank environment must set {expected}; found {wrong}")


# --- packing a value (tensor or nested tuple/list of tensors) into bytes ---------------------------

def _flatten(value, leaves: list):
    """Append the tensors of ``value`` to ``leaves``; return its structure ("T" or (type, [children]))."""
    import torch
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return "T"
    if isinstance(value, (tuple, list)):
        return (type(value), [_flatten(v, leaves) for v in value])
    raise TypeError(f"gather_all carries tensors and tuples/lists of tensors, not {type(value).__name__}")


def _unflatten(spec, leaves):
    if spec == "T":
        return next(leaves)
    kind, children = spec
    return kind(_unflatten(c, leaves) for c in children)


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _layout(leaves: list) -> tuple[list[int], list[int]]:
    """(int64 metadata [n, (dtype, ndim, *shape) per leaf], byte offset of each leaf after the header)."""
    meta = [len(leaves)]
    for leaf in leaves:
        name = str(leaf.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            raise TypeError(f"gather_all: dtype {leaf.dtype} is not carried; accepted: {', '.join(_DTYPES)}")
        meta += [_DTYPES.index(name), leaf.dim(), *leaf.shape]
    offsets, cursor = [], len(meta) * 8
    for leaf in leaves:
        offsets.append(cursor)
        cursor = _align(cursor + leaf.numel() * leaf.element_size())
    return meta, offsets + [cursor]


def _pack_into(buffer, leaves: list, meta: list[int], offsets: list[int]) -> None:
    """Header then each leaf's raw bytes at its aligned offset, copied once into ``buffer`` (uint8)."""
    import torch
    buffer[:len(meta) * 8].copy_(torch.tensor(meta, dtype=torch.int64).view(torch.uint8))
    for leaf, at in zip(leaves, offsets):
        raw = leaf.detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[at:at + raw.numel()].copy_(raw)


def _unpack(buffer, meta_len: int):
    """Leaves as views of ``buffer`` (every offset is aligned, so the bytes reinterpret in place)."""
    import torch
    meta = buffer[:meta_len * 8].view(torch.int64).tolist()
    offset, cursor, leaves = meta_len * 8, 1, []
    for _ in range(meta[0]):
        dtype = getattr(torch, _DTYPES[meta[cursor]])
        ndim = meta[cursor + 1]
        shape = meta[cursor + 2:cursor + 2 + ndim]
        cursor += 2 + ndim
        count = 1
        for n in shape:
            count *= n
        size = count * torch.empty((), dtype=dtype).element_size()
        leaves.append(buffer[offset:offset + size].view(dtype).view(shape))
        offset = _align(offset + size)
    return leaves


@dataclass(frozen=True)
class TorchDistGroup:
    """This process's rank of a ``torch.distributed`` process group, as an operator communicator.

    ``ranks`` are the group's global ranks in group-rank order; ``device`` is where buffers travel
    (``cpu`` for gloo, this rank's ``cuda:N`` for nccl).
    """

    process_group: object
    ranks: tuple
    rank: int
    device: str

    @property
    def size(self) -> int:
        return len(self.ranks)

    def local_ranks(self) -> list[int]:
        return [self.rank]

    def gather_all(self, local: dict) -> list:
        import torch
        import torch.distributed as dist

        if set(local) != {self.rank}:
            raise ValueError(f"rank {self.rank} of {self.size}: expected a value for rank {self.rank} only, got {sorted(local)}")
        leaves: list = []
        spec = _flatten(local[self.rank], leaves)
        meta, offsets = _layout(leaves)
        sizes = torch.tensor([len(meta), offsets[-1]], dtype=torch.int64, device=self.device)
        all_sizes = [torch.empty_like(sizes) for _ in self.ranks]
        dist.all_gather(all_sizes, sizes, group=self.process_group)
        all_sizes = [s.tolist() for s in all_sizes]
        # all_gather needs equal sizes: pad to the longest; the padding bytes are never read
        buffer = torch.empty(max(n for _, n in all_sizes), dtype=torch.uint8, device=self.device)
        _pack_into(buffer, leaves, meta, offsets[:-1])
        received = [torch.empty_like(buffer) for _ in self.ranks]
        dist.all_gather(received, buffer, group=self.process_group)
        out = []
        for r, ((m, n), data) in enumerate(zip(all_sizes, received)):
            out.append(local[self.rank] if r == self.rank else _unflatten(spec, iter(_unpack(data[:n], m))))
        return out


# --- processes ---------------------------------------------------------------------------------------

@dataclass
class RankContext:
    """What a target function gets in its rank: who it is, where it computes, and its groups."""

    rank: int
    world: int
    backend: str
    device: str
    _groups: dict = field(default_factory=dict)

    def prepare_groups(self, rank_sets) -> list:
        """Create the process groups of ``rank_sets`` (a list of global-rank lists, the same list in every
        rank: group creation is collective) and return, for each set, this rank's communicator or None
        when this rank is not a member. A one-rank set needs no process group."""
        import torch.distributed as dist
        from rlk_kernels.collectives import VirtualGroup

        out = []
        for ranks in rank_sets:
            key = tuple(ranks)
            if key not in self._groups:
                if len(key) == 1:
                    self._groups[key] = VirtualGroup(1) if self.rank in key else None
                else:
                    pg = dist.new_group(ranks=list(key))
                    member = self.rank in key
                    self._groups[key] = TorchDistGroup(pg, key, key.index(self.rank), self.device) if member else None
            out.append(self._groups[key])
        return out

    def barrier(self) -> None:
        import torch.distributed as dist
        if self.backend == "nccl":
            dist.barrier(device_ids=[int(self.device.split(":")[1])])
        else:
            dist.barrier()


def _rank_main(rank, world, backend, init_file, result_dir, target, payload, threads, timeout_s):
    import torch
    import torch.distributed as dist

    require_rank_env()
    torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    else:
        device = "cpu"
    kwargs = {"device_id": torch.device(device)} if backend == "nccl" else {}
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s), **kwargs)
    try:
        result = target(RankContext(rank, world, backend, device), payload)
        Path(result_dir, f"rank-{rank}.pkl").write_bytes(pickle.dumps(result))
    finally:
        dist.destroy_process_group()


def check_backend(backend: str, world: int) -> None:
    """Raise ValueError naming what is missing when ``world`` ranks cannot run on ``backend`` here."""
    import torch
    import torch.distributed as dist

    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}; accepted: {', '.join(BACKENDS)}")
    if world < 1:
        raise ValueError(f"world {world}: at least one rank")
    if backend == "gloo" and not dist.is_gloo_available():
        raise ValueError(f"torch {torch.__version__} was built without gloo")
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise ValueError(f"torch {torch.__version__} was built without NCCL; on CPU use gloo")
        gpus = torch.cuda.device_count()
        if gpus < world:
            raise ValueError(f"nccl with {world} ranks needs {world} visible CUDA GPUs (one per rank); {gpus} visible")


def launch(target, world: int, *, backend: str = "gloo", payload=None, threads: int | None = None,
           timeout_s: int = 900) -> tuple[list, float]:
    """Run ``target(ctx, payload)`` in ``world`` processes; returns (results in rank order, seconds).

    ``target`` must be a module-level function (it is pickled into the spawned processes) and return
    a picklable value. CPU threads per rank default to the cores divided among the ranks.
    """
    import torch.multiprocessing as mp

    check_backend(backend, world)
    os.environ.update(RANK_ENV)   # inherited by the spawned ranks, which assert it
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world)
    with tempfile.TemporaryDirectory(prefix="rlk-ranks-") as tmp:
        started = time.perf_counter()
        try:
            mp.spawn(_rank_main, nprocs=world, join=True,
                     args=(world, backend, str(Path(tmp, "rendezvous")), tmp, target, payload, threads, timeout_s))
        except Exception as exc:   # ProcessRaisedException / ProcessExitedException carry the rank's story
            raise RankFailed(f"{backend} run with {world} ranks failed: {exc}") from exc
        elapsed = time.perf_counter() - started
        results = [pickle.loads(Path(tmp, f"rank-{r}.pkl").read_bytes()) for r in range(world)]
    return results, elapsed


# --- rank placement ------------------------------------------------------------------------------------

def train_rank_sets(world: int, tp: int, cp: int) -> tuple[list, list]:
    """(TP groups, CP groups) of global ranks for training TP x CP on ``world = tp * cp`` ranks.

    >>> train_rank_sets(4, 2, 2)
    ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    """
    if tp * cp != world:
        raise ValueError(f"TP{tp} x CP{cp} needs {tp * cp} ranks, the world has {world}")
    return [list(range(c * tp, (c + 1) * tp)) for c in range(cp)], [list(range(t, world, tp)) for t in range(tp)]


def rollout_rank_sets(world: int, tp: int) -> list:
    """TP groups of rollout TP ``tp`` on ``world`` ranks (``world // tp`` replicas).

    >>> rollout_rank_sets(4, 2)
    [[0, 1], [2, 3]]
    """
    if world % tp:
        raise ValueError(f"rollout TP{tp} does not divide the world of {world} ranks")
    return [list(range(r * tp, (r + 1) * tp)) for r in range(world // tp)]
