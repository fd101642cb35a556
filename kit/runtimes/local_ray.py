"""The local runtime with a Ray head: the smoke arm as a Ray job (driver plus rollout and trainer
actors) on a single-node cluster that the kit starts before the run and stops after it.

The head runs as ``ray start --head --block`` in its own process group with its temp dir, ports
and HOME of its own, so it never touches another Ray on the host and is stopped by its group id.
As with the in-process local runtime, the host is not the pinned image: the node's identity
differences from the stack are recorded, not refused. Example::

    rt = LocalRayRuntime(arm=arm, run_id="r1")
    rt.preflight()     # starts the head, probes its node
    ...
    rt.close()         # stops the head
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kit.adapters.ray import token_auth_requested
from kit.model.engine_traits import traits
from kit.model.holds import hold
from kit.model.errors import BadInput, CheckFailed
from kit.runtimes.base import free_ports
from kit.runtimes.ray import RayRuntime
from kit.build.probe import identity_differences
from kit.runtimes.leases import stop_marked


HEAD_PORT_FLAGS = ("--port", "--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port",
                   "--metrics-export-port")


def ray_start_command(temp_dir: str, ports: dict, num_cpus: int) -> list[str]:
    """``ports``: a distinct port per flag of :data:`HEAD_PORT_FLAGS` (``free_ports(HEAD_PORT_FLAGS)``)."""
    # The head runs under the kit's own interpreter: Ray's workers inherit it, so they import the
    # same kit and kernels as the driver (a `ray` script found on PATH may belong to another Python).
    return [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
            f"--num-cpus={num_cpus}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
            f"--temp-dir={temp_dir}", *(f"{flag}={ports[flag]}" for flag in HEAD_PORT_FLAGS),
            "--disable-usage-stats"]


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def local_head_auth(env: dict, home: str) -> dict:
    """The Ray token-auth settings for the kit's local head, made explicit, since the head runs with a
    HOME of its own and would not find ``~/.ray/auth_token`` there (and Ray >= 2.52 turns token auth on
    in any process that ran ``ray.init()`` on a new local cluster).

    - ``RAY_AUTH_MODE`` other than ``token``: the head runs with ``RAY_AUTH_MODE=disabled``.
    - ``RAY_AUTH_MODE=token``: the head takes ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH`` as given, else
      the token in ``home`` (``home/.ray/auth_token``); with none of them, BadInput.

    ``local_head_auth({}, "/root") == {"RAY_AUTH_MODE": "disabled"}``"""
    if not token_auth_requested(env):
        return {"RAY_AUTH_MODE": "disabled"}
    if env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH"):
        return {"RAY_AUTH_MODE": "token"}
    token_file = Path(home) / ".ray" / "auth_token"
    if token_file.is_file():
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    raise BadInput(f"RAY_AUTH_MODE=token, but no Ray auth token: neither RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH nor "
                   f"{token_file} is set or present; accepted: one of them (`ray get-auth-token --generate` "
                   "writes the file), or RAY_AUTH_MODE unset or disabled for the kit's local head")


def local_no_proxy(env: dict) -> dict:
    """``env`` with the local head's addresses in NO_PROXY/no_proxy, so an HTTP(S)_PROXY never carries
    traffic to it: ``local_no_proxy({"NO_PROXY": "corp"})["NO_PROXY"] == "corp,127.0.0.1,localhost,::1"``."""
    out = dict(env)
    for name in ("NO_PROXY", "no_proxy"):
        have = [h for h in (out.get(name) or "").split(",") if h.strip()]
        out[name] = ",".join(have + [h for h in LOCAL_HOSTS if h not in have])
    return out


class LocalRayRuntime(RayRuntime):
    kind = "local"

    def __init__(self, *, arm, run_id: str, **_):
        if not traits(arm.engine).runs_on_host:
            raise BadInput(f"--ray-head: arm {arm.name} is a {arm.engine} arm; its engine does not run on the host")
        # short temp dir: Ray's socket paths must stay under 107 bytes
        self.temp_dir = tempfile.mkdtemp(prefix="rlk-ray-", dir="/tmp")
        ports = free_ports(HEAD_PORT_FLAGS)
        self.dashboard_port = ports["--dashboard-port"]
        self.start_command = ray_start_command(self.temp_dir, ports, max(2, os.cpu_count() or 2))
        super().__init__(arm=arm, ray_address=f"http://127.0.0.1:{self.dashboard_port}", run_id=run_id,
                         python=sys.executable)
        self.head: subprocess.Popen | None = None
        self.differences: list = []
        self.marker = f"RAY_TMPDIR={self.temp_dir}"

    def preflight(self) -> None:
        auth = local_head_auth(dict(os.environ), str(Path.home()))
        env = local_no_proxy({**os.environ, **auth, "RAY_USAGE_STATS_ENABLED": "0", "HOME": self.temp_dir,
                              "RAY_TMPDIR": self.temp_dir})
        env.pop("RAY_ADDRESS", None)
        os.environ.update({k: env[k] for k in ("NO_PROXY", "no_proxy")})   # the kit's own calls to the head too
        head_log = Path(self.temp_dir) / "kit-ray-head.log"
        # every process under the head inherits RAY_TMPDIR, whatever group or session it moves to
        self.lease.add({"kind": "processes", "marker": self.marker, "what": "the local Ray head"})
        self.lease.add({"kind": "temp-dir", "path": self.temp_dir, "what": "the local Ray head's temp dir"})
        with open(head_log, "wb") as out:
            self.head = subprocess.Popen(self.start_command, env=env, start_new_session=True,
                                         stdout=out, stderr=subprocess.STDOUT)
        hold("ray-head")
        deadline = time.monotonic() + 120
        while True:
            if self.head.poll() is not None:
                tail = head_log.read_text(errors="replace").strip().splitlines()[-12:]
                raise CheckFailed(f"the local Ray head exited with {self.head.returncode}: {' '.join(self.start_command)}"
                                  + ("\n  " + "\n  ".join(tail) if tail else ""))
            try:
                self.cluster = self.probe_cluster()
                break
            except CheckFailed:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        node = self.cluster["nodes"][0]["identity"] if self.cluster["nodes"] else {}
        self.differences = [list(d) for d in identity_differences(node, self.arm.stack.document)]

    def describe(self) -> dict:
        out = super().describe()
        out["runtime"] = {"kind": self.kind, "ray_head": True, "address": self.address,
                          "note": "a single-node Ray head the kit started on the host and stopped after the run; "
                                  "the host is not the pinned image: identity differences are recorded, not refused"}
        out["identity_differences"] = self.differences
        out["ray_cluster"]["start_command"] = list(self.start_command)
        out["ray_cluster"]["note"] = "started and stopped by the kit for this run"
        return out

    def job_argv(self, plan: dict, host_run_dir: str) -> list[str]:
        argv = super().job_argv(plan, host_run_dir)
        return [sys.executable, *argv[1:]]

    def close(self) -> None:
        super().close()
        if self.head is not None and self.head.poll() is None:
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.head.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.head.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # the job's driver and actors run in groups and sessions of their own: stop any the head left
        stop_marked(self.marker)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
