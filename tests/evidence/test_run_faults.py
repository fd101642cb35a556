"""Fault runs of `kit run` itself: SIGKILL, SIGINT and SIGTERM at named points (held there with
KIT_TEST_HOLD_AT, the signal sent from outside) of the local runtime, the local Ray head and the docker
runtime. Each: no traceback, no false "sealed", a seal that exists verifies, nothing left running once
the run ended by SIGINT/SIGTERM; after SIGKILL of a run that started a Ray head or a container, nothing
left 10 s later with no kit command run (the lease's watcher), and after any SIGKILL nothing left once
the next `kit run` or `kit doctor` acted on the run's lease. A read-only run root is one line, exit 2, nothing started."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from kit.evidence import bundle as E
from kit.evidence.audit import verify_run_dir
from kit.model.holds import POINTS

from run_faults import REPO, WATCHED, fault_run, record_figure

KILL, INT, TERM = signal.SIGKILL, signal.SIGINT, signal.SIGTERM
# Every hold point once or more (with 2 cores, CI pays ~4 minutes for the lot): SIGKILL where only the
# lease can clean up, SIGINT/SIGTERM where the run must stop what it started and end itself.
LOCAL = [("preflight", KILL), ("preflight", INT), ("run-dir", TERM), ("workload", KILL), ("workload", INT),
         ("logs", KILL), ("monitors", INT), ("validation", KILL), ("status", TERM), ("sealing", KILL),
         ("sealing", INT), ("sealed", KILL)]
RAY_HEAD = [("ray-head", KILL), ("workload", KILL), ("workload", INT)]
DOCKER = [("container", KILL), ("workload", INT)]


def check(result) -> None:
    record_figure(result)
    tail = "\n".join(result.stderr_tail)
    assert result.held, f"never reached the hold at {result.point}:\n{tail}"
    assert result.tracebacks == 0, tail
    assert result.false_sealed == 0, tail
    if result.sig == KILL:
        assert result.exit_code == -9
    else:
        # a signal before the job ended stops it (130, no seal); after it, the kit finishes its seal (0)
        assert result.exit_code in (0, 130), (result.exit_code, tail)
        assert result.sealed == (result.exit_code == 0), tail
        assert result.orphans_after_signal == 0, f"{result.orphans_after_signal} processes/containers left"
    if result.sig == KILL and result.runtime in WATCHED:
        assert result.orphans_10s_after_kill == 0, (f"{result.orphans_10s_after_kill} left 10 s after SIGKILL: "
                                                    + "; ".join(result.left))
    if result.sealed:
        assert result.seal_verifies
    assert result.orphans_after_next == 0, (f"{result.orphans_after_next} left after {result.next_command} "
                                            f"({result.next_said}): " + "; ".join(result.left))


def test_every_hold_point_is_tested():
    tested = {p for p, _ in LOCAL + RAY_HEAD + DOCKER}
    assert tested == set(POINTS)


@pytest.mark.parametrize("point,sig", LOCAL, ids=[f"{p}-{s.name}" for p, s in LOCAL])
def test_local_run_fault(tmp_path, point, sig):
    check(fault_run(tmp_path / "ws", "local", point, sig))


@pytest.mark.ray
@pytest.mark.parametrize("point,sig", RAY_HEAD, ids=[f"{p}-{s.name}" for p, s in RAY_HEAD])
def test_ray_head_run_fault(tmp_path, point, sig):
    check(fault_run(tmp_path / "ws", "ray-head", point, sig))


@pytest.mark.parametrize("point,sig", DOCKER, ids=[f"{p}-{s.name}" for p, s in DOCKER])
def test_docker_run_fault(tmp_path, cpu_image, point, sig):
    check(fault_run(tmp_path / "ws", "docker", point, sig, image=cpu_image.tag))


def _kit_run(ws, run_id):
    return subprocess.run([sys.executable, "-m", "kit", "run", "--arm", "smoke", "--rollouts", "1", "--run-id", run_id,
                           "--allow-dirty", "--workspace", str(ws)], capture_output=True, text=True, cwd=REPO,
                          timeout=300)


# root ignores mode bits: the run is made without CAP_DAC_OVERRIDE, or inside a mount namespace of its own
READ_ONLY = {
    "runs-mode-0555": lambda ws, cmd: ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                                       "--inh-caps=-dac_override,-dac_read_search", *cmd],
    "workspace-mounted-ro": lambda ws, cmd: ["unshare", "--mount", "sh", "-c",
                                             'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" && exec "$@"',
                                             str(ws), *cmd],
}


@pytest.mark.parametrize("how", sorted(READ_ONLY))
def test_a_read_only_run_root_is_one_line_and_loses_nothing(tmp_path, how):
    ws = tmp_path / "ws"
    first = _kit_run(ws, "kept")
    assert first.returncode == 0, first.stderr[-2000:]
    before = sorted((str(p.relative_to(ws)), p.stat().st_size) for p in ws.rglob("*") if p.is_file())
    (ws / E.RUNS_DIR).chmod(0o555)
    try:
        cmd = [sys.executable, "-m", "kit", "run", "--arm", "smoke", "--rollouts", "1", "--run-id", "refused",
               "--allow-dirty", "--workspace", str(ws)]
        proc = subprocess.run(READ_ONLY[how](ws, cmd), capture_output=True, text=True, cwd=REPO, timeout=300)
    finally:
        (ws / E.RUNS_DIR).chmod(0o755)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{ws / E.RUNS_DIR}: cannot write a run dir there" in proc.stderr, proc.stderr
    assert sorted((str(p.relative_to(ws)), p.stat().st_size) for p in ws.rglob("*") if p.is_file()) == before
    assert verify_run_dir(ws / E.RUNS_DIR / "kept").status == "ok"
    assert not (ws / E.RUNS_DIR / "refused").exists() and "refused" not in E.registered_run_ids(ws)
