"""`kit run` with real Docker and real Ray: the docker runtime, refusals, a killed container, and a
two-container Ray cluster checked node by node (one worker with a different pin is refused and named)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from kit.build import layout as L


def kit(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), timeout=timeout)


@pytest.fixture()
def ws(tmp_path):
    return tmp_path / "ws"


def test_docker_runtime_seals(cpu_image, ws):
    proc = kit("run", "--arm", "smoke", "--runtime", "docker", "--image", cpu_image.tag, "--rollouts", "3",
               "--run-id", "dock-1", "--allow-dirty", env={"KIT_WORKSPACE": str(ws)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = ws / "runs" / "dock-1"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["image"]["id"] == cpu_image.image_id
    # the live container's probe computes the kernel-conformance fingerprint (the smoke shape's)
    assert manifest["observed_identity"]["conformance_fingerprint"] == cpu_image.record["conformance_fingerprint"]
    assert manifest["ray_cluster"]["start_command"][1:3] == ["start", "--head"]
    # the object store as Slurm and KubeRay size it for the arm (kit/model/accelerators.py node_sizes)
    assert "--object-store-memory=500000000" in manifest["ray_cluster"]["start_command"]
    assert manifest["ray_job"]["submission_id"] == "rlk-dock-1"
    status = json.loads((run_dir / "status.json").read_text())
    from kit.model.documents import sha256_of_file
    assert status["job_info"]["metadata"]["manifest_sha256"] == sha256_of_file(run_dir / "manifest.json")
    assert status["job_info"]["metadata"]["image_id"] == cpu_image.image_id
    assert kit("verify", str(run_dir)).returncode == 0
    import docker
    assert not docker.from_env().containers.list(all=True, filters={"label": f"{L.LABEL_PREFIX}.run-id=dock-1"})


def test_image_of_another_stack_is_refused_before_anything_starts(cpu_image, docker_engine, ws):
    dockerfile = f"FROM {cpu_image.image_id}\nLABEL {L.LABEL_PREFIX}.stack.sha256={'e' * 64}\n"
    image, _ = docker_engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag="rlk-kit-test/other-stack:1", rm=True)
    try:
        proc = kit("run", "--arm", "smoke", "--runtime", "docker", "--image", "rlk-kit-test/other-stack:1",
                   "--run-id", "refused-1", "--allow-dirty", env={"KIT_WORKSPACE": str(ws)})
        assert proc.returncode == 1, proc.stderr
        assert f"{L.LABEL_PREFIX}.stack.sha256" in proc.stderr and "Traceback" not in proc.stderr
        assert not (ws / "runs" / "refused-1").exists()
        assert not docker_engine.containers.list(all=True, filters={"label": f"{L.LABEL_PREFIX}.run-id=refused-1"})
    finally:
        docker_engine.images.remove(image.id, force=True)


def test_killed_container_fails_without_seal_and_id_stays_used(cpu_image, docker_engine, ws):
    env = dict(os.environ, KIT_WORKSPACE=str(ws))
    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", "--arm", "smoke", "--runtime", "docker", "--image",
                             cpu_image.tag, "--rollouts", "40", "--run-id", "killed-1", "--allow-dirty"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = ws / "runs" / "killed-1" / "run.log"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (log.exists() and "step 0:" in log.read_text()):
        time.sleep(0.5)
    docker_engine.containers.get("rlk-run-killed-1").kill()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    assert "Traceback" not in err
    run_dir = ws / "runs" / "killed-1"
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    assert "step 0:" in log.read_text()
    assert not (run_dir / "seal.json").exists()
    again = kit("run", "--arm", "smoke", "--runtime", "docker", "--image", cpu_image.tag, "--run-id", "killed-1",
                "--allow-dirty", env={"KIT_WORKSPACE": str(ws)})
    assert again.returncode == 2 and "already used" in again.stderr


# --- a two-container Ray cluster ---------------------------------------------------------------------------

def _start(client, image, name, network, command, ports=None):
    return client.containers.run(image, entrypoint=["sh", "-c", command], detach=True, name=name, network=network,
                                 shm_size="1g", environment={"HOME": "/tmp", "RAY_USAGE_STATS_ENABLED": "0"},
                                 ports=ports or {}, labels={f"{L.LABEL_PREFIX}.test": "ray-cluster"})


def _alive_nodes(head) -> int:
    code, out = head.exec_run([L.PYTHON, "-c", "import ray; ray.init('auto', logging_level='ERROR'); "
                                               "print(sum(n['Alive'] for n in ray.nodes()))"], environment={"HOME": "/tmp"})
    try:
        return int(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


@pytest.fixture()
def ray_cluster(cpu_image, docker_engine):
    from kit.runtimes import free_port

    tag = uuid.uuid4().hex[:8]
    network = docker_engine.networks.create(f"rlk-test-{tag}")
    port = free_port()
    started = []
    head_name = f"rlk-head-{tag}"
    head = _start(docker_engine, cpu_image.image_id, head_name, network.name,
                  f"{L.RAY} start --head --block --port=6379 --dashboard-host=0.0.0.0 --dashboard-port=8265 "
                  "--disable-usage-stats --temp-dir=/tmp/ray", ports={"8265/tcp": ("127.0.0.1", port)})
    started.append(head)

    def add_worker(image_id: str):
        worker = _start(docker_engine, image_id, f"rlk-worker-{tag}-{len(started)}", network.name,
                        f"sleep 3 && {L.RAY} start --block --address={head_name}:6379 --disable-usage-stats")
        started.append(worker)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _alive_nodes(head) < len(started):
            time.sleep(1)
        assert _alive_nodes(head) == len(started)
        return worker

    yield f"http://127.0.0.1:{port}", add_worker
    for c in started:
        c.remove(force=True)
    network.remove()


@pytest.fixture()
def variant_image(cpu_image, docker_engine):
    """The CPU image with one different pin: click's installed metadata says another version."""
    container = docker_engine.containers.run(
        cpu_image.image_id, entrypoint=["sh", "-c",
                                        "sed -i 's/^Version: .*/Version: 0.0.1/' /opt/rlk/venv/lib/python3*/site-packages/click-*.dist-info/METADATA"],
        detach=True)
    container.wait()
    image = container.commit(repository="rlk-kit-test/variant", tag=uuid.uuid4().hex[:8])
    container.remove(force=True)
    yield image.id
    docker_engine.images.remove(image.id, force=True)


