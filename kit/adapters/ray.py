"""The one door to Ray: the Jobs API client, the dashboard's version endpoint, and the scripts that run
inside a cluster. No other module of the kit imports the Ray SDK, and none calls its private methods.

The SDK is imported only when a job is submitted or followed (it takes about a second to import).
Example::

    wait_for_jobs_api("http://127.0.0.1:8265", timeout_s=20)
    job = RayJob("http://127.0.0.1:8265")
    job.submit(spec)                       # spec: submission_id, entrypoint, env_vars, working_dir, metadata
    job.follow(print, lambda: False)       # 'SUCCEEDED'
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.request
from typing import Callable

from kit.model.errors import BadInput, CheckFailed

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# How long a cluster the user named (--ray-address, a detached run's address) may take to answer before
# it counts as unreachable; a head the kit starts itself gets wait_for_jobs_api's longer default.
NAMED_CLUSTER_TIMEOUT_S = 20.0

# Run by the head's python inside a container: the cluster's facts for the manifest.
CLUSTER_INFO_SCRIPT = """
import json, ray
ray.init(address="auto", logging_level="ERROR")
nodes = [{"node_id": n["NodeID"], "alive": n["Alive"], "address": n["NodeManagerAddress"],
          "hostname": n.get("NodeManagerHostname"), "resources": n.get("Resources", {})} for n in ray.nodes()]
print(json.dumps({"version": ray.__version__, "nodes": nodes, "resources": ray.cluster_resources()}))
"""

PROBE_MARKER = "RLK-NODE-PROBE "
# Run as a Jobs API job: the probe on every alive node, each pinned to its node.
NODE_PROBE_SCRIPT = """
import json, os, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address="auto", logging_level="ERROR")
stack = json.loads(os.environ["KIT_PROBE_STACK"])

@ray.remote(num_cpus=0)
def probe(stack):
    # with the conformance fingerprint: a node whose strict kernels give other bytes differs from the rest
    from kit.build.probe import observed_identity
    declared = os.environ.get("RLK_NODE_IDENTITY")   # set by whoever started the node (kit cluster up, Slurm, KubeRay)
    return observed_identity(stack), json.loads(declared) if declared else None

nodes = [n for n in ray.nodes() if n["Alive"]]
refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(stack)
        for n in nodes]
identities = ray.get(refs, timeout=600)
out = {"version": ray.__version__, "resources": ray.cluster_resources(),
       "nodes": [{"node_id": n["NodeID"], "address": n["NodeManagerAddress"], "hostname": n.get("NodeManagerHostname"),
                  "resources": n.get("Resources", {}), "labels": n.get("Labels", {}), "identity": ident,
                  "node_identity": declared} for n, (ident, declared) in zip(nodes, identities)]}
