"""Cold start of `kit --help` against a bare `python -c pass`, measured side by side.

Goal: `kit --help` < 0.25 s. Usage: python benchmarks/cli_startup.py [repeats]
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time


def timed(argv: list[str], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    kit = shutil.which("kit") or sys.exit("kit is not installed: pip install -e .")
    rows = [("python -c pass", [sys.executable, "-c", "pass"]),
            ("python -c 'import click'", [sys.executable, "-c", "import click"]),
            ("kit --help", [kit, "--help"]),
            ("kit plan --arm smoke --json", [kit, "plan", "--arm", "smoke", "--json"])]
    base = None
    print(f"{'command':<32} {'median s':>9} {'min s':>7} {'x python':>9}")
    for label, argv in rows:
        times = timed(argv, repeats)
        med = statistics.median(times)
        base = base or med
        print(f"{label:<32} {med:>9.3f} {min(times):>7.3f} {med / base:>9.2f}")
    print("goal: kit --help median < 0.25 s")


if __name__ == "__main__":
    main()
