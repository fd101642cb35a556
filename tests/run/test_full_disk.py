"""`kit run` on a full file system: a workspace on a small tmpfs (0 bytes free to a few hundred KiB), so
the disk fills at a different step each time (the run dir, the manifest, run.log, metrics, the seal).
Each case ends in one line and an exit code, no traceback and no internal error; a run that says it
sealed has a seal that verifies, and one that did not seal left no seal."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kit.evidence.audit import verify_run_dir

pytestmark = pytest.mark.slow

# free bytes in the workspace's file system; 0 is a tmpfs filled before the run
SIZES_KIB = [0, 8, 32, 96, 1024]


@pytest.fixture()
def small_fs(tmp_path, request):
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "fs"
    mount.mkdir()
    size = max(request.param, 4)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}k", "tmpfs", str(mount)], check=True)
    try:
        if request.param == 0:
            (mount / "fill").write_bytes(b"\0" * 4096)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("small_fs", SIZES_KIB, indirect=True, ids=[f"{k}KiB" for k in SIZES_KIB])
def test_a_full_workspace_ends_in_one_line_and_never_a_false_seal(small_fs):
    ws = small_fs / "ws"
    proc = subprocess.run([sys.executable, "-m", "kit", "run", "--arm", "smoke", "--rollouts", "3", "--run-id", "full-1",
                           "--allow-dirty", "--workspace", str(ws)], capture_output=True, text=True, timeout=300)
    said = proc.stdout + proc.stderr
    assert "Traceback" not in said and "internal error" not in said, said[-3000:]
    assert proc.returncode in (0, 1, 2), said[-2000:]
    run_dir = ws / "runs" / "full-1"
    if proc.returncode == 0:
        assert verify_run_dir(run_dir).status == "ok", said[-2000:]
    else:
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("kit: "), proc.stderr[-2000:]
        assert not (run_dir / "seal.json").exists() or verify_run_dir(run_dir).status == "ok"
        if "file system is full" in last:
            assert str(ws) in last or str(small_fs) in last, last
