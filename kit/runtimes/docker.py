"""The docker runtime: the arm's own image, a live container, a Ray head inside it, the job through the Jobs API.

Preflight refuses an image that was not built for the arm's stack (labels and embedded stack, listed),
starts the container (GPUs for CUDA through ``device_requests``, ``/dev/kfd`` and ``/dev/dri`` for
ROCm, never privileged), runs the probe inside the live container and refuses any difference from
the stack, then starts ``ray start --head`` inside and waits for the Jobs API.

The container uses the host's network (``network_mode="host"``), as multi-GPU engines expect. So that
its Ray head never collides with a Ray already running on the host (or with a parallel run), every
port Ray would otherwise take at a fixed default (GCS 6379, client server 10001, dashboard 8265, the
agents', the metrics port, the node and object managers) is chosen free on the host at start and
passed to ``ray start``; worker ports are left to the OS. The node address is 127.0.0.1 and the
dashboard binds only there. ``--network NAME`` puts the container on a named Docker network instead
and publishes the dashboard on 127.0.0.1. Example::

    rt = DockerRuntime(arm=arm, image=None, workspace=Path(".workspace"), run_id="r1")
    rt.preflight()            # image by stack label, container, probe, Ray head
    rt.describe()["ray_cluster"]["start_command"]
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from kit.adapters import docker as dockerdoor
from kit.adapters.ray import CLUSTER_INFO_SCRIPT, RayJob, wait_for_jobs_api
from kit.build import layout as L
from kit.build.lookup import image_for_arm
from kit.build.images import check_image, probe_differences
from kit.model.accelerators import node_sizes
from kit.model.documents import parse_json_bytes, require_valid
from kit.model.errors import BadInput, CheckFailed
from kit.model.holds import hold
from kit.runtimes.base import JobSpec, RayJobRuntime, free_port, free_ports, gpu_info, host_info

CONTAINER_DASHBOARD_PORT = 8265
RAY_TMP = "/tmp/ray"
HOST_NETWORK = "host"
# ray start flags that otherwise bind a fixed default port (or one shared by every Ray on a host)
RAY_PORT_FLAGS = ("--port", "--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port",
                  "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port",
                  "--node-manager-port", "--object-manager-port")


def ray_head_command(ray_bin: str = L.RAY, ports: dict[str, int] | None = None,
                     object_store_bytes: int | None = None) -> list[str]:
    """``ray start --head`` inside the container. With ``ports`` (host network) every fixed port is the
    given one and Ray listens on 127.0.0.1; without (a Docker network) the defaults inside the container's
    own network namespace, with the dashboard on all of its interfaces for the published port.
    ``object_store_bytes``: Ray's object store, sized as on Slurm and KubeRay (``node_sizes``)."""
    store = [f"--object-store-memory={object_store_bytes}"] if object_store_bytes else []
    if ports is None:
        return [ray_bin, "start", "--head", "--port=6379", "--dashboard-host=0.0.0.0",
                f"--dashboard-port={CONTAINER_DASHBOARD_PORT}", "--include-dashboard=true", "--disable-usage-stats",
                f"--temp-dir={RAY_TMP}", *store]
    return [ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
            *(f"{flag}={ports[flag]}" for flag in RAY_PORT_FLAGS), "--include-dashboard=true",
            "--disable-usage-stats", f"--temp-dir={RAY_TMP}", *store]


