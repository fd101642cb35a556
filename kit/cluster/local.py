"""A local Ray cluster of N containers of an arm's pinned image: one head and N-1 workers on a
user-defined Docker network, each started with its declared node identity (environment and Ray node
labels). The state file ``<workspace>/cluster/state.json`` (rlk-kit/cluster-state/v1) is written
before anything is created and after each step, and every container and the network carry the label
``dev.rlk-kit.cluster=<id>``, so ``down`` removes exactly what ``up`` made, also after a crash.

Example::

    state = up(arm, nodes=3, workspace=Path(".workspace"))
    # kit run --arm smoke --runtime ray --ray-address state["address"]
    down(Path(".workspace"))
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from kit.build import layout as L
from kit.adapters.docker import engine
from kit.model import node_identity as NI
from kit.model.documents import read_json_file, replace_document, require_valid
from kit.model.errors import BadInput, CheckFailed
from kit.adapters.ray import wait_for_jobs_api
from kit.runtimes.base import free_port
import socket
from kit.build.images import check_image
from kit.build.lookup import image_for_arm
from kit.adapters.docker import container_options

CLUSTER_LABEL = f"{L.LABEL_PREFIX}.cluster"
DASHBOARD_PORT = 8265
GCS_PORT = 6379
RAY_TMP = "/tmp/ray"


def state_path(workspace: Path) -> Path:
    return Path(workspace) / "cluster" / "state.json"


def read_state(workspace: Path) -> dict | None:
    """The workspace's cluster state, or None when no cluster was ever started there."""
    path = state_path(workspace)
    if not path.exists():
        return None
    return require_valid(read_json_file(path), str(path), "cluster-state")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _save(workspace: Path, state: dict) -> None:
    path = state_path(workspace)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_document(path, dict(state, updated_at=_now()), expected="cluster-state")


def ray_start_command(role: str, identity: dict, head: str | None = None) -> list[str]:
    """``ray start`` for a head or a worker (blocking: the container lives as long as its raylet)."""
    common = ["--block", "--disable-usage-stats", f"--labels={NI.labels_flag(identity)}"]
    if role == "head":
        return [L.RAY, "start", "--head", f"--port={GCS_PORT}", "--dashboard-host=0.0.0.0",
                f"--dashboard-port={DASHBOARD_PORT}", "--include-dashboard=true", f"--temp-dir={RAY_TMP}", *common]
    return [L.RAY, "start", f"--address={head}:{GCS_PORT}", *common]


def alive_nodes(address: str) -> int:
    """Alive nodes as the head's state API counts them (0 while it does not answer)."""
    try:
        with urllib.request.urlopen(f"{address}/api/v0/nodes?limit=1000", timeout=5) as resp:
            rows = json.load(resp)["data"]["result"]["result"]
        return sum(1 for r in rows if r.get("state") == "ALIVE")
    except Exception:
        return 0


