"""kit cluster with real Docker, Ray and Slurm: a 3-node local cluster runs the smoke arm across nodes
and seals; a worker from another tag is refused by name; down removes everything, also what the state
file lost; a one-host Slurm runs the smoke arm from `kit cluster slurm --submit` to a sealed run."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kit.cluster.local import CLUSTER_LABEL, leftovers
from kit.cluster.slurm import JOB_LABEL, PORT_FLAGS

REPO = Path(__file__).resolve().parents[2]


def kit(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "kit", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})


def _cluster_up(ws, nodes, image, *worker_images):
    """``image`` None: the default path, the arm's image found by its stack's labels (kit/build/lookup.py)."""
    extra = [a for ref in worker_images for a in ("--worker-image", ref)]
    given = ["--image", image] if image else []
    proc = kit("cluster", "up", "--arm", "smoke", "--local", nodes, *given, *extra, "--workspace", ws, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _down(ws, docker_engine):
    """kit cluster down, also after a failed up; nothing labelled with the cluster's id remains."""
    proc = kit("cluster", "down", "--workspace", ws, "--json")
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    assert state["status"] == "down" and leftovers(docker_engine, state["cluster_id"]) == []


def test_three_node_cluster_runs_smoke_across_nodes(cpu_image, docker_engine, tmp_path):
    ws = tmp_path / "ws"
    try:
        state = _cluster_up(ws, 3, None)      # no --image: the first example of `kit cluster --help`
        assert [n["role"] for n in state["nodes"]] == ["head", "worker", "worker"]
        run = kit("run", "--arm", "smoke", "--runtime", "ray", "--ray-address", state["address"], "--rollouts", 2,
                  "--run-id", "across-3", "--workspace", ws, "--allow-dirty")
        assert run.returncode == 0, run.stderr[-3000:]
    finally:
        _down(ws, docker_engine)
    run_dir = ws / "runs" / "across-3"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    nodes = manifest["ray_cluster"]["nodes"]
    assert len(nodes) == 3
    assert {n["node_identity"]["name"] for n in nodes} == {n["name"] for n in state["nodes"]}
    assert {n["node_identity"]["image_id"] for n in nodes} == {cpu_image.image_id}
    assert {n["labels"]["rlk-kit/stack"] for n in nodes} == {manifest["stack"]["sha256"][:32]}
    assert manifest["ray_cluster"]["actor_identity_check"]["expected"]["node"]["image_id"] == cpu_image.image_id
    placed = re.search(r"placement: rollout on node (\w+), trainer on node (\w+)", (run_dir / "run.log").read_text())
    assert placed and placed.group(1) != placed.group(2), "rollout and trainer actors on one node"
    assert {placed.group(1), placed.group(2)} <= {n["node_id"] for n in nodes}
    assert kit("verify", run_dir).returncode == 0
    assert docker_engine.containers.list(all=True, filters={"label": CLUSTER_LABEL}) == []


@pytest.fixture()
def other_tag(cpu_image, docker_engine):
    """The smoke image retagged with one label changed: another image id, the same software inside."""
    container = docker_engine.containers.create(cpu_image.image_id, entrypoint=["true"])
    image = container.commit(repository="rlk-kit-test/other-tag", tag=uuid.uuid4().hex[:8],
                             changes=["LABEL dev.rlk-kit.inputs.sha256=" + "0" * 64])
    container.remove(force=True)
    yield image
    docker_engine.images.remove(image.id, force=True)


def test_worker_from_another_tag_is_refused_by_name(cpu_image, other_tag, docker_engine, tmp_path):
    ws = tmp_path / "ws"
    try:
        state = _cluster_up(ws, 2, cpu_image.tag, other_tag.tags[0])
        refused = kit("run", "--arm", "smoke", "--runtime", "ray", "--ray-address", state["address"], "--rollouts", 2,
                      "--run-id", "mixed-2", "--workspace", ws, "--allow-dirty")
        # a crash before up recorded its containers: down still finds them by label
        path = ws / "cluster" / "state.json"
        lost = json.loads(path.read_text())
        path.write_text(json.dumps(dict(lost, nodes=[], status="starting")))
    finally:
        _down(ws, docker_engine)
    assert refused.returncode == 1, refused.stdout + refused.stderr[-2000:]
    worker = state["nodes"][1]["name"]
    assert worker in refused.stderr and "node_identity.image_id" in refused.stderr
    assert cpu_image.image_id in refused.stderr and other_tag.id in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (ws / "runs" / "mixed-2").exists()


