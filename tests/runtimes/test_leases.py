"""Stopping what a run started: every process that carries the run's marker, including one started
while the others were being stopped (as the raylet starts a worker again when one dies)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

from kit.runtimes.leases import marked_pids, stop_marked, stop_pids, with_descendants

# On SIGTERM: start a successor (same environment, so the same marker) and exit; the successor
# ignores SIGTERM, so only a SIGKILL ends it.
RESPAWNER = """
import os, signal, subprocess, sys, time
def respawn(*_):
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"],
                     start_new_session=True)
    time.sleep(0.3)
    os._exit(0)
signal.signal(signal.SIGTERM, respawn)
print("ready", flush=True)
time.sleep(120)
"""


def start_marked(marker: str) -> subprocess.Popen:
    name, value = marker.split("=", 1)
    proc = subprocess.Popen([sys.executable, "-c", RESPAWNER], env={**os.environ, name: value},
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def alive(marker: str) -> list[int]:
    out = []
    for pid in marked_pids(marker):
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def test_one_pass_leaves_a_successor_and_the_repeated_scan_does_not():
    marker = f"KIT_TEST_LEASE={uuid.uuid4().hex}"
    first = start_marked(marker)
    try:
        assert stop_pids(marked_pids(marker), grace_s=2) == 1
        first.wait(timeout=10)
        time.sleep(0.5)
        left = alive(marker)
        assert len(left) == 1, left           # the successor started while its parent was stopped

        second = start_marked(marker)
        started = time.monotonic()
        assert stop_marked(marker, grace_s=2) >= 2
        second.wait(timeout=10)
        assert alive(marker) == [], "a process carrying the marker outlived stop_marked"
        assert time.monotonic() - started < 20
    finally:
        for pid in alive(marker):
            os.kill(pid, 9)


# A marked parent whose child shows no marker (as a Ray agent that set its title shows none).
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={})
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_child_that_shows_no_marker_is_stopped_with_its_marked_parent():
    marker = f"KIT_TEST_LEASE={uuid.uuid4().hex}"
    name, value = marker.split("=", 1)
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env={**os.environ, name: value},
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(parent.stdout.readline())
    try:
        assert marked_pids(marker) == [parent.pid]
        assert with_descendants([parent.pid]) == sorted([parent.pid, child])
        assert stop_marked(marker, grace_s=2) == 2
        parent.wait(timeout=10)
        assert not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        for pid in (parent.pid, child):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


# A stand-in for the kit: takes a lease, names a marked sleeper in it and starts it, then waits to be
# killed (or, with "release", releases the lease itself and exits).
OWNER = """
import os, subprocess, sys, time
from pathlib import Path
from kit.runtimes.leases import Lease
lease = Lease.take(Path(sys.argv[1]), "watched")
name, value = sys.argv[2].split("=", 1)
lease.add({"kind": "processes", "marker": sys.argv[2], "what": "a sleeper"})
sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, name: value},
                           start_new_session=True)
print(sleeper.pid, lease._watcher.pid, flush=True)
if sys.argv[3] == "release":
    time.sleep(1.5)                      # the watcher must not fire while the kit lives
    print("alive" if sleeper.poll() is None else "stopped", flush=True)
    lease.release(grace_s=2)
    print(lease._watcher is None, flush=True)
else:
    time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_owners_watcher_stops_what_its_lease_names_and_removes_it(tmp_path):
    marker = f"KIT_TEST_LEASE={uuid.uuid4().hex}"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path), marker, "kill"], stdout=subprocess.PIPE,
                             text=True)
    sleeper, watcher = map(int, owner.stdout.readline().split())
    try:
        assert not _gone(watcher) and not _gone(sleeper)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (_gone(sleeper) and _gone(watcher)):
            time.sleep(0.1)
        assert _gone(sleeper), "the watcher did not stop the lease's process within 10 s"
        assert _gone(watcher), "the watcher outlived its cleanup"
        assert not (tmp_path / "leases" / "watched.json").exists()
    finally:
        for pid in (sleeper, watcher):
            if not _gone(pid):
                os.kill(pid, 9)


def test_a_watcher_stands_down_when_its_owner_releases_the_lease(tmp_path):
    marker = f"KIT_TEST_LEASE={uuid.uuid4().hex}"
    owner = subprocess.run([sys.executable, "-c", OWNER, str(tmp_path), marker, "release"], capture_output=True,
                           text=True, timeout=60)
    assert owner.returncode == 0, owner.stderr
    pids, fired, reaped = owner.stdout.split("\n")[:3]
    sleeper, watcher = map(int, pids.split())
    assert fired == "alive" and reaped == "True"       # not fired during the run; waited for, so no zombie
    assert _gone(sleeper) and _gone(watcher)
    assert not (tmp_path / "leases" / "watched.json").exists()
