"""Leases: what a run started (a Ray head and every process under it, a container, a temp dir),
recorded in ``<workspace>/leases/<run-id>.json`` (``rlk-kit/run-lease/v1``) *before* it is started.

A run that ends, even by Ctrl-C or SIGTERM, stops what it started and removes its lease. A run
killed with SIGKILL cannot, so from the first resource it adds, a watcher process stands by: the kit
holds the only write end of a pipe to it, and when the pipe ends without a word (or the watcher's
parent changes) the kit is dead and the watcher releases the lease itself, within seconds. The next
``kit run`` or ``kit doctor`` in the workspace remains the net: it stops what a dead run's lease still
names (a watcher killed too) and removes it. Processes are found by
a marker in their environment (every process a Ray head starts inherits it, whatever process group
or session it moved to) and as descendants of a marked one (a process that sets its title hides its
environment), containers by name. Example::

    lease = Lease.take(Path("ws"), "r1")                     # ws/leases/r1.json, owner: this process
    lease.add({"kind": "processes", "marker": "RAY_TMPDIR=/tmp/rlk-ray-x", "what": "the local Ray head"})
    ...                                                      # start it
    lease.release()                                          # stops leftovers, stands the watcher down, removes the file
    reap_stale(Path("ws"))                                   # what dead runs' leases named, now stopped
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from kit.adapters import docker as dockerdoor
from kit.model.documents import read_json_file, replace_document, schema_id
from kit.model.errors import KitError

LEASES_DIR = "leases"
# set in the kit's environment while a run holds its lease: every process it starts on the host inherits it
LEASE_ENV = "RLK_KIT_LEASE"
LEASE_SCHEMA = schema_id("run-lease")
TEMP_PREFIX = "/tmp/rlk-ray-"        # the only temp dirs a lease may remove
GRACE_S = 10.0
KILL_WAIT_S = 3.0    # how long a SIGKILLed process may take to go (one in uninterruptible I/O)
WATCH_POLL_S = 0.5   # how often the watcher looks at its parent besides waiting on the pipe
WATCH_GRACE_S = 3.0  # the watcher's SIGTERM grace: what a dead kit started is gone within 10 s
RELEASED = b"released"   # what the kit writes to its watcher once it released the lease itself


def process_start(pid: int) -> int | None:
    """The kernel's start time of ``pid`` in clock ticks (tells a live owner from a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def marked_pids(marker: str) -> list[int]:
    """Every process whose environment holds the entry ``marker`` (``NAME=value``), this one excepted."""
    entry = marker.encode()
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            env = (proc / "environ").read_bytes()
        except OSError:
            continue
        if entry in env.split(b"\0"):
            out.append(int(proc.name))
    return out


