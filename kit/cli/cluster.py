"""`kit cluster`: a local Ray cluster of pinned containers, a Slurm batch script, KubeRay documents."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import click

from kit.adapters.ray import check_address
from kit.cli._output import emit_json
from kit.cli.plan import select_arm
from kit.cli.run import workspace_from
from kit.cluster import kuberay, local, slurm
from kit.cluster.local import alive_nodes
from kit.model.engine_traits import traits
from kit.model.errors import BadInput, CheckFailed
from kit.run.inputs import vime_input_files
from kit.run.request import RunRequest

CTX = {"help_option_names": ["-h", "--help"]}


def _state_options(json_help: str):
    """--workspace and --json, for the subcommands that read the workspace's cluster state."""
    def apply(function):
        function = click.option("--json", "as_json", is_flag=True, help=json_help)(function)
        return click.option("--workspace", type=click.Path(path_type=Path, file_okay=False),
                            help="Workspace root.")(function)
    return apply


def _log(as_json: bool):
    return (lambda s: None) if as_json else (lambda s: click.echo(f"kit: {s}", err=True))


@click.group(name="cluster", context_settings=CTX)
def command():
    """Multi-node runs: every node of the cluster started from the arm's pinned image and attested.

    \b
    Examples:
      kit cluster up --arm smoke --local 3             # head + 2 workers on a Docker network
      kit run --arm smoke --runtime ray --ray-address "$(kit cluster address)"
      kit cluster down                                 # removes exactly what up made
      kit cluster slurm --arm smoke --nodes 2                      # renders the sbatch script
      kit cluster kuberay --arm G11 --image reg/rlk@sha256:0000000000000000000000000000000000000000000000000000000000000000 --out k8s/
    """


@command.command(name="up", context_settings=CTX)
@click.option("--arm", "arm_ref", required=True, metavar="A", help="Arm whose pinned image every node runs.")
@click.option("--local", "nodes", type=int, required=True, metavar="N", help="Nodes (containers) to start, N ≥ 2.")
@click.option("--image", metavar="REF", help="The image (default: the one labelled with the arm's stack sha256).")
@click.option("--worker-image", "worker_images", multiple=True, metavar="REF",
              help="Image of worker 1, 2, … in order (a rehearsal of a node from another tag; kit run refuses it).")
@click.option("--workspace", type=click.Path(path_type=Path, file_okay=False),
              help="Workspace root; the state file is <workspace>/cluster/state.json.")
@click.option("--json", "as_json", is_flag=True, help="Print the rlk-kit/cluster-state/v1 document.")
def up_command(arm_ref, nodes, image, worker_images, workspace, as_json):
    """Start a Ray cluster of N containers: head and workers, each with its node identity.

    \b
    Example:
      kit cluster up --arm smoke --local 3 --json
    """

    arm = select_arm(arm_ref, None)
    ws = workspace_from(workspace)
    try:
        state = local.up(arm, nodes=nodes, workspace=ws, image=image, worker_images=list(worker_images),
                         log=_log(as_json))
    except KeyboardInterrupt:
        click.echo("kit: interrupted; `kit cluster down` removes what was started", err=True)
        raise click.exceptions.Exit(130)
    if as_json:
        emit_json(state)
    else:
        click.echo(f"cluster {state['cluster_id']}: {nodes} nodes, address {state['address']}")
        click.echo(f"run with: kit run --arm {arm.name} --runtime ray --ray-address {state['address']}")


@command.command(name="down", context_settings=CTX)
@_state_options("Print the rlk-kit/cluster-state/v1 document (status down).")
def down_command(workspace, as_json):
    """Remove every container and the network the workspace's cluster made (and only those).

    \b
    Example:
      kit cluster down
    """

    state = local.down(workspace_from(workspace), log=_log(as_json))
    if state is None:
        if as_json:
            raise click.UsageError("no cluster state in this workspace (kit cluster up writes one)")
        click.echo("kit: no cluster in this workspace", err=True)
        return
    if as_json:
        emit_json(state)
    else:
        click.echo(f"cluster {state['cluster_id']}: down ({state['timing_s']['down_s']:.1f} s)")


@command.command(name="address", context_settings=CTX)
@_state_options("Print the rlk-kit/cluster-state/v1 document.")
def address_command(workspace, as_json):
    """Print the dashboard URL of the workspace's cluster (exit 1 when it is not up).

    \b
    Example:
      kit run --arm smoke --runtime ray --ray-address "$(kit cluster address)"
    """

    state = local.read_state(workspace_from(workspace))
    if state is None or state["status"] != "up":
        raise CheckFailed("no cluster is up in this workspace (`kit cluster up --arm A --local N` starts one)")
    if as_json:
        emit_json(state)
    else:
        click.echo(state["address"])