def test_ray_cluster_checked_node_by_node(variant_image, ray_cluster, cpu_image, ws):  # cluster torn down first
    address, add_worker = ray_cluster
    add_worker(cpu_image.image_id)
    proc = kit("run", "--arm", "smoke", "--runtime", "ray", "--ray-address", address, "--rollouts", "3",
               "--run-id", "ray-1", "--allow-dirty", env={"KIT_WORKSPACE": str(ws)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((ws / "runs" / "ray-1" / "manifest.json").read_text())
    assert len(manifest["ray_cluster"]["nodes"]) == 2
    # every node computed the kernels' conformance fingerprint, and all agree with the image's
    assert {n["conformance_fingerprint"] for n in manifest["ray_cluster"]["nodes"]} == {
        cpu_image.record["conformance_fingerprint"]}
    assert kit("verify", str(ws / "runs" / "ray-1")).returncode == 0

    add_worker(variant_image)
    refused = kit("run", "--arm", "smoke", "--runtime", "ray", "--ray-address", address, "--rollouts", "3",
                  "--run-id", "ray-2", "--allow-dirty", env={"KIT_WORKSPACE": str(ws)})
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "packages.click" in refused.stderr and "node " in refused.stderr
    assert not (ws / "runs" / "ray-2").exists()


# --- detach and attach -------------------------------------------------------------------------------------

def test_detached_run_is_finished_by_attach(ray_cluster, ws):
    address, _ = ray_cluster
    steps = 30
    proc = kit("run", "--arm", "smoke", "--runtime", "ray", "--ray-address", address, "--rollouts", str(steps),
               "--run-id", "det-1", "--detach", "--allow-dirty", "--json", env={"KIT_WORKSPACE": str(ws)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""                                  # --json: no Ray SDK lines ("Uploading package")
    doc = json.loads(proc.stdout)
    assert doc["status"] == "detached" and doc["submission_id"] == "rlk-det-1"
    run_dir = ws / "runs" / "det-1"
    # nothing final yet: no metrics, no validation, no seal; verify refuses it
    assert sorted(p.name for p in run_dir.iterdir()) == ["arm.json", "kit.log", "manifest.json", "monitors", "run.log",
                                                     "status.json"]
    assert kit("verify", str(run_dir)).returncode == 1

    # an attach that is cut off mid-stream leaves the run detached; the next one re-streams from the start
    first = subprocess.Popen([sys.executable, "-m", "kit", "run", "--attach", str(run_dir)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and first.poll() is None and "step 1:" not in (run_dir / "run.log").read_text():
        time.sleep(0.2)
    if first.poll() is None:
        first.kill()
        first.communicate(timeout=60)
        assert json.loads((run_dir / "status.json").read_text())["status"] == "detached"
    else:
        first.communicate(timeout=60)

    attached = kit("run", "--attach", str(run_dir), "--json")
    if first.returncode == 0:       # the first attach finished before it could be cut off
        assert attached.returncode == 2 and "already sealed" in attached.stderr
    else:
        assert attached.returncode == 0, attached.stdout + attached.stderr
        assert attached.stderr == ""
        assert json.loads(attached.stdout)["status"] == "succeeded"
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "succeeded" and status["job_status"] == "SUCCEEDED"
    lines = (run_dir / "run.log").read_text().splitlines()
    assert lines[0].startswith("# rlk-kit run det-1 ") and sum(line.startswith("#") for line in lines) == 1
    for step in range(steps):
        assert sum(f"step {step}: " in line for line in lines) == 1, step
    report = json.loads((run_dir / "validation.json").read_text())
    assert report["passed"] and report["summary"]["steps_observed"] == steps
    assert kit("verify", str(run_dir)).returncode == 0
    again = kit("run", "--attach", str(run_dir))
    assert again.returncode == 2 and "already sealed" in again.stderr


def test_unreachable_ray_address_is_bad_input(ws):
    from kit.runtimes import free_port

    address = f"http://127.0.0.1:{free_port()}"
    proc = kit("run", "--arm", "smoke", "--runtime", "ray", "--ray-address", address, "--run-id", "nowhere-1",
               "--allow-dirty", env={"KIT_WORKSPACE": str(ws)})
    assert proc.returncode == 2, proc.stderr
    assert f"--ray-address {address}" in proc.stderr and "cannot be reached" in proc.stderr
    assert "Traceback" not in proc.stderr and not (ws / "runs" / "nowhere-1").exists()


def test_interrupt_during_preflight_says_nothing_started_and_leaves_nothing(cpu_image, docker_engine, ws):
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", "--arm", "smoke", "--runtime", "docker", "--image",
                             cpu_image.tag, "--run-id", "int-pre-1", "--allow-dirty"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, KIT_WORKSPACE=str(ws)))
    # The preflight line comes before the container starts; the signal lands while it is being set up.
    assert proc.stderr.readline().strip().endswith("preflight (docker)")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    assert "interrupted during preflight; nothing was started" in err and "Traceback" not in err, err
    assert not (ws / "runs" / "int-pre-1").exists()
    assert not docker_engine.containers.list(all=True, filters={"label": f"{L.LABEL_PREFIX}.run-id=int-pre-1"})


def test_a_pair_in_the_pinned_image_is_pinned_and_a_host_pair_is_same_host(cpu_image, ws, tmp_path):
    # two runs in the image built from the smoke stack's lock: the observed identity is the lock's
    for run_id in ("pin-1", "pin-2"):
        proc = kit("run", "--arm", "smoke", "--runtime", "docker", "--rollouts", "2", "--run-id", run_id,
                   "--allow-dirty", env={"KIT_WORKSPACE": str(ws)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
    pinned = kit("compare", "--json", "--require-pinned", str(ws / "runs" / "pin-1"), str(ws / "runs" / "pin-2"))
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    doc = json.loads(pinned.stdout)
    assert doc["provenance"] == "pinned" and all(r["pinned"] for r in doc["identity"]), doc["identity"]
    manifest = json.loads((ws / "runs" / "pin-1" / "manifest.json").read_text())
    assert manifest["lock"]["installed"] is True and manifest["lock"]["source"] == "image-label"
    assert "identity: pinned" in kit("verify", str(ws / "runs" / "pin-1")).stdout
    # the same arm on this host: comparable with each other, no evidence about the stack
    host = tmp_path / "host-ws"
    for run_id in ("host-1", "host-2"):
        assert kit("run", "--arm", "smoke", "--rollouts", "2", "--run-id", run_id, "--allow-dirty",
                   env={"KIT_WORKSPACE": str(host)}).returncode == 0
    same = kit("compare", "--json", str(host / "runs" / "host-1"), str(host / "runs" / "host-2"))
    doc = json.loads(same.stdout)
    assert same.returncode == 0 and doc["controlled"] and doc["provenance"] == "same-host", same.stdout
    manifest = json.loads((host / "runs" / "host-1" / "manifest.json").read_text())
    assert manifest["lock"]["installed"] is False
    assert kit("compare", "--require-pinned", str(host / "runs" / "host-1"),
               str(host / "runs" / "host-2")).returncode == 1
