"""The evidence layer's tamper / fault / fuzz figures, side by side with the kit before seal v2.

    python benchmarks/evidence_report.py [--out benchmarks/results/evidence.json]

Runs the CI acceptance tests (tests/evidence: the tamper matrix over a real sealed smoke run, the
fault tests, the fault runs of `kit run` itself, the hypothesis fuzzing of every reader and of
`kit analyze`) with figures switched on, slow cases included, and prints, for each figure, the kit
before this layer (as measured when the problems were reported) beside now, then the fault matrix:
one row per (runtime, hold point, signal) with its exit, seal and the processes/containers left.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The kit before seal v2, as measured over the same kinds of input (the report that started this layer).
BEFORE = {"tamper: forged validation_passed in an unsigned seal": "exit 0 (passes)",
          "tamper: FIFO or /dev/zero link in place of an artifact": "hangs",
          "tamper: symlink out of the run dir": "followed",
          "fuzz: tracebacks over ~1,000 inputs": 31, "fuzz: hangs": 2,
          "faults: leftover .seal.json.tmp after SIGKILL": "permanent false failure",
          "faults: Ray processes left by SIGKILL of a --ray-head run": "about 20, never stopped",
          "faults: kit analyze on 1e308 / junk types": "traceback",
          "secrets: deny-list misses": "DB_PASS, MYSQL_PWD, CI_JOB_JWT, SENTRY_DSN, SLACK_WEBHOOK_URL, "
                                       "AZURE_STORAGE_CONNECTION_STRING, URL passwords with '@' or '/'"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "evidence.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as figures:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics",
                               "tests/evidence"], cwd=REPO, capture_output=True, text=True,
                              env=dict(os.environ, KIT_EVIDENCE_FIGURES=figures))
        wall = time.monotonic() - start
        tamper = json.loads(Path(figures, "tamper.json").read_text()) if Path(figures, "tamper.json").exists() else {}
        faults_file = Path(figures, "faults.jsonl")
        faults = [json.loads(line) for line in faults_file.read_text().splitlines()] if faults_file.exists() else []
    passed = re.search(r"(\d+) passed", proc.stdout)
    failed = re.search(r"(\d+) failed", proc.stdout)
    counts = re.findall(r"- (\d+) passing examples, (\d+) failing examples", proc.stdout)
    fuzz = [int(ok) for ok, _ in counts]
    fuzz_failing = sum(int(bad) for _, bad in counts)
    now = {
        "tamper cases": tamper.get("cases"), "tamper detected": tamper.get("detected"),
        "tamper reported unsigned (whole seal recomputed, no key)": tamper.get("reported_unsigned"),
        "tamper tracebacks": tamper.get("tracebacks"), "max verify time (s)": tamper.get("max_verify_s"),
        "fuzz examples": sum(fuzz), "fuzz failing examples": fuzz_failing,
        "tests passed": int(passed.group(1)) if passed else 0, "tests failed": int(failed.group(1)) if failed else 0,
        "wall time of tests/evidence (s)": round(wall, 1),
        "fault runs of kit run": len(faults),
        "fault runs: runtimes / hold points": f"{len({f['runtime'] for f in faults})} / {len({f['point'] for f in faults})}",
        "fault runs: tracebacks": sum(f["tracebacks"] for f in faults),
        "fault runs: false 'sealed'": sum(f["false_sealed"] for f in faults),
        "fault runs: sealed runs that do not verify": sum(1 for f in faults if f["sealed"] and not f["seal_verifies"]),
        "fault runs: left running after SIGINT/SIGTERM": sum(f["orphans_after_signal"] for f in faults
                                                             if f["signal"] != "SIGKILL"),
        "fault runs: left running right after SIGKILL (before the next command)":
            sum(f["orphans_after_signal"] for f in faults if f["signal"] == "SIGKILL"),
        "fault runs: left running after the next kit run / kit doctor": sum(f["orphans_after_next"] for f in faults),
    }
    result = {"before": BEFORE, "now": now, "fault_runs": faults, "tamper_outcomes": tamper.get("outcomes", []),
              "pytest_tail": proc.stdout.strip().splitlines()[-3:]}
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    width = max(map(len, [*BEFORE, *now]))
    print("before (the kit before seal v2)")
    for k, v in BEFORE.items():
        print(f"  {k:<{width}}  {v}")
    print("now")
    for k, v in now.items():
        print(f"  {k:<{width}}  {v}")
    if faults:
        print("fault matrix (left = processes and containers of the run still there)")
        print(f"  {'runtime':<9} {'point':<11} {'signal':<8} {'exit':>5} {'sealed':<7} {'left':>4} "
              f"{'left after next':>15}  next command")
        for f in faults:
            sealed = "yes" if f["sealed"] and f["seal_verifies"] else ("BROKEN" if f["sealed"] else "no")
            print(f"  {f['runtime']:<9} {f['point']:<11} {f['signal']:<8} {f['exit_code']:>5} {sealed:<7} "
                  f"{f['orphans_after_signal']:>4} {f['orphans_after_next']:>15}  {f['next_command']}")
    if tamper.get("cases"):
        print(f"detection ratio now {tamper['detected']}/{tamper['cases']} = {tamper['detected'] / tamper['cases']:.3f}; "
              f"max verify {tamper['max_verify_s']} s of the 10 s allowed ({tamper['max_verify_s'] / 10:.4f})")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
