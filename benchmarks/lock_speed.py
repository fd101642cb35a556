"""`kit lock` of the full CUDA stack against plain `uv pip compile` of the same inputs, side by side.

Both resolve vime-g11's cuda pins (torch 2.9.1, vLLM 0.16.0, ray[default] 2.57.0, TE 2.11.0 …) for
Python 3.11.15 / x86_64-manylinux_2_35 (the platform's target) against the same index with uv's cache warm (one untimed
run each first), alternating. Rows: the baseline (`uv pip compile --generate-hashes`, requirements
format), `kit lock --check` as a user runs it (a fresh process: CLI start, resolve to pylock,
parse, rules, drift against the committed lock). Goal: kit ≤ 1.5 × the baseline.
Usage: python benchmarks/lock_speed.py [repeats]   (needs the package index)
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kit.build.resolve import compile_command, default_find_links
from kit.model.catalog import Catalog
from kit.model.lock import excludes_of, requirements_of, target_of

STACK, PLATFORM = "vime-g11", "cuda"


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    kit = shutil.which("kit") or sys.exit("kit is not installed: pip install -e .")
    stack = Catalog.default().stack(STACK).document
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.in"
        req.write_text("".join(r + "\n" for r in requirements_of(stack, PLATFORM)))
        excludes = None
        if excludes_of(stack):
            excludes = Path(tmp) / "excludes.txt"
            excludes.write_text("".join(e + "\n" for e in excludes_of(stack)))
        baseline = compile_command(req, excludes, target_of(stack, PLATFORM), Path(tmp) / "requirements.txt",
                                   find_links=default_find_links())
        baseline.append("--generate-hashes")
        rows = {"uv pip compile --generate-hashes": baseline,
                f"kit lock {STACK} --platform {PLATFORM} --check": [kit, "lock", STACK, "--platform", PLATFORM,
                                                                     "--check"]}
        for argv in rows.values():     # warm uv's cache for both
            timed(argv)
        times = {label: [] for label in rows}
        for _ in range(repeats):
            for label, argv in rows.items():
                times[label].append(timed(argv))
    base = statistics.median(next(iter(times.values())))
    print(f"{STACK} {PLATFORM}: {repeats} runs each, alternating, warm uv cache")
    print(f"{'command':<48} {'median s':>9} {'min s':>7} {'x uv':>6}")
    for label, values in times.items():
        med = statistics.median(values)
        print(f"{label:<48} {med:>9.2f} {min(values):>7.2f} {med / base:>6.2f}")
    print("goal: kit lock ≤ 1.5 × uv pip compile")


if __name__ == "__main__":
    main()