@command.command(name="wait", context_settings=CTX)
@click.option("--address", required=True, metavar="URL", help="The head's dashboard URL.")
@click.option("--nodes", type=int, required=True, help="Alive nodes to wait for.")
@click.option("--timeout", "timeout_s", type=float, default=300, show_default=True, help="Seconds before exit 1.")
@click.option("--json", "as_json", is_flag=True, help="Print nothing; exit status only (0 when the nodes are alive).")
def wait_command(address, nodes, timeout_s, as_json):
    """Wait until a Ray cluster has N alive nodes (the Slurm script calls this between its steps).

    \b
    Example:
      kit cluster wait --address "$(kit cluster address)" --nodes 3 --timeout 300
    """

    check_wait(address, nodes, timeout_s)
    deadline = time.monotonic() + timeout_s
    while (alive := alive_nodes(address)) < nodes:
        if time.monotonic() > deadline:
            raise CheckFailed(f"{address}: {alive} of {nodes} Ray nodes alive after {timeout_s:.0f} s")
        time.sleep(1)
    _log(as_json)(f"{alive} nodes alive at {address}")


def run_inputs(arm, ws: Path, **given) -> dict:
    """The inputs a cluster's nodes mount: for an arm that reads input files, the ones ``kit run`` would
    pick (flags, else what kit prepare left in the workspace), each checked to exist; else those given."""
    if not traits(arm.engine).uses_input_files:
        return {name: path for name, path in given.items() if path is not None}
    return vime_input_files(RunRequest(arm=arm, workspace=ws, runtime="ray", **given))


MAX_WAIT_S = 86400.0


def check_wait(address: str, nodes: int, timeout_s: float) -> None:
    """Refuse a wait that could not end (nan, inf) or means nothing, and an address no wait can reach."""
    if not (math.isfinite(timeout_s) and 0 <= timeout_s <= MAX_WAIT_S):
        raise BadInput(f"--timeout {timeout_s}: give seconds in 0..{MAX_WAIT_S:.0f}")
    if nodes < 1:
        raise BadInput(f"--nodes {nodes}: give 1 or more")
    check_address(address, "--address")


@command.command(name="slurm", context_settings=CTX)
@click.option("--arm", "arm_ref", required=True, metavar="A", help="Arm to run.")
@click.option("--nodes", type=int, default=1, show_default=True, help="Slurm nodes: the head on the first, workers on the rest.")
@click.option("--image", metavar="REF", help="Image by digest (docker: default the local image id of the arm's stack).")
@click.option("--container-runtime", type=click.Choice(["docker", "apptainer", "pyxis"]), default="docker",
              show_default=True, help="How each node starts the image.")
@click.option("--gpus-per-node", type=int, default=None, help="GPUs per node (default: the arm's topology; 0 for cpu).")
@click.option("--partition", help="Slurm partition (default: the cluster's default).")
@click.option("--time", "time_limit", default="01:00:00", show_default=True, help="Slurm time limit.")
@click.option("--port-base", type=int, help="First of the Ray head's ports (GCS, dashboard, …); default Ray's own.")
@click.option("--run-id", help="Run id for kit run (default: rlk-<arm>-$SLURM_JOB_ID).")
@click.option("--rollouts", type=int, help="Rollouts override for kit run.")
@click.option("--head-ip", help="Address of the head node the others reach (default: its first address, hostname -I).")
@click.option("--allow-dirty", is_flag=True, help="Pass --allow-dirty to kit run (a kit checkout with uncommitted changes).")
@click.option("--kit-command", default=None, help="How the batch host calls the kit (default: this Python's -m kit).")
@click.option("--workspace", type=click.Path(path_type=Path, file_okay=False),
              help="Workspace root, shared by the nodes: mounted at /workspace, the sealed run is left there.")