def test_without_an_image_of_the_stack_the_default_path_names_the_build_command(tmp_path):
    from kit.model.catalog import Catalog

    # an arm whose stack no image on this engine carries: exit 2, the build command first; slurm, which
    # also mounts the run's inputs, names every missing one in the same message (one line each)
    arm = Catalog.default().arm("G11")
    for args in (("cluster", "up", "--arm", arm.name, "--local", 2), ("cluster", "slurm", "--arm", arm.name)):
        proc = kit(*args, "--workspace", tmp_path)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert f"kit build cuda --arm {arm.name}" in lines[0] and "Traceback" not in proc.stderr
        if args[1] == "up":
            assert len(lines) == 1, proc.stderr
        else:
            assert [flag for flag in ("--model", "--checkpoint", "--prompt-data") if flag in proc.stderr] == \
                ["--model", "--checkpoint", "--prompt-data"] and len(lines) == 4, proc.stderr


def test_up_refuses_bad_input_without_starting_anything(tmp_path, docker_engine):
    one = kit("cluster", "up", "--arm", "smoke", "--local", 1, "--workspace", tmp_path)
    assert one.returncode == 2 and "--local 1" in one.stderr
    none = kit("cluster", "down", "--workspace", tmp_path)
    assert none.returncode == 0 and "no cluster" in none.stderr
    assert kit("cluster", "address", "--workspace", tmp_path).returncode == 1


def _port_base() -> int:
    """A base whose next len(PORT_FLAGS) ports are all free now."""
    for base in range(47000, 60000, 97):
        held = []
        try:
            for p in range(base, base + len(PORT_FLAGS)):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError("no free port range")


def test_slurm_submit_runs_the_smoke_arm_to_a_sealed_run(cpu_image, docker_engine, tmp_path):
    proc = subprocess.run([str(REPO / "scripts" / "ensure-slurm.sh")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ws = tmp_path / "ws"
    model, data = tmp_path / "inputs" / "model", tmp_path / "inputs" / "prompts.jsonl"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}\n")
    data.write_text('{"prompt": "1+1", "label": "2"}\n')
    # no --image: the default path finds the arm's image by its stack's labels
    proc = kit("cluster", "slurm", "--arm", "smoke", "--nodes", 1, "--head-ip",
               "127.0.0.1", "--port-base", _port_base(), "--rollouts", 2, "--allow-dirty", "--workspace", ws,
               "--model", model, "--prompt-data", data, "--submit", "--json")
    doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    output = Path(doc["job"]["output"]).read_text() if doc.get("job") else ""
    assert proc.returncode == 0, proc.stderr[-2000:] + output[-3000:]
    assert doc["schema"] == "rlk-kit/slurm-job/v1" and doc["job"]["state"] == "COMPLETED"
    run_dir = Path(doc["run_dir"])
    assert (run_dir / "seal.json").exists() and kit("verify", run_dir).returncode == 0
    nodes = json.loads((run_dir / "manifest.json").read_text())["ray_cluster"]["nodes"]
    assert [n["node_identity"]["runtime"] for n in nodes] == ["slurm+docker"]
    # the image the default path picked (the newest carrying the stack's labels: cpu_image or an equal build)
    picked = docker_engine.images.get(doc["image"])
    assert nodes[0]["node_identity"]["image_id"] == picked.id
    assert picked.labels["dev.rlk-kit.stack.sha256"] == cpu_image.record["stack"]["sha256"] if "stack" in cpu_image.record \
        else picked.labels["dev.rlk-kit.stack.sha256"] == docker_engine.images.get(cpu_image.image_id).labels["dev.rlk-kit.stack.sha256"]
    assert docker_engine.containers.list(all=True, filters={"label": f"{JOB_LABEL}={doc['job']['id']}"}) == []
    # the node's container had the inputs read-only where the image reads them and the shared workspace
    mounted = re.search(r"rlk: mounts rlk-slurm-\S+-head-\S+: (.*)", output)
    assert mounted, output[-3000:]
    assert {f"{model}:/inputs/model:ro", f"{data}:/inputs/data/dapo-math-17k.jsonl:ro",
            f"{ws.resolve()}:/workspace:rw"} <= set(mounted.group(1).split()), mounted.group(0)
    # the sealed run is in the shared workspace, after the job and its containers are gone
    assert run_dir.parent == ws.resolve() / "runs"
