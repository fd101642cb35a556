"""Faults while sealing and running: SIGKILL at many points of sealing leaves either no seal or a seal
that verifies (never a false "sealed", never a permanent false failure); a full disk is one line naming
the file, with what was written kept; a proxy in the environment does not break the local Ray head."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kit.evidence import bundle as E
from kit.evidence.audit import verify_run_dir
from kit.evidence.compare import compare_run_dirs

from conftest import finish_test_run, run_manifest, seal_test_run

REPO = Path(__file__).resolve().parents[2]
KILL_POINTS_S = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.5)

SEALER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from kit.evidence import bundle as E
print("start", flush=True)
E.seal_run_dir(Path(sys.argv[1]), run_id="killed", validation_passed=True, gate_set_version="g/1")
print("sealed", flush=True)
"""


def unsealed_run(ws: Path, run_id: str, big_mib: int = 0) -> Path:
    run_dir = E.create_run_dir(ws, run_id)
    E.write_document(run_dir, E.MANIFEST, run_manifest("smoke", run_id))
    E.write_new_text(run_dir, E.RUN_LOG, "step 0: {}\n")
    if big_mib:
        with open(run_dir / "big.bin", "wb") as fh:
            fh.write(os.urandom(1 << 20) * big_mib)
    finish_test_run(run_dir, run_id)
    return run_dir


@pytest.mark.parametrize("delay", KILL_POINTS_S)
def test_sigkill_while_sealing_never_leaves_a_false_seal(tmp_path, delay):
    run_dir = unsealed_run(tmp_path / "ws", "killed", big_mib=48)
    proc = subprocess.Popen([sys.executable, "-c", SEALER, str(run_dir), str(REPO / "tests")], stdout=subprocess.PIPE,
                            text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "start"
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    verdict = verify_run_dir(run_dir)
    if (run_dir / E.SEAL).exists():
        assert verdict.status == "ok", verdict.problems            # a seal that exists is whole and true
    else:
        assert verdict.status == "fail" and verdict.problems[0][0] == "/seal.json"
        assert not compare_run_dirs(run_dir, run_dir).controlled
        E.create_run_dir(run_dir.parent.parent, "next")           # the next run cleans what a killed one left
        assert not list(run_dir.parent.glob(".killed.seal.json.tmp-*"))
        for path in [run_dir, *run_dir.rglob("*")]:              # the kill may have come after chmod
            path.chmod(path.stat().st_mode | 0o200)
        seal_test_run(run_dir, "killed")                           # sealing again is possible: nothing is stuck
        assert verify_run_dir(run_dir).status == "ok"
    assert not [p for p in run_dir.iterdir() if ".tmp" in p.name]   # no temp file inside the sealed tree


def test_a_leftover_seal_temp_from_an_older_kit_is_a_note_not_a_failure(tmp_path):
    run_dir = unsealed_run(tmp_path / "ws", "old")
    seal_test_run(run_dir, "old")
    run_dir.chmod(0o755)
    (run_dir / f"{E.SEAL_TMP_PREFIX}4242").write_bytes((run_dir / E.SEAL).read_bytes())
    verdict = verify_run_dir(run_dir)
    assert verdict.status == "ok" and any("leftover copy of seal.json" in n for n in verdict.notes)


DISK_FULL = """
import resource, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from kit.evidence import bundle as E
from kit.model.errors import KitError
from conftest import finish_test_run, run_manifest, seal_test_run
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # a write past the limit fails with EFBIG, as a full disk fails
run_dir = E.create_run_dir(Path(sys.argv[1]), "full")
E.write_document(run_dir, E.MANIFEST, run_manifest("smoke", "full"))
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), int(sys.argv[3])))
try:
    E.write_new_text(run_dir, E.RUN_LOG, "x" * 100000)
    seal_test_run(run_dir, "full")
except KitError as exc:
    print("KitError:", exc)
    sys.exit(exc.exit_code)
"""


@pytest.mark.parametrize("limit", [10, 4096, 200000])
def test_a_full_disk_is_one_line_and_keeps_what_was_written(tmp_path, limit):
    proc = subprocess.run([sys.executable, "-c", DISK_FULL, str(tmp_path / "ws"), str(REPO / "tests"), str(limit)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    run_dir = tmp_path / "ws" / "runs" / "full"
    assert json.loads((run_dir / E.MANIFEST).read_text())["run_id"] == "full"      # evidence already written is kept
    if proc.returncode != 0:
        assert proc.returncode == 2 and proc.stdout.count("\n") == 1 and "cannot" in proc.stdout, proc.stdout
        assert not (run_dir / E.SEAL).exists() or verify_run_dir(run_dir).status == "ok"
    else:
        assert verify_run_dir(run_dir).status == "ok"


@pytest.mark.ray
def test_a_proxy_in_the_environment_does_not_break_the_local_ray_head(tmp_path):
    dead = "http://127.0.0.1:9"
    env = dict(os.environ, KIT_WORKSPACE=str(tmp_path / "ws"), HTTP_PROXY=dead, HTTPS_PROXY=dead, http_proxy=dead,
               https_proxy=dead)
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    proc = subprocess.run([sys.executable, "-m", "kit", "run", "--arm", "smoke", "--rollouts", "1", "--ray-head",
                           "--run-id", "proxied", "--allow-dirty"], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert verify_run_dir(tmp_path / "ws" / "runs" / "proxied").status == "ok"
