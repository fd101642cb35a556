"""Cost of reproducible images: cold (`--no-cache`) builds of the CPU smoke image, today's classic
build (the engine's image, tagged as the engine made it: the baseline) against the kit-written
reproducible image of the same Dockerfile and context, side by side in one run.

Run: nice -n 19 python benchmarks/build_reproducible.py --pairs 3 --workspace .workspace/tests
     [--out benchmarks/results/build_reproducible.json]

Pairs are interleaved and alternate which kind goes first (B R, R B, B R, ...), so slow drift in
the machine's load hits both kinds alike; each pair's ratio is reported, and their median. The
goal is a ratio of at most 1.15 (reproducible wall time / baseline wall time). Each reproducible
build runs in a fresh workspace (sources exported again, the wheelhouse hard-linked), so the run
also shows whether cold builds in different workspaces give one image id.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kit.build import smoke_sources  # noqa: E402
from kit.build.images import build_image, engine, plan_build  # noqa: E402
from kit.model.catalog import Catalog  # noqa: E402


def fresh_workspace(root: Path, name: str, wheelhouse: Path) -> Path:
    ws = root / name
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir(parents=True)
    if wheelhouse.is_dir():
        shutil.copytree(wheelhouse, ws / "wheelhouse", copy_function=os.link)
    return ws


def dangling(client) -> set[str]:
    return {image.id for image in client.images.list(filters={"dangling": True})}


def remove_images(client, result, before: set[str]) -> None:
    """The benchmark's images go, the engine's image of each build and the other stages' images
    that a cold multi-stage build leaves untagged with them (not dangling images it found)."""
    import docker

    engine_id = result.record.get("reproducible", {}).get("engine_image_id")
    for ref in (result.image_id, engine_id, *sorted(dangling(client) - before)):
        if ref:
            try:
                client.images.remove(ref, force=True)
            except docker.errors.APIError:   # already gone (the engine id of a baseline is its image id)
                pass


def write(out: Path, rows: list[dict], inputs: str, complete: bool) -> None:
    ratios = [r["ratio"] for r in rows]
    repro_ids = sorted({r["reproducible"]["image_id"] for r in rows})
    result = {"host": {"cpus": os.cpu_count(), "load_avg_1m_now": round(os.getloadavg()[0], 2)},
              "inputs_sha256": inputs, "complete": complete, "pairs": rows,
              "baseline_median_s": statistics.median(r["baseline"]["s"] for r in rows),
              "reproducible_median_s": statistics.median(r["reproducible"]["s"] for r in rows),
              "ratio_median": statistics.median(ratios), "ratio_max": max(ratios), "goal": 1.15,
              "reproducible_image_ids": repro_ids, "same_reproducible_id": len(repro_ids) == 1,
              "baseline_image_ids": sorted({r["baseline"]["image_id"] for r in rows})}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=REPO / ".workspace" / "tests",
                        help="a workspace whose wheelhouse/ holds the smoke lock's wheels (hard-linked, not copied)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "build_reproducible.json")
    args = parser.parse_args()

    client = engine()
    stack = Catalog.default().stack("smoke")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(dir=args.workspace.parent) as tmp:
        root = Path(tmp)
        repos = {n: smoke_sources.materialize(n, root / "src" / n) for n in smoke_sources.fixture_names()}
        for pair in range(args.pairs):
            order = ("baseline", "reproducible") if pair % 2 == 0 else ("reproducible", "baseline")
            row = {"pair": pair + 1, "order": list(order)}
            for kind in order:
                ws = fresh_workspace(root, f"{kind}-{pair}", args.workspace / "wheelhouse")
                # Its own tag, so the benchmark never touches an image a test or a user holds under the real one.
                plan = dataclasses.replace(plan_build(stack, "cpu", workspace=ws, overrides=repos, client=client),
                                           tag=f"rlk-kit/bench:{kind}")
                before = dangling(client)
                load = os.getloadavg()[0]
                t = time.monotonic()
                result = build_image(plan, workspace=ws, client=client, nocache=True,
                                     reproducible=kind == "reproducible", write_record=False)
                row[kind] = {"s": round(time.monotonic() - t, 2), "image_id": result.image_id,
                             "load_avg_1m_at_start": round(load, 2)}
                if kind == "reproducible":
                    row[kind]["kit_part_s"] = result.durations_s.get("reproducible")
                    row[kind]["kit_steps_s"] = result.normalized.seconds   # read+normalize, load
                    row[kind]["layers_read_from"] = result.normalized.read_from
                print(f"pair {pair + 1} {kind:13} {row[kind]['s']:8.1f} s  {result.image_id[:19]}  "
                      f"(load {load:.1f})", file=sys.stderr, flush=True)
                shutil.rmtree(ws, ignore_errors=True)
                remove_images(client, result, before)
            row["ratio"] = round(row["reproducible"]["s"] / row["baseline"]["s"], 3)
            rows.append(row)
            write(args.out, rows, plan.inputs_sha256, complete=pair + 1 == args.pairs)   # nothing lost if a later pair fails
    result = json.loads(args.out.read_text())
    print(f"{'pair':>4}  {'baseline s':>10}  {'reproducible s':>14}  ratio")
    for r in rows:
        print(f"{r['pair']:>4}  {r['baseline']['s']:>10.1f}  {r['reproducible']['s']:>14.1f}  {r['ratio']:.3f}")
    print(f"median ratio {result['ratio_median']:.3f} (goal <= 1.15); reproducible ids in "
          f"{len(rows)} fresh workspaces: {'one' if result['same_reproducible_id'] else 'DIFFERENT'} {result['reproducible_image_ids'][0][:19]}")


if __name__ == "__main__":
    main()
