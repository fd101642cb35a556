"""Local cluster up/down time and per-node probe cost for N nodes, side by side in one run.

For each N: `kit cluster up` (head alone, then all N alive), the per-node probe job of `kit run
--runtime ray` (every node runs the full probe, conformance fingerprint included), and `kit cluster
down`. Ratios are against the strongest baseline measured in the same run: the head alone (one
container with Ray, what the docker runtime starts) for up, and N = 2 for the probe. The driver-side
cost of comparing nodes (node_problems) is measured on 64 copies of a real node's identity, the part
of the probe that grows with N on a real cluster where each node probes on its own cores.

    python benchmarks/cluster_scaling.py --nodes 2 3 4 --out benchmarks/results/cluster_scaling.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kit.cluster import local
from kit.model.catalog import Catalog
from kit.runtimes.ray import RayRuntime, node_problems


def one(arm, n: int) -> dict:
    ws = Path(tempfile.mkdtemp(prefix="rlk-bench-cluster-"))
    try:
        started = time.perf_counter()
        state = local.up(arm, nodes=n, workspace=ws)
        up_s = time.perf_counter() - started
        rt = RayRuntime(arm=arm, ray_address=state["address"], run_id=f"bench-{n}-{int(time.time())}")
        started = time.perf_counter()
        cluster = rt.probe_cluster()
        probe_s = time.perf_counter() - started
        assert len(cluster["nodes"]) == n and not node_problems(cluster["nodes"], arm.stack.document)
    finally:
        started = time.perf_counter()
        down = local.down(ws)
        down_s = time.perf_counter() - started
    return {"nodes": n, "head_s": state["timing_s"]["head_s"], "up_s": round(up_s, 3), "probe_s": round(probe_s, 3),
            "probe_per_node_s": round(probe_s / n, 3), "down_s": round(down_s, 3), "sample_node": cluster["nodes"][0],
            "leftovers": local.leftovers(local.engine(), down["cluster_id"])}


def compare_cost(node: dict, count: int, repeats: int = 5) -> float:
    """Seconds node_problems takes over ``count`` copies of one node (the driver's share of the probe)."""
    arm = Catalog.default().arm("smoke")
    nodes = []
    for i in range(count):
        copy_ = copy.deepcopy(node)
        copy_["node_id"] = f"{i:056x}"
        nodes.append(copy_)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        node_problems(nodes, arm.stack.document)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    arm = Catalog.default().arm("smoke")
    rows = []
    for n in args.nodes:
        print(f"N={n} …", file=sys.stderr, flush=True)
        rows.append(one(arm, n))
    base_probe = rows[0]["probe_s"]
    print(f"{'N':>3} {'head s':>7} {'up s':>7} {'up/head':>8} {'probe s':>8} {'probe/N s':>10} {'probe/N=' + str(rows[0]['nodes']):>10} {'down s':>7}")
    for r in rows:
        r["up_over_head"] = round(r["up_s"] / r["head_s"], 2)
        r["probe_over_first"] = round(r["probe_s"] / base_probe, 2)
        print(f"{r['nodes']:>3} {r['head_s']:>7.1f} {r['up_s']:>7.1f} {r['up_over_head']:>8.2f} {r['probe_s']:>8.1f} "
              f"{r['probe_per_node_s']:>10.2f} {r['probe_over_first']:>10.2f} {r['down_s']:>7.1f}")
    sample = rows[-1].pop("sample_node")
    for r in rows:
        r.pop("sample_node", None)
    identity_bytes = len(json.dumps(sample))
    driver = {str(k): round(compare_cost(sample, k), 4) for k in (4, 16, 64)}
    print(f"driver-side node comparison: " + ", ".join(f"{k} nodes {v * 1000:.1f} ms" for k, v in driver.items())
          + f"; one node's probe result {identity_bytes / 1024:.1f} KiB")
    doc = {"benchmark": "cluster_scaling", "host": {"cpus": os.cpu_count(), "platform": platform.platform()},
           "rows": rows, "driver_compare_s": driver, "node_result_bytes": identity_bytes,
           "note": "all N containers share this host's cores: the probe's CPU work (conformance fingerprint) runs "
                   "N times on the same cores, so probe time grows with N here; on a real cluster each node probes "
                   "on its own cores in parallel"}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
