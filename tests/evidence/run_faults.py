"""One fault run: `kit run` held at a named point (KIT_TEST_HOLD_AT), a real signal sent from outside,
then what is left counted: processes that carry the test's token in their environment (the kit, its
monitors, a local Ray head and every Ray process under it inherit it) and containers of the run.

Used by test_run_faults.py and, through it, by benchmarks/evidence_report.py (KIT_EVIDENCE_FIGURES).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kit.evidence import bundle as E
from kit.evidence.audit import verify_run_dir
from kit.runtimes.leases import LEASES_DIR, marked_pids

REPO = Path(__file__).resolve().parents[2]
TOKEN_ENV = "RLK_FAULT_TEST_TOKEN"
# runtimes that start something a lease names (a Ray head, a container): a watcher stops it when the kit dies
WATCHED = ("ray-head", "docker")


@dataclass
class FaultRun:
    runtime: str
    point: str
    sig: signal.Signals
    run_id: str
    exit_code: int | None = None
    held: bool = False
    tracebacks: int = 0
    orphans_after_signal: int = 0          # processes and containers of the run right after it ended
    orphans_10s_after_kill: int | None = None   # ... 10 s after a SIGKILL, no kit command run (the lease's watcher)
    seconds_to_clean: float | None = None  # how long after a SIGKILL the last of them went
    orphans_after_next: int = 0            # ... after the next command (kit run / kit doctor) in the workspace
    sealed: bool = False
    seal_verifies: bool | None = None
    false_sealed: int = 0
    next_command: str = ""
    next_said: str = ""
    seconds: float = 0.0
    stderr_tail: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)   # what count_left found after the next command

    def to_json(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("sig", "stderr_tail", "left")}
        return out | {"signal": self.sig.name}


def count_left(token: str, run_id: str, said: list[str] | None = None, temp_dirs: tuple[str, ...] = (),
               markers: tuple[str, ...] = ()) -> int:
    """How many processes carrying the test's token or one of the lease's ``markers``, or holding a file
    in the run's Ray temp dirs (a process that set its title shows no environment), and containers of
    the run are left; each one is described into ``said`` (pid, state, whether it holds a lease marker,
    command line)."""
    pids = set(marked_pids(f"{TOKEN_ENV}={token}")) | set(_holders(temp_dirs))
    for marker in markers:
        pids |= set(marked_pids(marker))
    alive = [p for p in sorted(pids) if _state(p) not in ("Z", None)]
    names = subprocess.run(["docker", "ps", "-aq", "--filter", f"name=^rlk-run-{run_id}$"], capture_output=True,
                           text=True).stdout.split() if _docker_present() else []
    if said is not None:
        said += [_describe(p) for p in alive] + [f"container {n}" for n in names]
    return len(alive) + len(names)


def _holders(paths: tuple[str, ...]) -> list[int]:
    """Processes whose working directory or an open file lies under one of ``paths``."""
    if not paths:
        return []
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            links = [os.readlink(proc / "cwd")] + [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue
        if any(link.startswith(path.rstrip("/") + "/") or link == path for link in links for path in paths):
            out.append(int(proc.name))
    return out


def _lease_names(lease: Path, kind: str, key: str) -> tuple[str, ...]:
    """What a run's lease names of one kind (the local Ray head's temp dir, the process markers), read
    while the run is held, before anything removes the lease."""
    try:
        return tuple(r[key] for r in json.loads(lease.read_text())["resources"] if r.get("kind") == kind)
    except (OSError, ValueError, KeyError):
        return ()


def wait_clean(token: str, run_id: str, temp_dirs: tuple[str, ...], markers: tuple[str, ...],
               within_s: float = 10.0, said: list[str] | None = None) -> tuple[int, float | None]:
    """Poll until nothing of the run is left or ``within_s`` passed: (how many are left, seconds it took)."""
    started = time.monotonic()
    while True:
        left = count_left(token, run_id, temp_dirs=temp_dirs, markers=markers)
        took = time.monotonic() - started
        if left == 0:
            return 0, round(took, 1)
        if took > within_s:
            if said is not None:
                count_left(token, run_id, said, temp_dirs, markers)
            return left, None
        time.sleep(0.2)


def _describe(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
        lease = [e for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if e.startswith(b"RLK_KIT_LEASE=")]
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} {_state(pid)} lease={lease[0].decode() if lease else None} ppid={_ppid(pid)} {cmdline}"


def _ppid(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except OSError:
        return None


def _docker_present() -> bool:
    return Path("/var/run/docker.sock").exists()


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def runtime_args(runtime: str, image: str | None) -> list[str]:
    if runtime == "ray-head":
        return ["--ray-head"]
    if runtime == "docker":
        return ["--runtime", "docker", "--image", image]
    return []


def fault_run(ws: Path, runtime: str, point: str, sig: signal.Signals, *, image: str | None = None,
              rollouts: int = 2, hold_timeout_s: float = 600) -> FaultRun:
    """Start `kit run`, wait for the hold line, send ``sig``, then count what is left and clean up the way
    a user would: the next `kit run` (local) or `kit doctor` (Ray head, container) in the workspace."""
    run_id = f"fault-{runtime}-{point}-{sig.name.lower()}-{uuid.uuid4().hex[:6]}"
    token = uuid.uuid4().hex
    env = dict(os.environ, KIT_WORKSPACE=str(ws), KIT_TEST_HOLD_AT=point, **{TOKEN_ENV: token})
    result = FaultRun(runtime, point, sig, run_id)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", "--arm", "smoke", "--rollouts", str(rollouts),
                             "--run-id", run_id, "--allow-dirty", *runtime_args(runtime, image)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)      # a terminal's foreground group of its own
    lines: list[str] = []
    held = threading.Event()

    def read_stderr():
        for line in proc.stderr:
            lines.append(line)
            if line.startswith(f"kit: test hold at {point} "):
                held.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    result.held = held.wait(hold_timeout_s)
    lease = ws / LEASES_DIR / f"{run_id}.json"
    temp_dirs, markers = _lease_names(lease, "temp-dir", "path"), _lease_names(lease, "processes", "marker")
    if sig == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)       # Ctrl-C reaches the whole foreground group
    else:
        proc.send_signal(sig)
    try:
        stdout, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, _ = proc.communicate()
    reader.join(timeout=10)
    result.exit_code = proc.returncode
    stderr = "".join(lines)
    result.stderr_tail = stderr.strip().splitlines()[-6:]
    result.tracebacks = (stdout + stderr).count("Traceback")
    result.orphans_after_signal = count_left(token, run_id)
    if sig == signal.SIGKILL and runtime in WATCHED:
        # no kit command yet: what the lease's watcher left within 10 s
        result.orphans_10s_after_kill, result.seconds_to_clean = wait_clean(token, run_id, temp_dirs, markers,
                                                                            said=result.left)
    run_dir = ws / E.RUNS_DIR / run_id
    result.sealed = (run_dir / E.SEAL).exists()
    claimed_sealed = any(line.startswith("sealed ") for line in stdout.splitlines())
    if result.sealed:
        result.seal_verifies = verify_run_dir(run_dir).status == "ok"
    result.false_sealed = int((claimed_sealed and not result.sealed) or (result.sealed and not result.seal_verifies))
    # the next command a user types acts on what a killed run left (its lease), then nothing may be left
    next_env = dict(os.environ, KIT_WORKSPACE=str(ws))
    if sig != signal.SIGKILL:
        result.next_command = "none (the run stopped what it started)"
        result.orphans_after_next = result.orphans_after_signal
        result.seconds = round(time.monotonic() - started, 1)
        return result
    if runtime == "local":
        result.next_command = "kit run"
        nxt = subprocess.run([sys.executable, "-m", "kit", "run", "--arm", "smoke", "--rollouts", "1", "--run-id",
                              f"{run_id}-next", "--allow-dirty"], capture_output=True, text=True, env=next_env,
                             cwd=REPO, timeout=300)
        assert nxt.returncode == 0, nxt.stderr[-2000:]
        result.next_said = " ".join(line for line in nxt.stderr.splitlines() if "was killed and left" in line)
        assert verify_run_dir(ws / E.RUNS_DIR / f"{run_id}-next").status == "ok"
    else:
        result.next_command = "kit doctor"
        nxt = subprocess.run([sys.executable, "-m", "kit", "doctor", "--json"], capture_output=True, text=True,
                             env=next_env, cwd=REPO, timeout=300)
        checks = {c["name"]: c for c in json.loads(nxt.stdout)["checks"]}
        result.next_said = checks["runs.leftovers"]["reason"]
    result.tracebacks += nxt.stderr.count("Traceback")
    result.orphans_after_next = count_left(token, run_id, result.left, temp_dirs, markers)
    assert not list((ws / LEASES_DIR).glob(f"{run_id}.json")), "the lease outlived the next command"
    result.seconds = round(time.monotonic() - started, 1)
    return result


def record_figure(result: FaultRun) -> None:
    """Append the run's figures for benchmarks/evidence_report.py when it asked for them."""
    folder = os.environ.get("KIT_EVIDENCE_FIGURES")
    if folder:
        with open(Path(folder) / "faults.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(result.to_json()) + "\n")