@click.option("--model", type=click.Path(path_type=Path), help="Model dir, mounted at /inputs/model (default as kit run's).")
@click.option("--checkpoint", type=click.Path(path_type=Path), help="torch_dist checkpoint, mounted at /inputs/torch_dist (default as kit run's).")
@click.option("--prompt-data", type=click.Path(path_type=Path), help="Prompt JSONL, mounted under /inputs/data (default as kit run's).")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), help="Write the script here (default <workspace>/slurm/<arm>.sbatch).")
@click.option("--submit", is_flag=True, help="sbatch the script and wait for the job; exit as kit run inside did.")
@click.option("--json", "as_json", is_flag=True, help="Print the rlk-kit/slurm-job/v1 document.")
def slurm_command(arm_ref, nodes, image, container_runtime, gpus_per_node, partition, time_limit, port_base, run_id,
                  rollouts, head_ip, allow_dirty, kit_command, workspace, model, checkpoint, prompt_data, out, submit,
                  as_json):
    """Render an sbatch script (head on the first node, workers via srun, the image by digest) and submit it.

    \b
    Examples:
      kit cluster slurm --arm smoke --nodes 1 --submit
      kit cluster slurm --arm G11 --nodes 4 --container-runtime pyxis --image reg/rlk@sha256:0000000000000000000000000000000000000000000000000000000000000000 --partition gpu --model /shared/Qwen3-8B --checkpoint /shared/torch_dist --prompt-data /shared/dapo-math-17k.jsonl --out g11.sbatch   # exit 2 until those inputs exist
    """

    arm = select_arm(arm_ref, None)
    ws = workspace_from(workspace).resolve()
    try:
        inputs = run_inputs(arm, ws, model=model, checkpoint=checkpoint, prompt_data=prompt_data)
    except BadInput as missing:   # say the image too, when it is missing as well: a site fixes both in one go
        try:
            slurm.resolve_image(arm, image, container_runtime)
        except BadInput as no_image:
            raise BadInput(f"{no_image}\n{missing}") from None
        raise
    doc = slurm.prepare(arm, nodes=nodes, image=image, container_runtime=container_runtime, gpus_per_node=gpus_per_node,
                        partition=partition, time_limit=time_limit, port_base=port_base, run_id=run_id,
                        rollouts=rollouts, kit_command=kit_command or f"{sys.executable} -m kit", workspace=ws, out=out,
                        head_ip=head_ip, allow_dirty=allow_dirty,
                        inputs=inputs)
    log = _log(as_json)
    log(f"wrote {doc['script_path']}")
    if submit:
        doc = slurm.submit(doc, log=log)
    if as_json:
        emit_json(doc)
    elif submit:
        click.echo(f"slurm job {doc['job']['id']}: {doc['job']['state']}; run dir {doc['run_dir']}")
    else:
        click.echo(doc["script_path"])
    if submit and doc["job"]["exit_code"] != 0:
        raise click.exceptions.Exit(1)


@command.command(name="kuberay", context_settings=CTX)
@click.option("--arm", "arm_ref", required=True, metavar="A", help="Arm to run.")
@click.option("--image", required=True, metavar="REF@sha256:…", help="The image by registry digest.")
@click.option("--platform", type=click.Choice(["cuda", "rocm", "cpu"]), help="Accelerator (default: the arm's).")
@click.option("--workers", type=int, default=1, show_default=True, help="Worker pods.")
@click.option("--gpus-per-pod", type=int, help="GPUs per pod (default: the arm's topology).")
@click.option("--namespace", default="default", show_default=True)
@click.option("--workspace-volume", type=click.Choice(kuberay.WORKSPACE_VOLUMES), default="pvc", show_default=True,
              help="/workspace, where the run seals its evidence: a PersistentVolumeClaim, or an emptyDir that dies with the pods.")
@click.option("--workspace-claim", default=kuberay.DEFAULT_WORKSPACE_CLAIM, show_default=True,
              help="The workspace's claim (ReadWriteMany: every pod mounts it).")
@click.option("--inputs-claim", metavar="CLAIM", help="A claim holding model/, torch_dist/, data/, mounted read-only at /inputs.")
@click.option("--inputs-host-path", metavar="DIR", help="The same from a directory every node has (hostPath).")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), help="Write raycluster.json, rayjob.json and kuberay.json here.")
@click.option("--json", "as_json", is_flag=True, help="Print the rlk-kit/kuberay/v1 envelope.")
def kuberay_command(arm_ref, image, platform, workers, gpus_per_pod, namespace, workspace_volume, workspace_claim,
                    inputs_claim, inputs_host_path, out, as_json):
    """Render a RayCluster and a RayJob (ray.io/v1) of the arm's image, validated before they are written.

    \b
    Examples:
      kit cluster kuberay --arm G11 --image reg/rlk@sha256:0000000000000000000000000000000000000000000000000000000000000000 --workers 1 --inputs-claim rlk-inputs --out k8s/
      kubectl apply -f k8s/rayjob.json
    """

    arm = select_arm(arm_ref, None)
    doc = kuberay.render(arm, image=image, platform=platform or arm.platform, workers=workers,
                         gpus_per_pod=gpus_per_pod, namespace=namespace, workspace_volume=workspace_volume,
                         workspace_claim=workspace_claim, inputs_claim=inputs_claim, inputs_host_path=inputs_host_path)
    kuberay.validate(doc)
    if out is not None:
        for path in kuberay.write(doc, out):
            _log(as_json)(f"wrote {path}")
    if as_json:
        emit_json(doc)
    elif out is None:
        click.echo(kuberay.dumps(doc["rayjob"]), nl=False)
