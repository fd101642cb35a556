"""Slurm: an sbatch script that starts a Ray cluster of the arm's pinned image across the job's nodes
(head on the first node, workers on the rest through srun), waits for every node, runs ``kit run``
against the head, and removes every container it started, whatever the outcome.

The script calls itself on each node (``bash SCRIPT node head|worker``), so it must sit on a path
every node sees (the workspace). The image is named by digest: for docker the local image id, for
pyxis/enroot and apptainer a registry reference ``…@sha256:…``. Device flags come from
:mod:`kit.model.accelerators`. Example::

    doc = prepare(arm, nodes=2, image=None, container_runtime="docker", workspace=Path(".workspace").resolve(),
                  kit_command="python3 -m kit")
    submit(doc)["job"]["exit_code"]      # 0: kit run sealed the run
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Callable

from kit.build import layout as L
from kit.model import node_identity as NI
from kit.cluster.mounts import INPUT_TARGETS, node_mounts
from kit.model.accelerators import accelerator, docker_run_flags, node_sizes
from kit.model.errors import BadInput, CheckFailed
from kit.adapters.docker import engine
from kit.build.lookup import image_for_arm

RUNTIMES = ("docker", "pyxis", "apptainer")
JOB_LABEL = f"{L.LABEL_PREFIX}.slurm-job"
# ray start flags given a port when --port-base is set, in this order from the base
PORT_FLAGS = ("--port", "--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port",
              "--node-manager-port", "--object-manager-port")
DIGEST_REF = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")


def ports(port_base: int | None) -> dict[str, int] | None:
    """The head's ports from ``port_base`` (None: Ray's defaults, GCS 6379 and dashboard 8265)."""
    if port_base is None:
        return None
    if not 1024 <= port_base <= 65535 - len(PORT_FLAGS):
        raise BadInput(f"--port-base {port_base}: give a port in 1024..{65535 - len(PORT_FLAGS)}")
    return {flag: port_base + i for i, flag in enumerate(PORT_FLAGS)}


def node_command(container_runtime: str, platform: str, image: str, gpus: int,
                 mounts: list[tuple[str, str, str]] = (), shm_bytes: int | None = None) -> str:
    """The shell text that starts ``$RAY_ARGS`` (an array) in the image on this node, in the foreground,
    with ``mounts`` ((host, container, ro|rw), kit/cluster/mounts.py) in each runtime's own syntax."""
    acc = accelerator(platform)
    q = shlex.quote
    env = f'-e HOME=/tmp -e RAY_USAGE_STATS_ENABLED=0 -e {NI.ENV}="$ident"'
    if acc.visible_devices_env:   # Slurm narrows the devices of the step; the container sees the same
        env += f" -e {acc.visible_devices_env}"
    if container_runtime == "docker":
        flags = [f for f in docker_run_flags(platform) if not (shm_bytes and f.startswith("--shm-size="))]
        if shm_bytes and not acc.ipc_host:   # with --ipc=host the node's own /dev/shm is used
            flags.append(f"--shm-size={shm_bytes}")
        flags += [f"-v {q(f'{host}:{target}:{mode}')}" for host, target, mode in mounts]
        flags = " ".join(flags)
        return (f'docker run --rm --name "$name" --network host {flags} {env} --label {JOB_LABEL}="$SLURM_JOB_ID" '
                f'--entrypoint {L.RAY} "$IMAGE" "${{RAY_ARGS[@]}}"')
    if container_runtime == "apptainer":
        flag = f"{acc.apptainer_flag} " if acc.apptainer_flag else ""
        return (f'APPTAINERENV_{NI.ENV}="$ident" APPTAINERENV_HOME=/tmp APPTAINERENV_RAY_USAGE_STATS_ENABLED=0 '
                f'apptainer exec {flag}--containall --bind {q(",".join(["/tmp"] + [":".join(m) for m in mounts]))} '
                f'docker://"$IMAGE" {L.RAY} "${{RAY_ARGS[@]}}"')
    if container_runtime == "pyxis":
        return (f'{NI.ENV}="$ident" HOME=/tmp RAY_USAGE_STATS_ENABLED=0 srun --overlap --nodes=1 --ntasks=1 '
                f'-w "$(hostname -s)" --container-image="$IMAGE" --container-env={NI.ENV},HOME,RAY_USAGE_STATS_ENABLED '
                + (f'--container-mounts={q(",".join(":".join(m) for m in mounts))} ' if mounts else '')
                + f'{L.RAY} "${{RAY_ARGS[@]}}"')
    raise BadInput(f"--container-runtime {container_runtime}: accepted {', '.join(RUNTIMES)}")