def stop_pids(pids: list[int], grace_s: float = GRACE_S) -> int:
    """SIGTERM, then SIGKILL what is left after ``grace_s``, and wait (briefly) until the killed are
    gone: a SIGKILL lands asynchronously. Returns how many were alive."""
    alive = [p for p in pids if not _zombie(p) and _signal(p, signal.SIGTERM)]
    started = len(alive)
    for sig, wait_s in ((None, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if sig is not None:
            for p in alive:
                _signal(p, sig)
        deadline = time.monotonic() + wait_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if not _zombie(p)]   # a gone pid reads as a zombie too
    return started


def with_descendants(pids: list[int]) -> list[int]:
    """``pids`` and every process below them. A child need not show its parent's marker: a process
    that sets its title (Ray's agents, ``ray::DashboardAgent``) overwrites the memory that
    ``/proc/<pid>/environ`` reads, so only its parent ties it to the run."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    out, todo = set(pids), list(pids)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out and child != os.getpid():
                out.add(child)
                todo.append(child)
    return sorted(out)


def stop_marked(marker: str, grace_s: float = GRACE_S, rounds: int = 5) -> int:
    """Stop every process whose environment holds ``marker``, and every process below one, until
    none is left; returns how many.

    The scan repeats: a process can start while others are being stopped (the raylet starts a worker
    again when one dies) and it carries the marker too."""
    stopped = 0
    for _ in range(rounds):
        pids = [p for p in with_descendants(marked_pids(marker)) if not _zombie(p)]
        if not pids:
            break
        stopped += stop_pids(pids, grace_s)
    return stopped


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class Lease:
    """One run's record of what it started; ``Lease.none()`` keeps it in memory only (tests, attach)."""

    def __init__(self, path: Path | None, doc: dict):
        self.path, self.doc = path, doc
        self._watcher: subprocess.Popen | None = None
        self._watch_fd: int | None = None

    @classmethod
    def none(cls) -> "Lease":
        return cls(None, {"resources": []})

    @classmethod
    def take(cls, workspace: Path, run_id: str) -> "Lease":
        """The run's lease, written before anything starts; from now on every child process carries its marker."""
        marker = f"{run_id}.{os.getpid()}"
        doc = {"schema": LEASE_SCHEMA, "run_id": run_id, "host": socket.gethostname(),
               "owner": {"pid": os.getpid(), "start": process_start(os.getpid())},
               "resources": [{"kind": "processes", "marker": f"{LEASE_ENV}={marker}",
                              "what": "the processes the run started on this host"}]}
        path = Path(workspace) / LEASES_DIR / f"{run_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_document(path, doc, expected="run-lease")
        os.environ[LEASE_ENV] = marker
        return cls(path, doc)

    def add(self, resource: dict) -> None:
        """Record a resource before starting it, so a kill in between still leaves it named."""
        self.doc["resources"].append(resource)
        if self.path is not None:
            replace_document(self.path, self.doc, expected="run-lease")
            if self._watcher is None:
                self._watch()

    def _watch(self) -> None:
        """Start the watcher that releases this lease if the kit dies (see :func:`watch`)."""
        read_fd, write_fd = os.pipe()      # not inherited by what the kit starts later: only the kit holds write_fd
        # the watcher carries no lease marker, so stopping the run's processes never stops it
        env = {k: v for k, v in os.environ.items() if k != LEASE_ENV}
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            self._watcher = subprocess.Popen(
                [sys.executable, "-c", "import sys; from kit.runtimes.leases import watch; watch(*sys.argv[1:])",
                 str(self.path), str(read_fd), str(os.getpid()), str(process_start(os.getpid()))],
                pass_fds=(read_fd,), env=env, start_new_session=True,    # Ctrl-C of the kit's group is the kit's
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self._watch_fd = write_fd
        except OSError:
            os.close(write_fd)     # no watcher: the next kit command is still the net
        finally:
            os.close(read_fd)

    def _stand_down(self) -> None:
        """Tell the watcher the kit released the lease itself, and reap it."""
        if self._watcher is None:
            return
        try:
            os.write(self._watch_fd, RELEASED)
        except OSError:
            pass
        os.close(self._watch_fd)
        try:
            self._watcher.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._watcher.kill()
            self._watcher.wait()
        self._watcher = self._watch_fd = None

    def release(self, grace_s: float = GRACE_S) -> list[str]:
        """Stop whatever the run's resources left running; remove the lease. Returns what was stopped."""
        stopped = stop_resources(self.doc["resources"], grace_s)
        self._stand_down()
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            if os.environ.get(LEASE_ENV) == self.doc["resources"][0]["marker"].split("=", 1)[1]:
                os.environ.pop(LEASE_ENV, None)
        return stopped


def stop_resources(resources: list[dict], grace_s: float = GRACE_S) -> list[str]:
    """Stop each resource a lease names (never raises: one that cannot be stopped is said so)."""
    done = []
    for res in resources:
        try:
            if res["kind"] == "processes":
                n = stop_marked(res["marker"], grace_s)
                if n:
                    done.append(f"{n} process(es) of {res['what']}")
            elif res["kind"] == "container":
                if _remove_container(res["name"]):
                    done.append(f"container {res['name']}")
            elif res["kind"] == "temp-dir" and res["path"].startswith(TEMP_PREFIX) and os.path.isdir(res["path"]):
                shutil.rmtree(res["path"], ignore_errors=True)
                done.append(f"temp dir {res['path']}")
        except (OSError, KitError, KeyError) as exc:
            done.append(f"could not stop {res.get('kind')} {res.get('name') or res.get('marker')}: {exc}")
    return done


def _remove_container(name: str) -> bool:
    try:
        container = dockerdoor.engine().containers.get(name)
    except KitError:
        return False      # no engine answers: nothing of ours can run there
    except Exception:     # docker's NotFound: already gone
        return False
    container.remove(force=True)
    return True


def reap_stale(workspace: Path) -> list[tuple[str, list[str]]]:
    """Stop what the leases of dead runs on this host name, and remove them: ``[(run_id, stopped), ...]``."""
    folder = Path(workspace) / LEASES_DIR
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = read_json_file(path)
            owner, host = doc["owner"], doc["host"]
        except (KitError, KeyError, TypeError):
            continue        # not a lease this kit wrote: left alone
        if host != socket.gethostname() or process_start(owner["pid"]) == owner["start"]:
            continue        # another host's run, or a run still going
        out.append((str(doc.get("run_id")), Lease(path, doc).release()))
    return out


def watch(lease_path: str, fd: str, owner_pid: str, owner_start: str) -> None:
    """The watcher's body (its own process, started by ``Lease.add``): wait until the kit that holds
    the lease either says it released it (then exit) or dies (then release it, as the next kit
    command would, with a shorter grace). The kit's death shows as the pipe's end without a word, or
    as a new parent (a forked child of the kit could keep the pipe open)."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    read_fd, owner = int(fd), int(owner_pid)
    while os.getppid() == owner:
        ready, _, _ = select.select([read_fd], [], [], WATCH_POLL_S)
        if ready:
            if os.read(read_fd, len(RELEASED)):
                return                      # the kit released the lease itself
            break                           # end of pipe: the kit is gone
    path = Path(lease_path)
    try:
        doc = read_json_file(path)
        if doc["owner"]["pid"] != owner or str(doc["owner"]["start"]) != owner_start:
            return                          # not this kit's lease any more
    except (KitError, KeyError, TypeError):
        return                              # already released (by the next kit command)
    Lease(path, doc).release(WATCH_GRACE_S)