def up(arm, *, nodes: int, workspace: Path, image: str | None = None, worker_images: list[str] | None = None,
       log: Callable[[str], None] = lambda s: None, timeout_s: float = 180.0) -> dict:
    """Start the cluster; returns its state (status ``up``). ``worker_images[i]`` replaces the image of
    worker i+1 (a rehearsal of a node from another image: ``kit run`` must refuse it)."""

    if nodes < 2:
        raise BadInput(f"--local {nodes}: a cluster has at least 2 nodes (one head, one worker)")
    worker_images = list(worker_images or [])
    if len(worker_images) > nodes - 1:
        raise BadInput(f"--worker-image given {len(worker_images)} times for {nodes - 1} workers")
    previous = read_state(workspace)
    if previous and previous["status"] != "down":
        raise BadInput(f"{state_path(workspace)}: cluster {previous['cluster_id']} is {previous['status']}; "
                       "run `kit cluster down` first")
    client = engine()
    head_ref = image or image_for_arm(client, arm)
    check = check_image(head_ref, arm.stack, client=client)
    if not check.matches:
        shown = "; ".join(f"{label}: expected {exp!r}, found {got!r}" for label, exp, got in check.differences[:6])
        raise CheckFailed(f"image {head_ref} was not built for stack {arm.stack.name}: {shown}")
    refs = [head_ref] + [worker_images[i] if i < len(worker_images) else head_ref for i in range(nodes - 1)]
    images = {}
    for ref in dict.fromkeys(refs):
        try:
            images[ref] = client.images.get(ref)
        except Exception:
            raise BadInput(f"image {ref}: not on this engine (`docker images` lists what is)") from None

    cluster_id = f"c{uuid.uuid4().hex[:10]}"
    prefix = f"rlk-cluster-{cluster_id}"
    state = {"schema": "rlk-kit/cluster-state/v1", "cluster_id": cluster_id, "status": "starting",
             "created_at": _now(), "arm": arm.name, "stack": {"name": arm.stack.name, "sha256": arm.stack.sha256},
             "network": {"name": prefix, "id": None}, "nodes": [], "address": None, "timing_s": {}}
    _save(workspace, state)
    labels = {CLUSTER_LABEL: cluster_id}
    started = time.monotonic()
    try:
        network = client.networks.create(prefix, driver="bridge", labels=labels)
        state["network"]["id"] = network.id
        _save(workspace, state)
        port = free_port()
        head_name = f"{prefix}-head"
        for index, ref in enumerate(refs):
            role = "head" if index == 0 else "worker"
            name = head_name if index == 0 else f"{prefix}-worker-{index}"
            img = images[ref]
            ident = NI.node_identity(name=name, image_ref=ref, image_id=img.id, labels=img.labels, host=_host())
            command = ray_start_command(role, ident, head_name)
            kwargs = dict(image=img.id, entrypoint=command[:1], command=command[1:], detach=True, name=name,
                          hostname=name, network=prefix, labels=labels,
                          # a raylet that does not register within Ray's fixed 30 s (a loaded host) exits 1: start it again
                          restart_policy={"Name": "on-failure", "MaximumRetryCount": 3},
                          environment={"HOME": "/tmp", "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": RAY_TMP,
                                       NI.ENV: json.dumps(ident, sort_keys=True)},
                          **_container_options(arm.platform))
            if role == "head":
                kwargs["ports"] = {f"{DASHBOARD_PORT}/tcp": ("127.0.0.1", port)}
            container = client.containers.run(**kwargs)
            state["nodes"].append({"name": name, "role": role, "container_id": container.id, "ray_start": command,
                                   "identity": ident})
            _save(workspace, state)
            if role == "head":
                state["address"] = f"http://127.0.0.1:{port}"
                wait_for_jobs_api(state["address"], timeout_s=timeout_s)
                state["timing_s"]["head_s"] = round(time.monotonic() - started, 3)
                log(f"head {name} up at {state['address']} ({state['timing_s']['head_s']:.1f} s)")
        deadline = time.monotonic() + timeout_s
        while (alive := alive_nodes(state["address"])) < nodes:
            if time.monotonic() > deadline:
                raise CheckFailed(f"cluster {cluster_id}: {alive} of {nodes} Ray nodes alive after {timeout_s:.0f} s; "
                                  f"see `docker logs {prefix}-worker-1`; `kit cluster down` removes it")
            time.sleep(0.5)
        state["timing_s"]["up_s"] = round(time.monotonic() - started, 3)
        state["status"] = "up"
        _save(workspace, state)
        log(f"{nodes} nodes alive ({state['timing_s']['up_s']:.1f} s)")
        return state
    except BaseException as exc:
        state["status"] = "failed"
        state["message"] = f"{type(exc).__name__}: {exc}"[:500]
        _save(workspace, state)
        raise


def _host() -> str:
    return socket.gethostname()


def _container_options(platform: str) -> dict:
    return container_options(platform)


def down(workspace: Path, *, log: Callable[[str], None] = lambda s: None) -> dict | None:
    """Remove every container and the network of the workspace's cluster: those in the state file and
    any carrying its label (a crash between creating one and recording it). None when there is none."""
    state = read_state(workspace)
    if state is None:
        return None
    client = engine()
    started = time.monotonic()
    selector = {"label": f"{CLUSTER_LABEL}={state['cluster_id']}"}
    ids = {n["container_id"] for n in state["nodes"] if n.get("container_id")}
    found = {c.id: c for c in client.containers.list(all=True, filters=selector)}
    for cid in ids | set(found):
        try:
            (found.get(cid) or client.containers.get(cid)).remove(force=True)
            log(f"removed container {cid[:12]}")
        except Exception as exc:
            if "404" not in str(exc) and "No such container" not in str(exc):
                raise CheckFailed(f"cluster {state['cluster_id']}: container {cid[:12]} could not be removed: {exc}")
    for net in client.networks.list(filters=selector):
        net.remove()
        log(f"removed network {net.name}")
    state["status"] = "down"
    state["timing_s"] = dict(state.get("timing_s", {}), down_s=round(time.monotonic() - started, 3))
    _save(workspace, state)
    return state


def leftovers(client, cluster_id: str) -> list[str]:
    """Containers and networks still labelled with ``cluster_id`` (after down: none)."""
    selector = {"label": f"{CLUSTER_LABEL}={cluster_id}"}
    return ([f"container {c.name}" for c in client.containers.list(all=True, filters=selector)]
            + [f"network {n.name}" for n in client.networks.list(filters=selector)])