print("RLK-NODE-PROBE " + json.dumps(out, sort_keys=True), flush=True)
"""

# Loggers of the Jobs SDK that print at INFO on the user's terminal ("Uploading package ...", "Creating a
# file package ..."). Some set their own level, so quieting their parent "ray" is not enough.
RAY_SDK_LOGGERS = ("ray", "ray.dashboard", "ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk",
                   "ray._private.runtime_env.packaging", "ray._private.runtime_env.working_dir",
                   "ray._private.runtime_env.py_modules")


def quiet_ray_sdk_logs() -> None:
    """Raise every Ray logger of this process to WARNING: the kit reports progress itself, and
    ``--json`` output must be the only thing a script reads (stderr stays empty)."""
    names = set(RAY_SDK_LOGGERS) | {n for n in logging.Logger.manager.loggerDict if n == "ray" or n.startswith("ray.")}
    for name in names:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET or logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


def jobs_client(address: str):
    """A ``JobSubmissionClient`` for a dashboard URL (imports the SDK: about a second); CheckFailed naming
    the address when no dashboard answers there."""
    from ray.job_submission import JobSubmissionClient   # heavy: only when a cluster is talked to

    quiet_ray_sdk_logs()
    # The SDK prefers an exported RAY_ADDRESS to the address it is given: hide it, so the kit talks to the
    # cluster it chose (its own local head, or --ray-address), not to whatever the host's shell names.
    exported = os.environ.pop("RAY_ADDRESS", None)
    try:
        return JobSubmissionClient(address)
    except ConnectionError as exc:      # the SDK's own (requests') ConnectionError derives from it
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CheckFailed(f"Ray at {address}: no Jobs API answers ({said})") from None
    finally:
        if exported is not None:
            os.environ["RAY_ADDRESS"] = exported


def token_auth_requested(env) -> bool:
    """Whether ``env`` asks Ray for token authentication (``RAY_AUTH_MODE=token``, any case)."""
    return (env.get("RAY_AUTH_MODE") or "").strip().lower() == "token"


def auth_headers() -> dict:
    """The ``Authorization`` header Ray's own clients send when ``RAY_AUTH_MODE=token`` (the token from
    RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token); ``{}`` otherwise, without importing Ray."""
    if not token_auth_requested(os.environ):
        return {}
    from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

    return dict(get_auth_headers_if_auth_enabled({}))


def _get(url: str, timeout_s: float):
    return urllib.request.urlopen(urllib.request.Request(url, headers=auth_headers()), timeout=timeout_s)


def dashboard_version(address: str, timeout_s: float = 10.0) -> dict:
    """The dashboard's public ``/api/version`` answer: ``{"version", "ray_version", "ray_commit", ...}``.

    Raises OSError or ValueError when nothing (or no JSON) answers."""
    with _get(f"{address.rstrip('/')}/api/version", timeout_s) as resp:
        return json.loads(resp.read().decode())


def address_problem(address: str) -> str | None:
    """What is wrong with a dashboard URL as written, or None (pure: no look-up).

    ``address_problem("http://head:8265")`` is None; ``address_problem("")`` names what is accepted."""
    from urllib.parse import urlsplit

    accepted = "give the dashboard's URL, http(s)://HOST:PORT (e.g. http://127.0.0.1:8265)"
    if not address or not address.strip():
        return f"empty; {accepted}"
    if address != address.strip() or any(c.isspace() for c in address):
        return f"contains white space; {accepted}"
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError as exc:
        return f"{exc}; {accepted}"
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme or '(none)'!r} is not http or https; {accepted}"
    if not parts.hostname:
        return f"names no host; {accepted}"
    if port == 0:
        return f"port 0; {accepted}"
    return None


def check_address(address: str, flag: str = "--address", *, resolve=None) -> str:
    """``address`` when it is a dashboard URL whose host resolves; BadInput naming ``flag`` at once
    otherwise (a host that does not resolve never answers: waiting on it only spends the timeout).
    ``resolve`` is the name look-up (default: socket.getaddrinfo)."""
    import socket
    from urllib.parse import urlsplit

    problem = address_problem(address)
    if problem:
        raise BadInput(f"{flag} {address!r}: {problem}")
    host = urlsplit(address).hostname
    try:
        (resolve or socket.getaddrinfo)(host, None)
    except (OSError, UnicodeError) as exc:
        raise BadInput(f"{flag} {address}: host {host!r} does not resolve ({exc}); give a host name or IP "
                       "address this machine can reach") from None
    return address


def wait_for_jobs_api(address: str, timeout_s: float = 90.0, *, unreachable=None) -> None:
    """Poll until the dashboard's Jobs API answers (the head takes several seconds to come up).

    ``unreachable`` is the error class raised when it never answers: CheckFailed (default) for a head
    the kit started itself, BadInput for an address the user named."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with _get(f"{address}/api/version", 3) as resp:
                if resp.status == 200:
                    return
        except Exception as exc:
            last = str(exc)
        time.sleep(0.5)
    raise (unreachable or CheckFailed)(f"the Ray Jobs API at {address} did not answer within {timeout_s:.0f} s ({last})")


