"""Pure parts of kit cluster: the accelerator table as each consumer reads it, node-identity rules,
the Slurm script and the KubeRay documents against golden files, validated with Kubernetes' schemas.

Golden files: tests/cluster/golden/. After an intended change: RLK_UPDATE_GOLDEN=1 pytest tests/cluster -k golden."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import re

import pytest

from kit.cluster import kuberay, slurm
from kit.model import node_identity as NI
from kit.model.accelerators import ACCELERATORS, docker_py_options, docker_run_flags, k8s_container_fields
from kit.model.catalog import Catalog
from kit.model.errors import BadInput, CheckFailed

GOLDEN = Path(__file__).parent / "golden"
DIGEST = "registry.example/rlk-kit/vime-g11@sha256:" + "ab" * 32


def golden(name: str, text: str) -> None:
    """Compare with the golden file, the locked stacks' hashes written as placeholders (a new lock of a
    stack changes its hash, not what is rendered around it)."""
    for arm_name in ("smoke", "G11"):
        sha = Catalog.default().arm(arm_name).stack.sha256
        text = text.replace(sha, f"<{arm_name}-stack-sha256>").replace(sha[:32], f"<{arm_name}-stack-sha256:32>")
    path = GOLDEN / name
    if os.environ.get("RLK_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.read_text() == text, f"{path} differs from the rendered text (RLK_UPDATE_GOLDEN=1 rewrites it)"


# --- one accelerator table for docker, Slurm and KubeRay ---------------------------------------------------

def test_accelerator_table_drives_docker_runtime_slurm_and_kuberay():
    from kit.adapters.docker import container_options

    rocm = container_options("rocm")
    assert rocm["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"] and rocm["group_add"] == ["video", "render"]
    assert "device_requests" not in rocm and container_options("cuda")["device_requests"][0]["Capabilities"] == [["gpu"]]
    assert container_options("cpu") == {"privileged": False, "shm_size": "1g"}
    flags = docker_run_flags("rocm")
    assert {"--device=/dev/kfd", "--device=/dev/dri", "--group-add=video", "--group-add=render"} <= set(flags)
    assert "--gpus=all" in docker_run_flags("cuda") and not any("gpus" in f for f in flags)
    assert k8s_container_fields("rocm", 8)["resources"]["limits"] == {"amd.com/gpu": "8"}
    assert k8s_container_fields("cuda", 2)["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert k8s_container_fields("cpu", 8) == {}
    assert ACCELERATORS["rocm"].visible_devices_env == "HIP_VISIBLE_DEVICES"
    assert ACCELERATORS["cuda"].visible_devices_env == "CUDA_VISIBLE_DEVICES"
    # the docker-py keywords and the CLI flags say the same thing
    for kind in ACCELERATORS:
        opts = docker_py_options(kind)
        assert ("--ipc=host" in docker_run_flags(kind)) == (opts.get("ipc_mode") == "host")
    with pytest.raises(ValueError, match="accepted cuda, rocm, cpu"):
        docker_run_flags("tpu")


# --- node identity rules --------------------------------------------------------------------------------------

def _node(i, image_id="sha256:" + "1" * 64, stack="s" * 64, declared=True):
    ident = {"name": f"n{i}", "image_id": image_id, "stack_sha256": stack, "inputs_sha256": "i" * 64}
    return {"node_id": f"{i:02d}" * 20, "address": f"10.0.0.{i}", "node_identity": ident if declared else None}


def test_declared_identity_differences_name_node_field_and_values():
    assert NI.declared_problems([_node(1), _node(2)], "s" * 64) == []
    problems = NI.declared_problems([_node(1), _node(2), _node(3, image_id="sha256:" + "2" * 64)], "s" * 64)
    assert len(problems) == 1 and "n3" in problems[0] and "node_identity.image_id" in problems[0]
    assert "1" * 64 in problems[0] and "2" * 64 in problems[0]
    assert "observed none" in NI.declared_problems([_node(1), _node(2, declared=False)], "s" * 64)[0]
    assert "stack_sha256" in NI.declared_problems([_node(1, stack="t" * 64)], "s" * 64)[0]
    labels = NI.ray_labels({"name": "rlk-cluster-x-worker-1", "image_id": "sha256:" + "f" * 64, "stack_sha256": "e" * 64})
    assert all(len(v) <= 63 for v in labels.values()) and labels["rlk-kit/image"] == "f" * 32


def test_actor_check_inside_the_job_uses_the_probe_message_shape():
    from rlk_kernels.smoke import node_identity_problems

    expected = NI.expected_for_actors([_node(1), _node(2)], {"torch": "2.13.0+cpu"})
    assert node_identity_problems(expected, _node(1)["node_identity"], {"torch": "2.13.0+cpu"}) == []
    late = _node(4, image_id="sha256:" + "9" * 64)["node_identity"]
    problems = node_identity_problems(expected, late, {"torch": "2.12.0"})
    assert problems == [f"node_identity.image_id expected 'sha256:{'1' * 64}', observed 'sha256:{'9' * 64}'",
                        "packages.torch expected '2.13.0+cpu', observed '2.12.0'"]


# --- Slurm -------------------------------------------------------------------------------------------------------

def _render(arm_name, container_runtime, image, platform=None, **kw):
    arm = Catalog.default().arm(arm_name)
    args = dict(arm=arm.name, stack_name=arm.stack.name, stack_sha256=arm.stack.sha256, nodes=4, image=image,
                container_runtime=container_runtime, platform=platform or arm.platform, gpus_per_node=8,
                partition="gpu", time_limit="04:00:00", head_ports=None, head_ip=None, run_id=None, rollouts=None,
                kit_command="/opt/kit/bin/python -m kit", workspace="/shared/ws", script_path="/shared/ws/slurm/job.sbatch")
    args.update(kw)
    return slurm.render_script(**args)


def test_slurm_script_golden_docker_smoke():
    text = _render("smoke", "docker", "sha256:" + "cd" * 32, nodes=2, gpus_per_node=0, partition=None,
                   head_ports=slurm.ports(46000), head_ip="127.0.0.1", run_id="smoke-slurm", rollouts=2)
    golden("smoke-docker.sbatch", text)
    assert "--port=46000" in text and "--dashboard-port=46001" in text and "--shm-size=1g" in text


def test_slurm_script_golden_g11_pyxis_cuda_and_apptainer_rocm():
    cuda = _render("G11", "pyxis", DIGEST)
    golden("G11-pyxis-cuda.sbatch", cuda)
    assert f"IMAGE={DIGEST}" in cuda and "--container-image" in cuda and "#SBATCH --gpus-per-node=8" in cuda
    rocm = _render("G11", "apptainer", DIGEST, platform="rocm")
    golden("G11-apptainer-rocm.sbatch", rocm)
    assert "apptainer exec --rocm" in rocm and 'HIP_VISIBLE_DEVICES="${HIP_VISIBLE_DEVICES:-}"' in rocm
    docker_rocm = _render("G11", "docker", "sha256:" + "cd" * 32, platform="rocm")
    assert "--device=/dev/kfd --device=/dev/dri --group-add=video --group-add=render" in docker_rocm
    assert "-e HIP_VISIBLE_DEVICES" in docker_rocm


def test_slurm_script_is_valid_bash():
    for text in (_render("smoke", "docker", "sha256:" + "cd" * 32), _render("G11", "pyxis", DIGEST)):
        proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_slurm_refuses_a_registry_image_without_digest(tmp_path):
    arm = Catalog.default().arm("G11")
    with pytest.raises(BadInput, match="REPOSITORY@sha256"):
        slurm.resolve_image(arm, "registry.example/rlk:latest", "pyxis")
    with pytest.raises(BadInput, match="--port-base"):
        slurm.ports(80)


# --- KubeRay -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("platform", ["cuda", "rocm"])
def test_kuberay_golden_and_validated(platform):
    arm = Catalog.default().arm("G11")
    doc = kuberay.validate(kuberay.render(arm, image=DIGEST, platform=platform, workers=1))
    golden(f"kuberay-G11-{platform}.json", kuberay.dumps(doc))
    for spec in (doc["raycluster"]["spec"], doc["rayjob"]["spec"]["rayClusterSpec"]):
        for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
            container = group["template"]["spec"]["containers"][0]
            assert container["image"] == DIGEST
            env = {e["name"]: e["value"] for e in container["env"]}
            assert json.loads(env[NI.ENV])["stack_sha256"] == arm.stack.sha256
            resource = "nvidia.com/gpu" if platform == "cuda" else "amd.com/gpu"
            assert container["resources"]["limits"] == {resource: "8"}
            assert group["template"]["metadata"]["annotations"]["rlk-kit.dev/stack-sha256"] == arm.stack.sha256
            assert "rlk-kit/stack=" in group["rayStartParams"]["labels"]
    assert doc["rayjob"]["spec"]["entrypoint"].startswith("/opt/rlk/venv/bin/python -m kit run --arm G11 --runtime ray")


def test_kuberay_validation_catches_pod_and_envelope_errors():
    doc = kuberay.render(Catalog.default().arm("G11"), image=DIGEST, platform="cuda")
    broken = copy.deepcopy(doc)
    broken["rayjob"]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(CheckFailed, match="rayjob/spec/workerGroupSpecs/0/template/spec/containers/0.*volumeMount"):
        kuberay.validate(broken)
    envelope = copy.deepcopy(doc)
    envelope["raycluster"]["apiVersion"] = "ray.io/v1alpha1"
    with pytest.raises(BadInput):
        kuberay.validate(envelope)
    with pytest.raises(BadInput, match="REPOSITORY@sha256"):
        kuberay.render(Catalog.default().arm("G11"), image="registry.example/rlk:latest", platform="cuda")


def test_kuberay_cli_writes_files_and_refuses_bad_input(tmp_path):
    def kit(*args):
        return subprocess.run([sys.executable, "-m", "kit", "cluster", "kuberay", *args], capture_output=True, text=True)

    ok = kit("--arm", "G11", "--platform", "rocm", "--image", DIGEST, "--out", str(tmp_path / "k8s"), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["schema"] == "rlk-kit/kuberay/v1"
    assert json.loads((tmp_path / "k8s" / "rayjob.json").read_text())["kind"] == "RayJob"
    bad = kit("--arm", "G11", "--image", "registry.example/rlk:latest")
    assert bad.returncode == 2 and "--image" in bad.stderr and "Traceback" not in bad.stderr
    again = kit("--arm", "G11", "--image", DIGEST, "--out", str(tmp_path / "k8s"))
    assert again.returncode == 2 and "raycluster.json" in again.stderr


# --- addresses and timeouts refused at once -------------------------------------------------------------

def _kit(*args, timeout=60):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, "-m", "kit", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_the_address_rule_names_what_is_accepted():
    from kit.adapters.ray import address_problem, check_address

    assert address_problem("http://head:8265") is None and address_problem("https://[::1]:8265") is None
    for bad, says in (("", "empty"), ("  ", "empty"), ("head:8265", "scheme"), ("http://:8265", "no host"),
                      ("http://h:99999", "out of range"), ("http://h 1:8265", "white space")):
        assert says in address_problem(bad), bad
    with pytest.raises(BadInput, match=r"--ray-address http://nowhere:8265: host 'nowhere' does not resolve"):
        check_address("http://nowhere:8265", "--ray-address", resolve=lambda h, p: (_ for _ in ()).throw(OSError("no")))
    assert check_address("http://127.0.0.1:1", "--address") == "http://127.0.0.1:1"


@pytest.mark.parametrize("value", ["nan", "1e400", "inf", "-1", "-inf"])
def test_cluster_wait_refuses_a_timeout_that_cannot_end_or_means_nothing(value):
    proc = _kit("cluster", "wait", "--address", "http://127.0.0.1:1", "--nodes", 1, "--timeout", value)
    assert proc.returncode == 2, proc.stderr
    assert "--timeout" in proc.stderr and "0..86400" in proc.stderr and "Traceback" not in proc.stderr


def test_cluster_wait_and_kit_run_refuse_an_empty_or_unresolvable_address_at_once(tmp_path):
    import time

    empty = _kit("cluster", "wait", "--address", "", "--nodes", 1, "--timeout", 30)
    assert empty.returncode == 2 and "--address '': empty" in empty.stderr
    started = time.monotonic()
    nowhere = _kit("cluster", "wait", "--address", "http://nonexistent-host.invalid:8265", "--nodes", 1, "--timeout", 300)
    run = _kit("run", "--arm", "smoke", "--runtime", "ray", "--ray-address", "http://nonexistent-host.invalid:8265",
               "--workspace", tmp_path, "--allow-dirty")
    elapsed = time.monotonic() - started
    for proc, flag in ((nowhere, "--address"), (run, "--ray-address")):
        assert proc.returncode == 2, proc.stderr
        assert f"{flag} http://nonexistent-host.invalid:8265: host 'nonexistent-host.invalid' does not resolve" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert elapsed < 15, elapsed       # not the run's 20 s reach nor the wait's 300 s
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_g11_on_four_pyxis_nodes_requests_8_gpus_and_mounts_model_data_checkpoint_and_workspace(tmp_path):
    (tmp_path / "model").mkdir(), (tmp_path / "ckpt").mkdir(), (tmp_path / "data.jsonl").write_text("{}\n")
    ws, out = tmp_path / "ws", tmp_path / "g11.sbatch"
    proc = _kit("cluster", "slurm", "--arm", "G11", "--nodes", 4, "--container-runtime", "pyxis", "--image", DIGEST,
                "--partition", "gpu", "--model", tmp_path / "model", "--checkpoint", tmp_path / "ckpt",
                "--prompt-data", tmp_path / "data.jsonl", "--workspace", ws, "--out", out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "#SBATCH --gpus-per-node=8\n" in text and "#SBATCH --nodes=4\n" in text
    mounts = re.search(r"--container-mounts=(\S+) ", text).group(1).split(",")
    assert set(mounts) == {f"{tmp_path}/model:/inputs/model:ro", f"{tmp_path}/ckpt:/inputs/torch_dist:ro",
                           f"{tmp_path}/data.jsonl:/inputs/data/dapo-math-17k.jsonl:ro", f"{ws}:/workspace:rw"}
    # kit run on the batch host hashes the same files and writes the sealed run into the shared workspace
    run_line = next(line for line in text.splitlines() if re.search(r"\brun --arm G11\b", line))
    assert f"--model {tmp_path}/model" in run_line and '--workspace "$WORKSPACE"' in run_line
    assert f"WORKSPACE={ws}\n" in text
    assert text.count("--object-store-memory=200000000000") == 2       # head and workers, the study's size
    # without inputs, G11 names the flag it needs (it reads them at /inputs)
    missing = _kit("cluster", "slurm", "--arm", "G11", "--container-runtime", "pyxis", "--image", DIGEST,
                   "--workspace", tmp_path / "ws2")
    assert missing.returncode == 2 and "give --model DIR" in missing.stderr


def test_one_sizing_rule_for_every_node():
    from kit.model.accelerators import SHM_SIZE, node_sizes

    assert node_sizes("cuda", 8).object_store_bytes == 200_000_000_000 and node_sizes("cuda", 8).gpus_per_node == 8
    assert node_sizes("rocm", 8).shm_bytes > node_sizes("rocm", 8).object_store_bytes
    cpu = node_sizes("cpu", 8)
    assert cpu.gpus_per_node == 0 and cpu.object_store_bytes < cpu.shm_bytes == 2**30 and SHM_SIZE == "1g"


def test_kuberay_keeps_what_the_run_writes_on_a_claim_and_mounts_the_inputs():
    arm = Catalog.default().arm("G11")
    doc = kuberay.validate(kuberay.render(arm, image=DIGEST, platform="cuda", workers=2, inputs_claim="rlk-inputs"))
    assert "--workspace /workspace" in doc["rayjob"]["spec"]["entrypoint"]     # where kit run seals the run
    assert "--model /inputs/model" in doc["rayjob"]["spec"]["entrypoint"]
    for spec in (doc["raycluster"]["spec"], doc["rayjob"]["spec"]["rayClusterSpec"]):
        for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
            pod = group["template"]["spec"]
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
            assert volumes[mounts["/workspace"]["name"]]["persistentVolumeClaim"] == {"claimName": "rlk-workspace"}
            assert volumes[mounts["/inputs"]["name"]]["persistentVolumeClaim"]["claimName"] == "rlk-inputs"
            assert mounts["/inputs"]["readOnly"] is True
            assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["sizeLimit"] == str(208_589_934_592)
            assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
            assert group["rayStartParams"]["object-store-memory"] == "200000000000"
    # an emptyDir only when asked; a hostPath for inputs; the smoke arm keeps small sizes
    smoke = kuberay.validate(kuberay.render(Catalog.default().arm("smoke"), image=DIGEST, platform="cpu",
                                            workspace_volume="emptydir", inputs_host_path="/data/rlk-inputs"))
    pod = smoke["raycluster"]["spec"]["headGroupSpec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["workspace"] == {"name": "workspace", "emptyDir": {}}
    assert volumes["inputs"]["hostPath"] == {"path": "/data/rlk-inputs", "type": "Directory"}
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == str(2**30) and "resources" not in pod["containers"][0]
    assert smoke["raycluster"]["spec"]["headGroupSpec"]["rayStartParams"]["object-store-memory"] == "500000000"
    for bad, says in (({"workspace_volume": "nfs"}, "--workspace-volume nfs"), ({"workspace_claim": "Bad_Name"}, "--workspace-claim"),
                      ({"inputs_claim": "a", "inputs_host_path": "/x"}, "give one of them"),
                      ({"inputs_host_path": "rel"}, "--inputs-host-path 'rel'")):
        with pytest.raises(BadInput, match=re.escape(says)):
            kuberay.render(arm, image=DIGEST, platform="cuda", **bad)
