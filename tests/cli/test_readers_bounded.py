"""Every reader of a user-named file opens regular files only and reads with a bound: a FIFO, a link to
/dev/zero, a directory or a file over the limit ends in one line naming the path, exit 2, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.model.errors import BadInput
from kit.model.regular_files import MAX_LOG_BYTES, iter_regular_lines, read_regular_bytes

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
LOG = "step 0: {'train/loss': 0.5, 'perf/step_time': 1.0}\n"


@pytest.fixture
def odd(tmp_path):
    """A FIFO, a link to /dev/zero, a directory, a sparse file over the log limit, and a good log."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    big = tmp_path / "big.log"
    with open(big, "wb") as fh:
        fh.truncate(MAX_LOG_BYTES + 1)       # sparse: refused by its size, never read
    good = tmp_path / "good.log"
    good.write_text(LOG)
    (tmp_path / "dir").mkdir()
    return {"fifo": fifo, "zero": zero, "dir": tmp_path / "dir", "big": big, "good": good}


@pytest.mark.parametrize("kind, says", [("fifo", "is a FIFO"), ("zero", "is a character device"),
                                        ("dir", "is a directory"), ("big", "over the 512 MiB limit")])
def test_the_reader_refuses_what_is_not_a_bounded_regular_file(odd, kind, says):
    for read in (lambda p: read_regular_bytes(p, limit=MAX_LOG_BYTES, what="a log"),
                 lambda p: list(iter_regular_lines(p, what="a log"))):
        with pytest.raises(BadInput) as err:
            read(odd[kind])
        assert str(odd[kind]) in str(err.value) and says in str(err.value)
        assert "a regular file under 512 MiB" in str(err.value)


def test_a_file_growing_past_the_bound_while_read_is_refused(tmp_path):
    path = tmp_path / "a.log"
    path.write_text("x\n" * 100)
    with pytest.raises(BadInput, match="over the"):
        read_regular_bytes(path, limit=100)        # its size already says so
    lines = iter_regular_lines(path, limit=1 << 20)
    assert next(lines) == "x\n"
    assert read_regular_bytes(path, limit=200) == b"x\n" * 100


def kit(*args, cwd):
    # A subprocess with a timeout: a FIFO read in-process would hang the test run instead of failing it.
    return subprocess.run([sys.executable, "-c", "from kit.cli import main; main()", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def one_line(result, path, code=2):
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert str(path) in lines[0] and "a regular file under" in lines[0]


@pytest.mark.parametrize("kind", ["fifo", "zero", "big"])
def test_analyze_perf_refuses_an_odd_log_without_hanging(odd, tmp_path, kind):
    one_line(kit("analyze", "perf", odd[kind], odd["good"], "--out", tmp_path / "out", cwd=tmp_path), odd[kind])


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_compare_refuses_an_odd_arm_file(odd, tmp_path, kind):
    one_line(kit("compare", MANIFESTS / "smoke.json", odd[kind], cwd=tmp_path), odd[kind])


def test_export_refuses_a_fifo_input(odd, tmp_path):
    one_line(kit("export", "mlflow", odd["fifo"], "--tracking-uri", f"sqlite:///{tmp_path}/m.db", cwd=tmp_path),
             odd["fifo"])


def test_a_run_dir_whose_log_is_a_fifo_is_refused(odd, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "run.log")
    result = kit("analyze", "convergence", run_dir, "--out", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert str(run_dir) in result.stderr
