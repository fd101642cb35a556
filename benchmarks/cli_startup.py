"""Cold start of `kit --help` against a bare `python -c pass` and `import click`, side by side.

The commands are interleaved (one round runs each once) so a burst of load hits all of them alike.
Wall time is what a user waits; CPU time (user + system of the child, from wait4) is what the kit
costs, and stays put when neighbours load the machine. Goal: `kit --help` < 0.1 s.
Usage: python benchmarks/cli_startup.py [rounds]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time


def once(argv: list[str]) -> tuple[float, float]:
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(argv)} failed")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    kit = shutil.which("kit") or sys.exit("kit is not installed: pip install -e .")
    rows = [("python -c pass", [sys.executable, "-c", "pass"]),
            ("python -c 'import click'", [sys.executable, "-c", "import click"]),
            ("kit --help", [kit, "--help"]),
            ("kit plan --arm smoke --json", [kit, "plan", "--arm", "smoke", "--json"])]
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in rows}
    for _ in range(rounds):
        for label, argv in rows:
            samples[label].append(once(argv))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores), {rounds} interleaved rounds")
    print(f"{'command':<30} {'wall med s':>10} {'wall min s':>10} {'cpu min s':>9} {'cpu over python':>15}")
    bare_cpu = min(c for _, c in samples["python -c pass"])
    for label, _ in rows:
        wall = [w for w, _ in samples[label]]
        cpu = min(c for _, c in samples[label])
        print(f"{label:<30} {statistics.median(wall):>10.3f} {min(wall):>10.3f} {cpu:>9.3f} {cpu - bare_cpu:>15.3f}")
    print("goal: kit --help < 0.1 s")


if __name__ == "__main__":
    main()
