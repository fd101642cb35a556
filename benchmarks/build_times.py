"""Cold and warm build times of the CPU smoke image, and its size against base + wheelhouse.

Run: python benchmarks/build_times.py [--workspace DIR] [--out benchmarks/results/build_times.json]

Cold = `--no-cache` (every layer rebuilt; the wheelhouse is already on the host, so no download is
timed). Warm = the same build again (every step a cache hit). Sizes come from the engine: the base
image, the wheelhouse on disk, and the final image (base + venv + sources + kit).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", type=Path, default=REPO / ".workspace" / "bench")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "build_times.json")
    args = parser.parse_args()

    from kit.build import smoke_sources
    from kit.model.catalog import Catalog
    from kit.build.images import build_image, engine, plan_build

    client = engine()
    stack = Catalog.default().stack("smoke")
    with tempfile.TemporaryDirectory() as tmp:
        repos = {n: smoke_sources.materialize(n, Path(tmp) / n) for n in smoke_sources.fixture_names()}
        t = time.monotonic()
        plan = plan_build(stack, "cpu", workspace=args.workspace, overrides=repos, client=client)
        plan_s = time.monotonic() - t   # includes the wheelhouse download on a fresh workspace
        cold = build_image(plan, workspace=args.workspace, client=client, nocache=True)
        warm = build_image(plan, workspace=args.workspace, client=client)
        t = time.monotonic()
        plan_build(stack, "cpu", workspace=args.workspace, overrides=repos, client=client)
        replan_s = time.monotonic() - t
    base = client.images.get(stack.base_image("cpu"))
    wheelhouse = sum(p.stat().st_size for e in plan.context if e.path.startswith("wheelhouse/") and e.file
                     for p in [Path(e.file)])
    image_size = client.images.get(cold.image_id).attrs["Size"]
    result = {
        "host": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
                 "engine": client.version().get("Version")},
        "tag": cold.tag,
        "plan_s": round(plan_s, 2),
        "replan_s": round(replan_s, 2),
        "cold_build_s": cold.durations_s["total"],
        "warm_build_s": warm.durations_s["total"],
        "warm_over_cold": round(warm.durations_s["total"] / cold.durations_s["total"], 4),
        "warm_cached": warm.cached,
        "same_image_id": warm.image_id == cold.image_id,
        "base_bytes": base.attrs["Size"],
        "wheelhouse_bytes": wheelhouse,
        "image_bytes": image_size,
        "image_over_base_plus_wheelhouse": round(image_size / (base.attrs["Size"] + wheelhouse), 3),
        "context_bytes": cold.record["context"]["bytes"],
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
