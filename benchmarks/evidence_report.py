"""The evidence layer's tamper / fault / fuzz figures, side by side with the kit before seal v2.

    python benchmarks/evidence_report.py [--out benchmarks/results/evidence.json]

Runs the CI acceptance tests (tests/evidence: the tamper matrix over a real sealed smoke run, the
fault tests, the hypothesis fuzzing of every reader) with figures switched on, and prints, for each
figure, the kit before this layer (as measured when the problems were reported) beside now.
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
    }
    result = {"before": BEFORE, "now": now, "tamper_outcomes": tamper.get("outcomes", []),
              "pytest_tail": proc.stdout.strip().splitlines()[-3:]}
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    width = max(map(len, [*BEFORE, *now]))
    print("before (the kit before seal v2)")
    for k, v in BEFORE.items():
        print(f"  {k:<{width}}  {v}")
    print("now")
    for k, v in now.items():
        print(f"  {k:<{width}}  {v}")
    if tamper.get("cases"):
        print(f"detection ratio now {tamper['detected']}/{tamper['cases']} = {tamper['detected'] / tamper['cases']:.3f}; "
              f"max verify {tamper['max_verify_s']} s of the 10 s allowed ({tamper['max_verify_s'] / 10:.4f})")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