class RayJob:
    """One job on a cluster through the Jobs API: submit, stream logs, terminal status, stop.

    The log is polled with ``get_job_logs`` and only the new tail is emitted, so a dashboard that
    restarts or a slow reader never duplicates or drops lines. A cluster that stops answering for
    ``lost_after_s`` is reported as ``LOST`` (the job's fate is unknown: never counted as success).
    """

    def __init__(self, address: str, *, lost_after_s: float = 10.0, poll_s: float = 0.5,
                 alive: Callable[[], bool] | None = None):
        self.address = address
        self.alive = alive
        self.client = jobs_client(address)
        self.lost_after_s = lost_after_s
        self.poll_s = poll_s
        self.submission_id: str | None = None
        self._seen = 0
        self._partial = ""

    @classmethod
    def existing(cls, address: str, submission_id: str, **kw) -> "RayJob":
        """A job submitted earlier (``kit run --detach``), followed by its submission id."""
        job = cls(address, **kw)
        job.submission_id = submission_id
        return job

    def status(self) -> str:
        return str(self.client.get_job_status(self.submission_id).value)

    def submit(self, spec) -> str:
        """Submit a ``kit.runtimes.JobSpec`` (entrypoint, submission id, env vars, working dir, metadata)."""
        quiet_ray_sdk_logs()     # packaging modules are imported lazily, on the first upload
        runtime_env: dict = {"env_vars": dict(spec.env_vars)}
        if spec.working_dir:
            runtime_env["working_dir"] = spec.working_dir
        try:
            self.submission_id = self.client.submit_job(entrypoint=spec.entrypoint,
                                                        submission_id=spec.submission_id,
                                                        runtime_env=runtime_env, metadata=dict(spec.metadata))
        except RuntimeError as err:
            # Ray's head retries its call to the job agent when the agent answers slowly (a loaded
            # machine); the retry then finds the job the first call registered. That job is ours
            # when it carries our entrypoint: follow it. Anything else is the cluster refusing.
            if "already exists" in str(err) and self._is_ours(spec):
                self.submission_id = spec.submission_id
                return self.submission_id
            raise CheckFailed(f"Ray job submission {spec.submission_id!r} to {self.address} was refused: "
                              f"{_last_line(str(err))}") from None
        return self.submission_id

    def _is_ours(self, spec) -> bool:
        try:
            info = self.client.get_job_info(spec.submission_id)
        except RuntimeError:
            return False
        return info.entrypoint == spec.entrypoint

    def _drain(self, emit: Callable[[str], None], final: bool = False) -> None:
        text = self.client.get_job_logs(self.submission_id)
        if len(text) < self._seen:
            # The job log got shorter: Ray restarted it. Read it again from the start; any step record
            # it repeats then fails the steps-once gate, which is right: the log no longer vouches
            # that each step ran once.
            self._seen = 0
        new = text[self._seen:]
        self._seen = len(text)
        buf = self._partial + new
        lines = buf.split("\n")
        self._partial = lines.pop()
        for line in lines:
            emit(line)
        if final and self._partial:
            emit(self._partial)
            self._partial = ""

    def follow(self, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> str:
        last_ok = time.monotonic()
        stopping = False
        while True:
            if should_stop() and not stopping:
                stopping = True
                self.stop()
            try:
                status = str(self.client.get_job_status(self.submission_id).value)
                self._drain(emit)
                last_ok = time.monotonic()
            except Exception:
                if time.monotonic() - last_ok > self.lost_after_s or (self.alive is not None and not self.alive()):
                    if self._partial:
                        emit(self._partial)
                    return "LOST"
                time.sleep(self.poll_s)
                continue
            if status in TERMINAL:
                try:
                    self._drain(emit, final=True)
                except Exception:
                    pass
                return status
            time.sleep(self.poll_s)

    def stop(self) -> None:
        if self.submission_id:
            try:
                self.client.stop_job(self.submission_id)
            except Exception:
                pass

    def info(self) -> dict:
        try:
            info = self.client.get_job_info(self.submission_id)
            return {"status": str(info.status.value), "message": info.message, "metadata": dict(info.metadata or {}),
                    "start_time_ms": info.start_time, "end_time_ms": info.end_time}
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip() and line.strip() != "."]
    return lines[-1] if lines else text.strip()
