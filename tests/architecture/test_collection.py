"""Every test file under tests/ is collected by a plain `pytest`, the command CI runs: a folder that
pytest's defaults skip (its `norecursedirs` once held "build", which left tests/build/ out) fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_is_collected():
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = {line.split("::", 1)[0] for line in proc.stdout.splitlines() if "::" in line}
    on_disk = {p.relative_to(TESTS.parent).as_posix() for p in TESTS.rglob("test_*.py")}
    assert on_disk - collected == set(), "test files a plain `pytest` does not collect"