class DockerRuntime(RayJobRuntime):
    kind = "docker"

    def __init__(self, *, arm, image: str | None, workspace: Path, run_id: str, network: str | None = None,
                 input_mounts: dict[str, str] | None = None, **_):
        self.arm = arm
        self.image_ref = image
        self.workspace = Path(workspace).resolve()
        self.run_id = run_id
        self.network = network
        self.input_mounts = input_mounts or {}
        self.client = None
        self.container = None
        self.image_id = None
        self.image_labels: dict = {}
        self.observed = None
        self.start_command: list[str] | None = None
        self.cluster: dict | None = None
        self.address: str | None = None
        self.job: RayJob | None = None
        self.options_recorded: dict = {}
        self.ray_ports: dict[str, int] | None = None

    # --- preflight ------------------------------------------------------------------------------------

    def _find_image(self) -> str:
        return image_for_arm(self.client, self.arm)

    def resolve_image(self) -> str:
        """The image the run starts (``--image``, else the newest of the arm's stack and platform), checked
        against the stack by its labels and embedded stack; returns its id. ``kit suite`` calls this once
        for all its arms, so the suite refuses exactly what a run would. Names ``--image`` when it came
        from the flag."""
        named = self.image_ref is not None
        self.client = self.client or dockerdoor.engine()
        self.image_ref = self.image_ref or self._find_image()
        where = f"--image {self.image_ref}" if named else f"image {self.image_ref}"
        try:
            check = check_image(self.image_ref, self.arm.stack, client=self.client)
        except BadInput:
            if not named:
                raise
            raise BadInput(f"{where}: not on this engine; build the stack's image with `kit build "
                           f"{self.arm.platform} --arm {self.arm.name}`, or leave --image out to use it") from None
        if not check.matches:
            shown = "; ".join(f"{label}: expected {exp!r}, found {got!r}" for label, exp, got in check.differences[:12])
            raise CheckFailed(f"{where}: not built for stack {self.arm.stack.name} "
                              f"({self.arm.stack.sha256[:12]}); differing labels: {shown}")
        return check.image_id

    def preflight(self) -> None:
        self.resolve_image()
        image = self.client.images.get(self.image_ref)
        self.image_id, self.image_labels = image.id, dict(image.labels or {})
        self._start_container()
        self._probe()
        self._start_ray_head()

    @property
    def host_network(self) -> bool:
        return (self.network or HOST_NETWORK) == HOST_NETWORK

    def _start_container(self) -> None:
        opts = dockerdoor.container_options(self.arm.platform)
        volumes = {str(self.workspace): {"bind": L.WORKSPACE, "mode": "rw"}}
        for host_path, bind in self.input_mounts.items():
            volumes[str(Path(host_path).resolve())] = {"bind": bind, "mode": "ro"}
        run_kwargs = dict(
            image=self.image_id, entrypoint=["sleep", "infinity"], detach=True, name=f"rlk-run-{self.run_id}",
            environment={"RAY_USAGE_STATS_ENABLED": "0", "HOME": "/tmp"}, volumes=volumes,
            labels={f"{L.LABEL_PREFIX}.run-id": self.run_id}, **opts)
        if self.host_network:
            self.ray_ports = free_ports(RAY_PORT_FLAGS)
            run_kwargs["network_mode"] = HOST_NETWORK
            host_port = self.ray_ports["--dashboard-port"]
        else:
            host_port = free_port()
            run_kwargs["network"] = self.network
            run_kwargs["ports"] = {f"{CONTAINER_DASHBOARD_PORT}/tcp": ("127.0.0.1", host_port)}
        self.options_recorded = {k: (v if isinstance(v, (str, int, bool, list, dict)) else repr(v))
                                 for k, v in run_kwargs.items() if k not in ("environment",)}
        self.options_recorded["ulimits"] = [repr(u) for u in opts.get("ulimits", [])]
        self.options_recorded["device_requests"] = [repr(d) for d in opts.get("device_requests", [])]
        self.lease.add({"kind": "container", "name": run_kwargs["name"], "what": "the run's container"})
        self.container = self.client.containers.run(**run_kwargs)
        hold("container")
        self.address = f"http://127.0.0.1:{host_port}"

    def _exec(self, cmd: list[str], env: dict | None = None) -> tuple[int, str, str]:
        result = self.container.exec_run(cmd, environment=env or {}, demux=True)
        out, err = result.output
        return result.exit_code, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")

    def _probe(self) -> None:
        stack_doc = self.arm.stack.document
        code, out, err = self._exec(L.PROBE_COMMAND, {L.PROBE_STACK_ENV: json.dumps(stack_doc)})
        if code not in (0, 1):
            raise CheckFailed(f"kit probe in the live container of {self.image_ref} exited {code}: {err.strip()[-400:]}")
        source = f"probe output of the live container of {self.image_ref}"
        self.observed = require_valid(parse_json_bytes(out.encode(), source), source, "probe")
        differences = probe_differences(self.client, self.image_id, self.observed, stack_doc)
        if differences:
            shown = "; ".join(f"{f}: expected {e!r}, observed {o!r}" for f, e, o in differences[:12])
            raise CheckFailed(f"the live container of {self.image_ref} differs from stack {self.arm.stack.name}: {shown}")

    def _start_ray_head(self) -> None:
        code, _, _ = self._exec(["test", "-x", L.RAY])
        ray_bin = L.RAY if code == 0 else "ray"
        sizes = node_sizes(self.arm.platform, self.arm.document.get("topology", {}).get("gpus", 0))
        self.start_command = ray_head_command(ray_bin, self.ray_ports, sizes.object_store_bytes)
        code, out, err = self._exec(self.start_command, {"HOME": "/tmp", "RAY_TMPDIR": RAY_TMP,
                                                         "RAY_USAGE_STATS_ENABLED": "0"})
        if code != 0:
            raise CheckFailed(f"`{shlex.join(self.start_command)}` in the container exited {code}: {(err or out).strip()[-600:]}")
        wait_for_jobs_api(self.address)
        python = L.PYTHON if self._exec(["test", "-x", L.PYTHON])[0] == 0 else "python3"
        code, out, err = self._exec([python, "-c", CLUSTER_INFO_SCRIPT], {"HOME": "/tmp"})
        try:
            self.cluster = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.cluster = {"version": "unknown", "nodes": [], "resources": {}, "error": (err or out).strip()[-400:]}

    # --- manifest -------------------------------------------------------------------------------------

    def describe(self) -> dict:
        cluster = dict(self.cluster or {"version": "unknown", "nodes": [], "resources": {}})
        name = self.container.name if self.container else "?"
        cluster["address"] = (f"container {name} on the host network, dashboard at {self.address}" if self.host_network
                              else f"container {name}:{CONTAINER_DASHBOARD_PORT} published at {self.address}")
        cluster["start_command"] = self.start_command
        cluster["environment"] = {"HOME": "/tmp", "RAY_TMPDIR": RAY_TMP, "RAY_USAGE_STATS_ENABLED": "0"}
        return {"runtime": {"kind": self.kind, "container_name": self.container.name if self.container else None,
                            "container_id": self.container.id if self.container else None,
                            "network": self.network or HOST_NETWORK, "container_options": self.options_recorded},
                "image": {"ref": self.image_ref, "id": self.image_id, "labels": self.image_labels},
                "observed_identity": self.observed, "identity_differences": [],
                "host": host_info(), "gpus": self._gpus(), "ray_cluster": cluster}

    def _gpus(self) -> dict:
        found = gpu_info()
        if self.observed and self.observed.get("gpus"):
            found["container"] = self.observed["gpus"]
        return found

    # --- job ------------------------------------------------------------------------------------------

    def _alive(self) -> bool:
        try:
            self.container.reload()
            return self.container.status == "running"
        except Exception:
            return False

    def submit(self, spec: JobSpec) -> None:
        self.job = RayJob(self.address, alive=self._alive)
        self.job.submit(spec)

    def close(self) -> None:
        if self.container is None:
            return
        try:
            self.container.stop(timeout=5)
        except Exception:
            pass
        try:
            self.container.remove(force=True)
        except Exception:
            pass
        self.container_removed_at = time.time()
