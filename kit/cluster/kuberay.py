"""KubeRay: a RayCluster and a RayJob (apiVersion ray.io/v1) that run an arm on its image by digest.

Every group's pod runs the same ``image@sha256:…``, declares the kit's node identity (the
``RLK_NODE_IDENTITY`` environment, Ray node labels, Kubernetes labels and annotations), mounts a
memory-backed ``/dev/shm`` and asks for the accelerator's device-plugin resource from
:mod:`kit.model.accelerators`. The RayJob's entrypoint is ``kit run`` against its own cluster, so the
per-node probe and the seal happen inside. Both documents travel in one envelope
(rlk-kit/kuberay/v1); the pod templates are checked with kubernetes-validate's bundled schemas.
Example::

    doc = render(arm, image="reg/rlk@sha256:" + "0" * 64, platform="cuda", workers=1)
    validate(doc)                                   # envelope schema + Kubernetes Pod schemas
    write(doc, Path("k8s"))                         # raycluster.json, rayjob.json, kuberay.json
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from kit.build import layout as L
from kit.model import node_identity as NI
from kit.model.accelerators import accelerator, k8s_container_fields, node_sizes
from kit.model.documents import dumps_pretty, require_valid
from kit.model.errors import BadInput, CheckFailed
from kit.model.engine_traits import traits
from kit.model.stack import packages_for

API_VERSION = "ray.io/v1"
KUBERNETES_VERSION = "1.33"          # the schemas the pod templates are checked against
DIGEST_REF = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
LABEL = "rlk-kit.dev"
DEFAULT_WORKSPACE_CLAIM = "rlk-workspace"   # a ReadWriteMany claim the site creates once; the sealed runs live there
WORKSPACE_VOLUMES = ("pvc", "emptydir")
INPUTS_DIR = "/inputs"                      # model/, torch_dist/, data/ as kit/build/layout.py names them


def _dns(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40] or "arm"


def pod_template(*, group: str, arm, image: str, platform: str, gpus: int, identity: dict, head: bool,
                 workspace_claim: str | None, shm_bytes: int = 2**30, inputs: dict | None = None) -> dict:
    """One group's pod template: the image by digest, identity, shm, devices, the workspace (a claim;
    an emptyDir only when ``workspace_claim`` is None) and the inputs read-only at /inputs."""
    acc = accelerator(platform)
    container = {
        "name": "ray-head" if head else "ray-worker", "image": image, "imagePullPolicy": "IfNotPresent",
        "env": [{"name": NI.ENV, "value": json.dumps(identity, sort_keys=True)},
                {"name": "HOME", "value": "/tmp"}, {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"}],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "workspace", "mountPath": L.WORKSPACE}]
                        + ([{"name": "inputs", "mountPath": INPUTS_DIR, "readOnly": True}] if inputs else []),
        **k8s_container_fields(platform, gpus),
    }
    if acc.security_opt:   # ROCm: the default seccomp profile blocks HSA's and the debugger's calls
        container["securityContext"] = {"seccompProfile": {"type": "Unconfined"}}
    if head:
        container["ports"] = [{"containerPort": 6379, "name": "gcs"}, {"containerPort": 8265, "name": "dashboard"},
                              {"containerPort": 10001, "name": "client"}]
    workspace = ({"persistentVolumeClaim": {"claimName": workspace_claim}} if workspace_claim else {"emptyDir": {}})
    labels = {f"{LABEL}/arm": _dns(arm.name), f"{LABEL}/stack": _dns(arm.stack.name),
              f"{LABEL}/stack-sha256": arm.stack.sha256[:32], f"{LABEL}/group": group}
    annotations = {f"{LABEL}/stack-sha256": arm.stack.sha256, f"{LABEL}/image": image,
                   f"{LABEL}/platform": platform}
    return {"metadata": {"labels": labels, "annotations": annotations},
            "spec": {"containers": [container],
                     "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(shm_bytes)}},
                                 {"name": "workspace", **workspace}]
                     + ([{"name": "inputs", **inputs}] if inputs else [])}}


def render(arm, *, image: str, platform: str, workers: int = 1, gpus_per_pod: int | None = None,
           namespace: str = "default", workspace_volume: str = "pvc", workspace_claim: str = DEFAULT_WORKSPACE_CLAIM,
           inputs_claim: str | None = None, inputs_host_path: str | None = None, rollouts: int | None = None) -> dict:
    """The rlk-kit/kuberay/v1 envelope with its RayCluster and RayJob (pure). The run writes into
    ``/workspace``: the claim ``workspace_claim`` unless ``workspace_volume`` is ``emptydir`` (then the
    sealed run dies with the pods); the inputs (a claim or a node's host path) are mounted read-only at
    /inputs; GPUs, /dev/shm and the object store come from :func:`kit.model.accelerators.node_sizes`."""
    if not DIGEST_REF.match(image or ""):
        raise BadInput(f"--image {image}: give REPOSITORY@sha256:<64 hex> (every pod must pull the same bytes)")
    if platform not in arm.stack.document.get("platforms", {}):
        raise BadInput(f"--platform {platform}: stack {arm.stack.name} has {', '.join(arm.stack.document['platforms'])}")
    if workers < 0:
        raise BadInput(f"--workers {workers}: give 0 or more")

    if workspace_volume not in WORKSPACE_VOLUMES:
        raise BadInput(f"--workspace-volume {workspace_volume}: accepted {', '.join(WORKSPACE_VOLUMES)}")
    for flag, value in (("--workspace-claim", workspace_claim), ("--inputs-claim", inputs_claim)):
        if value is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", value):
            raise BadInput(f"{flag} {value!r}: give a claim name (lower-case letters, digits, '-', '.')")
    if inputs_claim and inputs_host_path:
        raise BadInput("--inputs-claim and --inputs-host-path: give one of them")
    if inputs_host_path is not None and not inputs_host_path.startswith("/"):
        raise BadInput(f"--inputs-host-path {inputs_host_path!r}: give an absolute path on every node")
    if gpus_per_pod is not None and gpus_per_pod < 0:
        raise BadInput(f"--gpus-per-pod {gpus_per_pod}: give 0 or more")
    sizes = node_sizes(platform, arm.document.get("topology", {}).get("gpus", 0))
    gpus = 0 if platform == "cpu" else (sizes.gpus_per_node if gpus_per_pod is None else gpus_per_pod)
    claim = workspace_claim if workspace_volume == "pvc" else None
    inputs = ({"persistentVolumeClaim": {"claimName": inputs_claim, "readOnly": True}} if inputs_claim else
              {"hostPath": {"path": inputs_host_path, "type": "Directory"}} if inputs_host_path else None)
    name = f"rlk-{_dns(arm.name)}-{platform}"
    groups = {}
    for group, head in (("head", True), ("workers", False)):
        ident = NI.node_identity(name=f"{name}-{group}", image_ref=image, image_id=image.split("@")[-1],
                                 labels={f"{L.LABEL_PREFIX}.stack.name": arm.stack.name,
                                         f"{L.LABEL_PREFIX}.stack.sha256": arm.stack.sha256},
                                 host=None, runtime="kuberay")
        params = {"labels": NI.labels_flag(ident), "disable-usage-stats": "true",
                  "object-store-memory": str(sizes.object_store_bytes)}
        if head:
            params["dashboard-host"] = "0.0.0.0"
        groups[group] = (params, pod_template(group=group, arm=arm, image=image, platform=platform, gpus=gpus,
                                              identity=ident, head=head, workspace_claim=claim,
                                              shm_bytes=sizes.shm_bytes, inputs=inputs))
    cluster_spec = {
        "rayVersion": packages_for(arm.stack.document, platform).get("ray", ""),
        "enableInTreeAutoscaling": False,
        "headGroupSpec": {"rayStartParams": groups["head"][0], "template": groups["head"][1]},
        "workerGroupSpecs": [{"groupName": "workers", "replicas": workers, "minReplicas": workers,
                              "maxReplicas": workers, "rayStartParams": groups["workers"][0],
                              "template": groups["workers"][1]}],
    }
    metadata = {"name": name, "namespace": namespace,
                "labels": {f"{LABEL}/arm": _dns(arm.name), f"{LABEL}/stack": _dns(arm.stack.name)},
                "annotations": {f"{LABEL}/stack-sha256": arm.stack.sha256, f"{LABEL}/image": image}}
    entry = [L.PYTHON, "-m", "kit", "run", "--arm", arm.name, "--runtime", "ray", "--ray-address",
             "http://127.0.0.1:8265", "--workspace", L.WORKSPACE, "--run-id", f"{name}-$(date -u +%Y%m%dT%H%M%SZ)"]
    if rollouts is not None:
        entry += ["--rollouts", str(int(rollouts))]
    if inputs and traits(arm.engine).uses_input_files:   # kit run hashes what the image reads
        entry += ["--model", L.MODEL_DIR, "--checkpoint", L.CHECKPOINT_DIR,
                  "--prompt-data", f"{L.DATA_DIR}/dapo-math-17k.jsonl"]
    return {
        "schema": "rlk-kit/kuberay/v1", "arm": arm.name, "platform": platform, "image": image,
        "stack": {"name": arm.stack.name, "sha256": arm.stack.sha256}, "kubernetes_version": KUBERNETES_VERSION,
        "raycluster": {"apiVersion": API_VERSION, "kind": "RayCluster", "metadata": metadata, "spec": cluster_spec},
        "rayjob": {"apiVersion": API_VERSION, "kind": "RayJob", "metadata": dict(metadata, name=f"{name}-job"),
                   "spec": {"entrypoint": " ".join(entry), "submissionMode": "K8sJobMode",
                            "shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 3600,
                            "rayClusterSpec": cluster_spec}},
    }


def pod_problems(doc: dict) -> list[str]:
    """Every pod template of the envelope checked as a Pod against Kubernetes' own schema (strict:
    unknown fields are errors), with kubernetes-validate's bundled schemas, offline."""
    try:
        import kubernetes_validate as kv   # heavy: loads bundled schemas
    except ImportError:
        raise BadInput("kit cluster kuberay validates with kubernetes-validate: pip install 'rlk-kit[cluster]'") from None

    out = []
    for where, spec in (("raycluster", doc["raycluster"]["spec"]), ("rayjob", doc["rayjob"]["spec"]["rayClusterSpec"])):
        groups = [("headGroupSpec", spec["headGroupSpec"])] + [
            (f"workerGroupSpecs/{i}", g) for i, g in enumerate(spec["workerGroupSpecs"])]
        for path, group in groups:
            template = group["template"]
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": dict(template["metadata"], name="rlk-template"),
                   "spec": template["spec"]}
            try:
                kv.validate(pod, doc["kubernetes_version"], strict=True)
            except kv.ValidationError as exc:
                pointer = "/".join(str(p) for p in exc.path)
                out.append(f"/{where}/spec/{path}/template/{pointer}: {exc.message}")
    return out


def validate(doc: dict) -> dict:
    """The envelope against rlk-kit/kuberay/v1 and its pod templates against Kubernetes; CheckFailed naming
    the JSON pointer otherwise."""
    require_valid(doc, "kuberay document", "kuberay")
    problems = pod_problems(doc)
    if problems:
        raise CheckFailed("rendered KubeRay pod templates fail the Kubernetes schema:\n  " + "\n  ".join(problems[:12]))
    return doc


def dumps(doc: dict) -> str:
    return dumps_pretty(doc)


def write(doc: dict, out: Path) -> list[Path]:
    """raycluster.json and rayjob.json (for kubectl apply -f) and the envelope; never over existing files."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, body in (("raycluster.json", doc["raycluster"]), ("rayjob.json", doc["rayjob"]), ("kuberay.json", doc)):
        path = out / name
        with open(path, "x", encoding="utf-8") as fh:
            fh.write(dumps_pretty(body))
        paths.append(path)
    return paths
