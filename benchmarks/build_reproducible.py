"""Cost of reproducible images: cold (`--no-cache`) builds of the CPU smoke image, the engine's image
as it was tagged before (baseline) against the kit-written reproducible image, side by side.

Run: python benchmarks/build_reproducible.py [--rounds 2] [--out benchmarks/results/build_reproducible.json]

Rounds alternate baseline and reproducible so both see the same machine load. The goal is a ratio
of at most 1.15 (reproducible wall time / baseline wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", type=Path, default=REPO / ".workspace" / "bench")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "build_reproducible.json")
    args = parser.parse_args()

    from kit.build import smoke_sources
    from kit.build.images import build_image, engine, plan_build
    from kit.model.catalog import Catalog

    client = engine()
    stack = Catalog.default().stack("smoke")
    times: dict[str, list[float]] = {"baseline": [], "reproducible": []}
    parts: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        repos = {n: smoke_sources.materialize(n, Path(tmp) / n) for n in smoke_sources.fixture_names()}
        plan = plan_build(stack, "cpu", workspace=args.workspace, overrides=repos, client=client)
        for _ in range(args.rounds):
            for kind in ("baseline", "reproducible"):
                t = time.monotonic()
                result = build_image(plan, workspace=args.workspace, client=client, nocache=True,
                                     reproducible=kind == "reproducible", write_record=False)
                times[kind].append(round(time.monotonic() - t, 2))
                if kind == "reproducible":
                    parts.append(result.durations_s)
                print(f"{kind:13} {times[kind][-1]:8.1f} s  {result.image_id[:19]}", file=sys.stderr)
    base, repro = statistics.median(times["baseline"]), statistics.median(times["reproducible"])
    result = {"host": {"cpus": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0]},
              "tag": plan.tag, "rounds": args.rounds, "baseline_s": times["baseline"],
              "reproducible_s": times["reproducible"], "reproducible_parts_s": parts,
              "ratio_median": round(repro / base, 3), "goal": 1.15}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"baseline {base:.1f} s  reproducible {repro:.1f} s  ratio {repro / base:.3f} (goal <= 1.15)")


if __name__ == "__main__":
    main()