def render_script(*, arm: str, stack_name: str, stack_sha256: str, nodes: int, image: str, container_runtime: str,
                  platform: str, gpus_per_node: int, partition: str | None, time_limit: str,
                  head_ports: dict[str, int] | None, head_ip: str | None, run_id: str | None, rollouts: int | None,
                  kit_command: str, workspace: str, script_path: str, allow_dirty: bool = False,
                  inputs: dict[str, str] | None = None, object_store_bytes: int | None = None,
                  shm_bytes: int | None = None) -> str:
    """The sbatch script's text (pure; golden-file tested). ``inputs``: the run's input name -> host path,
    mounted read-only where the image reads them and named to kit run; the workspace is mounted at
    /workspace on every node."""
    q = shlex.quote
    inputs = {k: v for k, v in (inputs or {}).items() if v is not None}
    mounts = node_mounts(inputs, Path(workspace))
    store = f" --object-store-memory={object_store_bytes}" if object_store_bytes else ""
    directives = [f"--job-name=rlk-{arm}", f"--nodes={nodes}", "--ntasks-per-node=1", f"--time={time_limit}",
                  f"--output={workspace}/slurm/%x-%j.out"]
    if partition:
        directives.append(f"--partition={partition}")
    if gpus_per_node:
        directives.append(f"--gpus-per-node={gpus_per_node}")
    head_flags = " ".join(f"{k}={v}" for k, v in (head_ports or {}).items()) or "--port=6379 --dashboard-port=8265"
    worker_flags = " ".join(f"{k}={v}" for k, v in (head_ports or {}).items() if k in (
        "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
        "--metrics-export-port", "--node-manager-port", "--object-manager-port"))
    gcs = (head_ports or {}).get("--port", 6379)
    dash = (head_ports or {}).get("--dashboard-port", 8265)
    kit_run = [f"--arm {q(arm)}", "--runtime ray", '--ray-address "http://$HEAD_IP:$DASHBOARD_PORT"',
               '--workspace "$WORKSPACE"', '--run-id "$RUN_ID"']
    if rollouts is not None:
        kit_run.append(f"--rollouts {int(rollouts)}")
    if allow_dirty:
        kit_run.append("--allow-dirty")
    kit_run += [f"{INPUT_TARGETS[name][0]} {q(str(path))}" for name, path in sorted(inputs.items())]
    # the job's output says what each node's container mounted (docker: its own record of the mounts)
    # (a failed inspect, before the container exists, prints an empty line: only a found container's is said)
    mount_log = ("    (for _ in $(seq 120); do m=\"$(docker inspect --format '{{range .Mounts}}{{.Source}}:{{.Destination}}:"
                 "{{if .RW}}rw{{else}}ro{{end}} {{end}}' \"$name\" 2>/dev/null)\" && { echo \"rlk: mounts $name: $m\" >&2; "
                 "break; }; sleep 1; done) &\n") if container_runtime == "docker" else ""
    acc = accelerator(platform)
    visible = f'export {acc.visible_devices_env}="${{{acc.visible_devices_env}:-}}"\n' if acc.visible_devices_env else ""
    head_ip_line = (f"HEAD_IP={q(head_ip)}" if head_ip else
                    'HEAD_IP="$(srun --overlap --nodes=1 --ntasks=1 -w "$HEAD_NODE" hostname -I | awk \'{print $1}\')"')
    return f"""#!/bin/bash
{chr(10).join('#SBATCH ' + d for d in directives)}
# Rendered by `kit cluster slurm`: arm {arm}, stack {stack_name} ({stack_sha256}),
# {platform} image by digest through {container_runtime}. Every node declares its identity ({NI.ENV});
# kit run probes every node and refuses any that differs, then seals the run.
set -euo pipefail
IMAGE={q(image)}
STACK_SHA256={stack_sha256}
WORKSPACE={q(workspace)}
SCRIPT={q(script_path)}
GCS_PORT={gcs}
DASHBOARD_PORT={dash}
KIT=({kit_command})
{visible}
start_node() {{  # $1: head | worker; runs on the node srun placed it on, in the foreground
    local role=$1 host name ident image_id stack inputs
    host="$(hostname -s)"
    name="rlk-slurm-$SLURM_JOB_ID-$role-$host"
    image_id="$IMAGE" stack="$STACK_SHA256" inputs=""
    if [ {q(container_runtime)} = docker ]; then
        image_id="$(docker image inspect --format '{{{{.Id}}}}' "$IMAGE")"
        stack="$(docker image inspect --format '{{{{index .Config.Labels "{L.LABEL_PREFIX}.stack.sha256"}}}}' "$IMAGE")"
        inputs="$(docker image inspect --format '{{{{index .Config.Labels "{L.LABEL_PREFIX}.inputs.sha256"}}}}' "$IMAGE")"
    fi
    ident="$(printf '{{"host":"%s","image_id":"%s","image_ref":"%s","inputs_sha256":"%s","name":"%s","runtime":"slurm+%s","stack_name":"%s","stack_sha256":"%s"}}' \\
        "$host" "$image_id" "$IMAGE" "$inputs" "$name" {q(container_runtime)} {q(stack_name)} "$stack")"
    local short_image="${{image_id##*:}}" labels
    labels="rlk-kit/image=${{short_image:0:32}},rlk-kit/inputs=${{inputs:0:32}},rlk-kit/node=${{name:0:63}},rlk-kit/stack=${{stack:0:32}}"
    if [ "$role" = head ]; then
        RAY_ARGS=(start --head --block --node-ip-address="$HEAD_IP" {head_flags}{store} --dashboard-host=0.0.0.0 --include-dashboard=true --disable-usage-stats --labels="$labels")
    else
        RAY_ARGS=(start --block --address="$HEAD_IP:$GCS_PORT" {worker_flags}{store} --disable-usage-stats --labels="$labels")
    fi
    trap "docker rm -f $name >/dev/null 2>&1 || true" EXIT   # expanded now: name is local
{mount_log}    {node_command(container_runtime, platform, image, gpus_per_node, mounts, shm_bytes)} &
    wait $!
}}

if [ "${{1:-}}" = node ]; then
    HEAD_IP="$3"
    start_node "$2"
    exit
fi

mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD_NODE="${{NODES[0]}}"
{head_ip_line}
RUN_ID="${{RLK_RUN_ID:-{run_id or arm + '-slurm-'}{'' if run_id else '$SLURM_JOB_ID'}}}"
cleanup() {{
    srun --overlap --nodes={nodes} --ntasks={nodes} bash -c \\
        "docker ps -aq --filter label={JOB_LABEL}=$SLURM_JOB_ID | xargs -r docker rm -f >/dev/null" 2>/dev/null || true
    kill $(jobs -p) 2>/dev/null || true
}}
trap cleanup EXIT
echo "rlk: head $HEAD_NODE ($HEAD_IP), {nodes} node(s), run $RUN_ID" >&2
srun --overlap --nodes=1 --ntasks=1 -w "$HEAD_NODE" bash "$SCRIPT" node head "$HEAD_IP" &
"${{KIT[@]}}" cluster wait --address "http://$HEAD_IP:$DASHBOARD_PORT" --nodes 1
if [ {nodes} -gt 1 ]; then
    srun --overlap --nodes={nodes - 1} --ntasks={nodes - 1} --exclude="$HEAD_NODE" bash "$SCRIPT" node worker "$HEAD_IP" &
fi
"${{KIT[@]}}" cluster wait --address "http://$HEAD_IP:$DASHBOARD_PORT" --nodes {nodes}
"${{KIT[@]}}" run {' '.join(kit_run)}
"""


