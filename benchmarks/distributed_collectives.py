"""Cost of the strict kernels' fixed-order all-reduce against the backend's all_reduce, over real ranks.

Three ways to sum one fp32 tensor per rank over a world of N processes, measured side by side in
the same run (their order rotates every repeat, a barrier before each timing):

- ``all_reduce``: the backend's own ``torch.distributed.all_reduce`` (SUM): its reduction order
  depends on the algorithm and topology the library picks;
- ``gather+tree``: one ``all_gather`` into a list, then :func:`rlk_kernels.primitives.tree_reduce`
  (the fixed pairwise tree the strict kernels use);
- ``group``: :func:`rlk_kernels.collectives.all_reduce_fixed_tree` through
  :class:`rlk_kernels.distributed.TorchDistGroup` (what the operators actually call: a size exchange,
  one padded byte all_gather, unpacking, the same tree).

A timing is the slowest rank's; the figure is the median over repeats. Ratios are against
``all_reduce``. The last columns say whether the fixed tree is bitwise identical on every rank and
how many elements differ from the backend's all_reduce. Runs unchanged with nccl (one GPU per rank):

    python benchmarks/distributed_collectives.py --backend gloo --world 2 --world 4
    python benchmarks/distributed_collectives.py --backend nccl --world 8 --sizes 1048576 16777216 134217728
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("all_reduce", "gather+tree", "group")


def _rank_bench(ctx, payload):
    import torch
    import torch.distributed as dist
    from rlk_kernels.collectives import all_reduce_fixed_tree
    from rlk_kernels.distributed import require_rank_env
    from rlk_kernels.primitives import tree_reduce

    require_rank_env()
    (group,) = ctx.prepare_groups([list(range(ctx.world))])
    cuda = ctx.device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def backend(t):
        out = t.clone()
        dist.all_reduce(out)
        return out

    def gather_tree(t):
        parts = [torch.empty_like(t) for _ in range(ctx.world)]
        dist.all_gather(parts, t)
        return tree_reduce(parts)

    def via_group(t):
        return all_reduce_fixed_tree(group, {group.rank: t})

    fns = {"all_reduce": backend, "gather+tree": gather_tree, "group": via_group}
    rows = []
    for n in payload["sizes"]:
        gen = torch.Generator().manual_seed(1000 + ctx.rank)
        t = torch.randn(n, generator=gen).to(ctx.device)
        results = {m: fns[m](t) for m in METHODS}          # warm-up, and the values compared below
        times = {m: [] for m in METHODS}
        for rep in range(payload["repeats"]):
            for m in METHODS[rep % 3:] + METHODS[:rep % 3]:
                ctx.barrier()
                sync()
                t0 = time.perf_counter()
                fns[m](t)
                sync()
                times[m].append(time.perf_counter() - t0)
        tree = results["group"].cpu()
        rows.append({"elements": n, "times": times,
                     "tree_sha256": hashlib.sha256(tree.numpy().tobytes()).hexdigest(),
                     "gather_tree_same": bool(torch.equal(tree.view(torch.int32), results["gather+tree"].cpu().view(torch.int32))),
                     "all_reduce_mismatches": int(torch.ne(tree, results["all_reduce"].cpu()).sum())})
    return rows


def measure(backend: str, world: int, sizes: list[int], repeats: int) -> tuple[list[dict], float]:
    from rlk_kernels.distributed import launch

    ranks, seconds = launch(_rank_bench, world, backend=backend, payload={"sizes": sizes, "repeats": repeats})
    out = []
    for i, n in enumerate(sizes):
        per_rank = [r[i] for r in ranks]
        # a collective is as slow as its slowest rank: max over ranks per repeat, median over repeats
        med = {m: statistics.median(max(r["times"][m][k] for r in per_rank) for k in range(repeats)) for m in METHODS}
        out.append({"elements": n, "median_s": med,
                    "tree_identical_on_ranks": len({r["tree_sha256"] for r in per_rank}) == 1
                    and all(r["gather_tree_same"] for r in per_rank),
                    "all_reduce_mismatches": per_rank[0]["all_reduce_mismatches"]})
    return out, seconds


def format_rows(backend: str, world: int, rows: list[dict], repeats: int, threads: str) -> str:
    import torch

    title = (f"fixed-order all-reduce vs backend all_reduce: backend={backend} world={world} fp32, "
             f"{platform.machine()}, torch {torch.__version__}, {threads}, median of {repeats} (slowest rank)")
    lines = [title]
    header = (f"{'elements':>10} {'all_reduce':>12} {'gather+tree':>12} {'group':>12} "
              f"{'ratio g+t':>9} {'ratio group':>11}  {'tree same on ranks':<18} {'all_reduce != tree':>18}")
    lines += [header, "-" * len(header)]
    for r in rows:
        m = r["median_s"]
        lines.append(f"{r['elements']:>10} {m['all_reduce'] * 1e3:>10.3f}ms {m['gather+tree'] * 1e3:>10.3f}ms "
                     f"{m['group'] * 1e3:>10.3f}ms {m['gather+tree'] / m['all_reduce']:>9.2f} {m['group'] / m['all_reduce']:>11.2f}  "
                     f"{'yes' if r['tree_identical_on_ranks'] else 'NO':<18} {str(r['all_reduce_mismatches']) + '/' + str(r['elements']):>18}")
    return "\n".join(lines)


def main() -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--world", type=int, action="append", help="ranks; repeat for several worlds (default 2)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 262144, 1048576, 4194304], help="fp32 elements per rank")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    args = parser.parse_args()
    blocks = []
    for world in args.world or [2]:
        load = os.getloadavg()[0]
        rows, _ = measure(args.backend, world, args.sizes, args.repeats)
        threads = "GPU per rank" if args.backend == "nccl" else f"{max(1, (os.cpu_count() or 1) // world)} CPU thread(s) per rank on {os.cpu_count()} cores"
        threads += f", 1-min load {load:.2f} before the run"
        blocks.append(format_rows(args.backend, world, rows, args.repeats, threads))
        print(blocks[-1], flush=True)
    if args.out:
        args.out.write_text("\n\n".join(blocks) + "\n")


if __name__ == "__main__":
    main()