def resolve_image(arm, image: str | None, container_runtime: str) -> str:
    """The image by digest: docker takes a local image id (default: the arm's stack image), the others a
    registry reference pinned by digest."""
    if container_runtime != "docker":
        if not image or not DIGEST_REF.match(image):
            raise BadInput(f"--image {image or '(none)'}: {container_runtime} pulls from a registry; give "
                           "REPOSITORY@sha256:<64 hex> so every node runs the same bytes")
        return image
    if image and IMAGE_ID.match(image):
        return image

    client = engine()
    ref = image or image_for_arm(client, arm)
    try:
        return client.images.get(ref).id
    except Exception:
        raise BadInput(f"--image {ref}: not on this engine (`docker images` lists what is)") from None


def prepare(arm, *, nodes: int, image: str | None, container_runtime: str, gpus_per_node: int | None,
            partition: str | None, time_limit: str, port_base: int | None, run_id: str | None, rollouts: int | None,
            kit_command: str, workspace: Path, out: Path | None, head_ip: str | None = None,
            allow_dirty: bool = False, inputs: dict[str, Path] | None = None) -> dict:
    """Render the script for ``arm`` and write it (never over an existing file); the slurm-job/v1 document."""
    if nodes < 1:
        raise BadInput(f"--nodes {nodes}: give 1 or more")
    if run_id is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", run_id):
        raise BadInput(f"--run-id {run_id!r}: accepted letters, digits, '.', '_', '-' (not first)")
    sizes = node_sizes(arm.platform, arm.document.get("topology", {}).get("gpus", 0))
    if gpus_per_node is not None and gpus_per_node < 0:
        raise BadInput(f"--gpus-per-node {gpus_per_node}: give 0 or more")
    gpus = sizes.gpus_per_node if gpus_per_node is None else gpus_per_node
    if arm.platform == "cpu":
        gpus = 0
    inputs = {name: Path(path).resolve() for name, path in (inputs or {}).items() if path is not None}
    for name, path in inputs.items():
        if not path.exists():
            raise BadInput(f"{path}: not found; give {INPUT_TARGETS[name][0]} a path every node sees")
    digest = resolve_image(arm, image, container_runtime)
    path = (out or Path(workspace) / "slurm" / f"{arm.name}-{hashlib.sha256(os.urandom(8)).hexdigest()[:8]}.sbatch")
    path = path.resolve()
    text = render_script(arm=arm.name, stack_name=arm.stack.name, stack_sha256=arm.stack.sha256, nodes=nodes,
                         image=digest, container_runtime=container_runtime, platform=arm.platform, gpus_per_node=gpus,
                         partition=partition, time_limit=time_limit, head_ports=ports(port_base), head_ip=head_ip,
                         run_id=run_id, rollouts=rollouts, kit_command=kit_command, workspace=str(workspace),
                         script_path=str(path), allow_dirty=allow_dirty,
                         inputs={k: str(v) for k, v in inputs.items()}, object_store_bytes=sizes.object_store_bytes,
                         shm_bytes=sizes.shm_bytes)
    path.parent.mkdir(parents=True, exist_ok=True)
    (Path(workspace) / "slurm").mkdir(parents=True, exist_ok=True)
    with open(path, "x", encoding="utf-8") as fh:
        fh.write(text)
    return {"schema": "rlk-kit/slurm-job/v1", "arm": arm.name,
            "stack": {"name": arm.stack.name, "sha256": arm.stack.sha256}, "nodes": nodes,
            "container_runtime": container_runtime, "platform": arm.platform, "image": digest,
            "script_path": str(path), "script_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "workspace": str(workspace), "run_id": run_id, "run_dir": None, "job": None}


def submit(doc: dict, *, log: Callable[[str], None] = lambda s: None, timeout_s: float = 1800) -> dict:
    """``sbatch --wait`` the script; the document with the job's id, state, exit code, output and run dir."""
    try:
        proc = subprocess.Popen(["sbatch", "--parsable", "--wait", doc["script_path"]], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        raise BadInput("sbatch: not found; --submit needs a Slurm client (scripts/ensure-slurm.sh sets one up)") from None
    job_id = (proc.stdout.readline() or "").strip().split(";")[0]
    if job_id:
        log(f"submitted slurm job {job_id}; waiting for it")
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        subprocess.run(["scancel", job_id], check=False)
        proc.communicate()
        raise CheckFailed(f"slurm job {job_id} did not end within {timeout_s:.0f} s; cancelled")
    if not job_id:
        raise CheckFailed(f"sbatch {doc['script_path']} refused: {err.strip()[-400:]}")
    output = Path(doc["workspace"]) / "slurm" / f"rlk-{doc['arm']}-{job_id}.out"
    run_id = doc["run_id"] or f"{doc['arm']}-slurm-{job_id}"
    state = "COMPLETED" if proc.returncode == 0 else "FAILED"
    return dict(doc, run_id=run_id, run_dir=str(Path(doc["workspace"]) / "runs" / run_id),
                job={"id": job_id, "state": state, "exit_code": proc.returncode, "output": str(output)})
