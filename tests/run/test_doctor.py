"""`kit doctor`: pure rules over made-up observations, then the real engine, a real Ray head and workspaces."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.cli import cli
from kit.run.doctor import (
    FAIL,
    PASS,
    SKIP,
    ArmSpec,
    Context,
    Gpu,
    check_arm_image,
    check_checkpoint,
    check_model,
    check_other_images,
    check_prompt_data,
    find_stack_image,
    judge_docker,
    judge_gpu_runtime,
    judge_gpus,
    judge_other_images,
    judge_ray,
    judge_space,
    load_arm,
    min_driver_for_cuda,
    observe_ray,
    run_doctor,
)
from kit.build.plan import ContextEntry, context_tar
from kit.model.documents import schema_problems
from kit.inputs.files import hash_tree, tree_sha256
from kit.inputs.prepare import PUBLISHED_OUTPUT_SHA256, Workspace, prepare_dataset, prepare_model
from fixtures_prepare import EXPECTED_JSONL, make_model, write_parquet

GiB = 1 << 30
HAS_GPU = shutil.which("nvidia-smi") is not None or os.path.exists("/dev/kfd")


def vime_arm(gpus: int = 8, ray: str = "2.57.0", base: str = "nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04@sha256:"
             + "a" * 64, archs=("9.0",)) -> ArmSpec:
    stack = {"name": "vime-test", "packages": {"ray": ray},
             "platforms": {"cuda": {"base_image": base, "cuda_arch_list": list(archs)}}}
    return ArmSpec("V1", {"engine": "vime", "topology": {"gpus": gpus}}, "vime-test", stack, "b" * 64)


def smoke_arm() -> ArmSpec:
    return ArmSpec("S1", {"engine": "smoke", "topology": {"gpus": 1}}, "smoke-test", {"packages": {}}, "c" * 64)


def by_name(checks):
    return {c.name: c for c in checks}


# --- pure rules ------------------------------------------------------------------------------------

def test_gpu_rules():
    h200 = [Gpu("NVIDIA H200", "570.124.06", "9.0")] * 8
    got = by_name(judge_gpus(vime_arm(), h200, "nvidia-smi", "cuda"))
    assert [got[n].status for n in ("gpu.count", "gpu.model", "gpu.driver")] == [PASS, PASS, PASS]

    got = by_name(judge_gpus(vime_arm(), h200[:4], "nvidia-smi", "cuda"))
    assert got["gpu.count"].status == FAIL and "needs 8 GPU(s)" in got["gpu.count"].reason

    old = [Gpu("NVIDIA H100 80GB HBM3", "550.54.15", "9.0")] * 8
    got = by_name(judge_gpus(vime_arm(), old, "nvidia-smi", "cuda"))
    assert got["gpu.driver"].status == FAIL and "570.26" in got["gpu.driver"].reason

    a100 = [Gpu("NVIDIA A100-SXM4-80GB", "575.51.03", "8.0")] * 8
    got = by_name(judge_gpus(vime_arm(), a100, "nvidia-smi", "cuda"))
    assert got["gpu.model"].status == FAIL and "9.0" in got["gpu.model"].reason

    got = by_name(judge_gpus(vime_arm(), [], "no nvidia-smi", "cuda"))
    assert got["gpu.count"].status == FAIL and got["gpu.model"].status == SKIP

    assert all(c.status == SKIP and "smoke" in c.reason for c in judge_gpus(smoke_arm(), [], "", "cpu"))
    assert min_driver_for_cuda(12, 8) == "570.26" and min_driver_for_cuda(12, 7) == "560.28.03"
    assert min_driver_for_cuda(9, 0) is None


def test_runtime_and_space_rules():
    assert judge_gpu_runtime(vime_arm(), False, False, ["runc"]).status == FAIL
    assert judge_gpu_runtime(vime_arm(), True, False, ["nvidia", "runc"]).status == PASS
    assert judge_gpu_runtime(vime_arm(), False, True, ["runc"]).status == PASS
    assert judge_gpu_runtime(smoke_arm(), False, False, ["runc"]).status == SKIP
    assert judge_space("host.shm", vime_arm(), Path("/dev/shm"), 63 * GiB).status == FAIL
    assert judge_space("host.shm", vime_arm(), Path("/dev/shm"), 64 * GiB).status == PASS
    assert judge_space("host.disk", smoke_arm(), Path("/"), 1 * GiB).status == FAIL
    assert judge_space("host.disk", None, Path("/"), 1 * GiB).status == SKIP


def test_other_images_rule_names_them_and_the_command_that_removes_them():
    none = judge_other_images("smoke", "cpu", [])
    assert none.status == PASS and none.reason == "no cpu images of other inputs of stack smoke on the engine"
    others = [(f"rlk-kit/smoke:cpu-{i:012x}", f"sha256:{i:064x}", GiB) for i in range(8)]
    check = judge_other_images("smoke", "cpu", others)
    assert check.status == PASS and check.details["own_bytes"] == 8 * GiB
    assert "8 cpu image(s) of other inputs of stack smoke hold 8.0 GiB of their own" in check.reason
    small = judge_other_images("smoke", "cpu", [("rlk-kit/smoke:cpu-0123456789ab", "sha256:" + "1" * 64, 3 << 20)])
    assert "1 cpu image(s) of other inputs of stack smoke hold 3.0 MiB of their own" in small.reason
    assert "docker image rm rlk-kit/smoke:cpu-000000000000 " in check.reason and "… (2 more)" in check.reason
    assert [row["ref"] for row in check.details["images"]] == [ref for ref, _, _ in others]


def test_docker_and_ray_rules():
    assert judge_docker({"error": "connection refused"}).status == FAIL
    assert "dockerd" in judge_docker({"error": "x"}).reason
    assert judge_docker({"version": "19.03.1", "api_version": "1.40", "runtimes": []}).status == FAIL
    assert judge_docker({"version": "28.2.2", "api_version": "1.50", "runtimes": []}).status == PASS
    assert judge_ray(None, None, None).status == SKIP
    assert judge_ray(None, "http://h:1", {"error": "refused"}).status == FAIL
    seen = {"ray_version": "2.60.0", "jobs_api_version": "3"}
    assert judge_ray(vime_arm(ray="2.60.0"), "http://h:1", seen).status == PASS
    bad = judge_ray(vime_arm(ray="2.57.0"), "http://h:1", seen)
    assert bad.status == FAIL and "pins ray 2.57.0" in bad.reason


# --- the real engine and the catalog's arms -------------------------------------------------------

LINE = re.compile(r"^(PASS|FAIL|SKIP) [a-z][a-z0-9_.]*: .+$")


def run_kit(*args, env=None):
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.skipif(HAS_GPU, reason="asserts the FAIL of a vime arm on a host without GPUs")
def test_vime_arm_fails_on_gpu_less_host(tmp_path):
    code, out = run_kit("doctor", "--arm", "G10", "--workspace", str(tmp_path), "--json",
                        env={"RAY_ADDRESS": ""})
    assert code == 1
    doc = json.loads(out[: out.rindex("}") + 1])
    assert schema_problems(doc, "rlk-kit/doctor/v1") == []
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["docker.engine"]["status"] == PASS
    assert checks["gpu.runtime"]["status"] == FAIL and checks["gpu.count"]["status"] == FAIL
    assert "needs 8 GPU(s)" in checks["gpu.count"]["reason"]
    assert checks["image"]["status"] == FAIL
    assert checks["inputs.prompt_data"]["status"] == FAIL and "kit prepare" in checks["inputs.prompt_data"]["reason"]
    assert doc["passed"] is False and doc["counts"]["fail"] >= 4

    code, out = run_kit("doctor", "--arm", "G10", "--workspace", str(tmp_path), env={"RAY_ADDRESS": ""})
    lines = out.strip().splitlines()
    assert code == 1 and lines[-2] == "doctor: FAIL"
    assert all(LINE.match(line) for line in lines[:-2]), lines


def test_smoke_arm_on_this_host(tmp_path):
    code, out = run_kit("doctor", "--arm", "smoke", "--workspace", str(tmp_path), "--json", env={"RAY_ADDRESS": ""})
    doc = json.loads(out[: out.rindex("}") + 1])
    assert schema_problems(doc, "rlk-kit/doctor/v1") == []
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["docker.engine"]["status"] == PASS
    for name in ("gpu.runtime", "gpu.count", "gpu.model", "gpu.driver"):
        assert checks[name]["status"] == SKIP and "smoke" in checks[name]["reason"]
    assert checks["inputs.prompt_data"]["status"] == SKIP and "built-in prompts" in checks["inputs.prompt_data"]["reason"]
    assert checks["ray.cluster"]["status"] == SKIP
    assert checks["host.shm"]["status"] == PASS  # this host has far more than 1 GiB of /dev/shm
    assert checks["image.others"]["status"] == PASS       # information, never a failure
    image = checks["image"]
    # whether the smoke image was built on this engine decides PASS; otherwise the FAIL says what to do
    assert (image["status"] == PASS and "matches stack" in image["reason"]) or (
        image["status"] == FAIL and ("kit build cpu --arm smoke" in image["reason"]
                                     or "does not match stack" in image["reason"]))
    assert code == (1 if any(c["status"] == FAIL for c in doc["checks"]) else 0)


def test_unknown_arm_is_bad_input():
    code, out = run_kit("doctor", "--arm", "no-such-arm")
    # the message names the flag and the accepted names
    assert code == 2 and "unknown arm 'no-such-arm' given to --arm; accepted: the arms in" in out
    assert "G10" in out and "smoke" in out


def test_unknown_arm_names_the_argument_it_came_from():
    from kit.model.catalog import Catalog
    from kit.model.errors import BadInput

    with pytest.raises(BadInput, match=r"^unknown arm 'zz'; accepted"):  # no command line: no flag
        Catalog.default().arm("zz")
    result = CliRunner().invoke(cli, ["compare", "native", "no-such-arm"])
    assert result.exit_code == 2 and "unknown arm 'no-such-arm' given to B;" in result.output


def test_image_lookup_on_real_engine():
    import docker

    client = docker.from_env()
    stack = f"doctor-fixture-{uuid.uuid4().hex[:8]}"
    sha = uuid.uuid4().hex * 2
    dockerfile = (f"FROM scratch\nLABEL dev.rlk-kit.stack.sha256={sha} dev.rlk-kit.platform=cpu "
                  f"dev.rlk-kit.stack.name={stack}\n").encode()
    by_tag, _ = client.images.build(fileobj=io.BytesIO(f"FROM scratch\nLABEL x={stack}\n".encode()),
                                    tag=f"rlk-kit/{stack}:cpu-0123456789ab", rm=True)
    by_label, _ = client.images.build(fileobj=io.BytesIO(dockerfile), tag=f"{stack}-retagged:latest", rm=True)
    try:
        # the labels win over the tag form; the tag form is the fallback
        assert find_stack_image(stack, sha, "cpu", client).id == by_label.id
        assert find_stack_image(stack, "d" * 64, "cpu", client).id == by_tag.id
        assert find_stack_image(stack, "d" * 64, "cuda", client) is None

        absent = ArmSpec("A1", {"engine": "smoke", "topology": {"gpus": 1}}, stack + "-absent", {}, "e" * 64)
        check = check_arm_image(Context(arm=absent))
        assert check.status == FAIL
        assert check.reason.startswith("image not built") and "kit build cpu --arm A1" in check.reason

        # found, but kit.images.check_image finds no embedded stack and other labels: FAIL, naming them
        wrong = ArmSpec("A2", {"engine": "smoke", "topology": {"gpus": 1}}, stack,
                        {"name": stack, "platforms": {}, "packages": {}, "sources": []}, sha)
        check = check_arm_image(Context(arm=wrong))
        assert check.status == FAIL and "does not match stack" in check.reason
        assert "/opt/rlk/stack.json" in check.reason
    finally:
        client.images.remove(by_label.id, force=True)
        client.images.remove(by_tag.id, force=True)


@pytest.mark.docker
def test_doctor_and_the_docker_runtime_choose_the_same_image():
    """Two images of one stack and platform, and a newer one of another platform: the Docker runtime
    (whose choice kit suite plans with) and doctor both take the newest of the arm's platform."""
    from types import SimpleNamespace

    import docker
    from kit.runtimes.docker import DockerRuntime

    client = docker.from_env()
    stack = f"doctor-pick-{uuid.uuid4().hex[:8]}"
    sha = uuid.uuid4().hex * 2

    def build(platform: str, n: int):
        dockerfile = (f"FROM scratch\nLABEL dev.rlk-kit.stack.sha256={sha} dev.rlk-kit.platform={platform} "
                      f"dev.rlk-kit.stack.name={stack} build={n}\n").encode()
        return client.images.build(fileobj=io.BytesIO(dockerfile), tag=f"rlk-kit/{stack}:{platform}-{n}", rm=True)[0]

    older = build("cpu", 1)
    time.sleep(1.1)
    newer = build("cpu", 2)
    time.sleep(1.1)
    other_platform = build("rocm", 3)        # newest of all, but not what a cpu arm runs
    made = []
    try:
        from kit.adapters.docker import image_age_key as key
        from kit.build.lookup import stack_image

        assert key(older) < key(newer) < key(other_platform)
        assert stack_image(client, sha, "cpu").id == newer.id
        assert find_stack_image(stack, sha, "cpu", client).id == newer.id

        arm = SimpleNamespace(name="A1", platform="cpu", stack=SimpleNamespace(name=stack, sha256=sha))
        runtime = DockerRuntime(arm=arm, image=None, workspace=Path("."), run_id="r1")
        runtime.client = client
        assert runtime._find_image() == f"rlk-kit/{stack}:cpu-2"

        spec = ArmSpec("A1", {"engine": "smoke", "topology": {"gpus": 1}}, stack,
                       {"name": stack, "platforms": {}, "packages": {}, "sources": []}, sha)
        check = check_arm_image(Context(arm=spec))
        assert check.details["id"] == newer.id and check.details["image"] == f"rlk-kit/{stack}:cpu-2"

        # what else the engine holds of this stack and platform: the older build and one of another
        # revision (its own 1 MiB layer), not the chosen image and not the other platform's
        blob = os.urandom(1 << 20)
        files = {"Dockerfile": b"FROM scratch\nCOPY blob /blob\n", "blob": blob}
        context = context_tar([ContextEntry(name, 0o644, "sha256:" + hashlib.sha256(data).hexdigest(), data=data)
                               for name, data in files.items()])
        revision = client.images.build(fileobj=io.BytesIO(context), custom_context=True, tag=f"rlk-kit/{stack}:cpu-9",
                                       rm=True)[0]
        made.append(revision)
        others = check_other_images(Context(arm=spec))
        assert others.status == PASS, others.reason
        rows = {row["ref"]: row for row in others.details["images"]}
        assert sorted(rows) == [f"rlk-kit/{stack}:cpu-1", f"rlk-kit/{stack}:cpu-9"], others.reason
        assert rows[f"rlk-kit/{stack}:cpu-9"]["own_bytes"] >= len(blob) and rows[f"rlk-kit/{stack}:cpu-1"]["own_bytes"] == 0
        assert f"docker image rm rlk-kit/{stack}:cpu-1 rlk-kit/{stack}:cpu-9" in others.reason
    finally:
        for image in (older, newer, other_platform, *made):
            client.images.remove(image.id, force=True)


def test_image_age_orders_by_nanoseconds_not_by_text():
    from types import SimpleNamespace

    from kit.adapters.docker import image_age_key as key

    def image(created, id_="sha256:" + "0" * 64):
        return SimpleNamespace(attrs={"Created": created}, id=id_)

    # the engine drops trailing zeros: .1 is 100 ms, later than .12 read as text would say
    assert key(image("2026-01-02T03:04:05.12Z")) > key(image("2026-01-02T03:04:05.1Z"))
    assert key(image("2026-01-02T03:04:06Z")) > key(image("2026-01-02T03:04:05.999999999Z"))
    assert key(image("2026-01-02T04:04:05+01:00")) == key(image("2026-01-02T03:04:05Z"))
    assert key(image("2026-01-02T03:04:05Z", "sha256:" + "f" * 64)) > key(image("2026-01-02T03:04:05Z"))


# --- a real Ray head ---------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    """`ray start --head --block` in its own process group, which is stopped by its id afterwards."""
    tmp = tempfile.mkdtemp(prefix="rd", dir="/tmp")  # short: Ray's socket paths must stay under 107 bytes
    from kit.runtimes.base import free_ports
    ports = free_ports(("dash", "client", "agent", "metrics"))       # distinct: Ray refuses a shared port
    dash = ports["dash"]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": tmp, "HOME": tmp}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port=0", "--num-cpus=1",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--temp-dir={tmp}",
         f"--ray-client-server-port={ports['client']}", f"--dashboard-agent-listen-port={ports['agent']}",
         f"--metrics-export-port={ports['metrics']}", "--disable-usage-stats"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(url + "/api/version", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("Ray head did not start")
            time.sleep(0.5)
        yield url
    finally:
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
            try:
                os.killpg(proc.pid, sig)  # the group started above, by its id
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)  # Ray leaves gcs_server running on SIGTERM, hence the SIGKILL
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


def test_ray_check_against_real_head(ray_head):
    import ray

    seen = observe_ray(ray_head)
    assert seen.get("ray_version") == ray.__version__, seen
    ok = judge_ray(vime_arm(ray=ray.__version__), ray_head, seen)
    assert ok.status == PASS and ray.__version__ in ok.reason
    pinned_other = judge_ray(vime_arm(ray="2.57.0"), ray_head, seen)
    assert pinned_other.status == FAIL and f"Ray {ray.__version__}" in pinned_other.reason

    code, out = run_kit("doctor", env={"RAY_ADDRESS": ray_head})
    assert code == 0, out
    assert f"PASS ray.cluster: Ray {ray.__version__} at {ray_head}" in out


def test_ray_check_unreachable():
    url = f"http://127.0.0.1:{_free_port()}"
    check = run_doctor(Context(ray_address=url)).checks
    ray_check = by_name(check)["ray.cluster"]
    assert ray_check.status == FAIL and url in ray_check.reason


# --- workspace inputs ------------------------------------------------------------------------------

def test_prompt_data_against_the_published_hash(tmp_path):
    src = write_parquet(tmp_path / "train.parquet")
    ws = tmp_path / "ws"
    arm = vime_arm()
    missing = check_prompt_data(Context(arm=arm, workspace=ws))
    assert missing.status == FAIL and "kit prepare" in missing.reason
    assert check_prompt_data(Context(arm=arm)).status == FAIL
    assert check_prompt_data(Context(arm=smoke_arm(), workspace=ws)).status == SKIP

    # a provenance that expects its own (non-published) hash and records no acceptance
    own = hashlib.sha256(EXPECTED_JSONL.encode()).hexdigest()
    prepare_dataset(ws, source=str(src), expectations={str(src.resolve()): own})
    local = check_prompt_data(Context(arm=arm, workspace=ws))
    assert local.status == FAIL and PUBLISHED_OUTPUT_SHA256 in local.reason

    ws2 = tmp_path / "ws2"
    prepare_dataset(ws2, source=str(src), accept_new_hash=True)
    accepted = check_prompt_data(Context(arm=arm, workspace=ws2))
    assert accepted.status == PASS and "NOT the published" in accepted.reason

    data = Workspace(ws2).data
    data.write_bytes(data.read_bytes() + b"\n")
    tampered = check_prompt_data(Context(arm=arm, workspace=ws2))
    assert tampered.status == FAIL and "changed after kit prepare" in tampered.reason


def make_checkpoint(ws: Path, stack_sha256: str, model_tree_sha256: str, created_at="2026-01-01T00:00:00Z",
                    platform="cuda") -> Path:
    """A converted checkpoint with its provenance, as kit prepare --convert-checkpoint writes them."""
    from kit.model.documents import write_new_document

    w = Workspace(ws)
    ckpt = w.checkpoint_dir(stack_sha256, model_tree_sha256)
    if platform != "cuda":
        ckpt = ckpt.with_name(ckpt.name + f"-{platform}")
    (ckpt / "iter_0000001").mkdir(parents=True)
    (ckpt / "iter_0000001" / "__0_0.distcp").write_bytes(os.urandom(512))
    (ckpt / "latest_checkpointed_iteration.txt").write_text("release")
    files = hash_tree(ckpt)
    write_new_document(w.checkpoint_provenance(ckpt), {
        "schema": "rlk-kit/provenance/v1", "kind": "checkpoint", "created_at": created_at,
        "kit_version": "0.1.0", "arm": "V1", "stack": {"name": "vime-test", "sha256": stack_sha256},
        "image": {"ref": "rlk-kit/vime-test:cuda-0123456789ab", "id": "sha256:" + "1" * 64}, "platform": platform,
        "model_tree_sha256": model_tree_sha256, "command": ["bash", "-lc", "true"],
        "output": ckpt.relative_to(ws).as_posix(), "files": files, "tree_sha256": tree_sha256(files)})
    return ckpt


def test_checkpoint_against_its_provenance(tmp_path):
    ws = tmp_path / "ws"
    arm = vime_arm()
    assert check_checkpoint(Context(arm=arm, workspace=ws)).status == FAIL
    ckpt = make_checkpoint(ws, arm.stack_sha256, "9" * 64)
    assert check_checkpoint(Context(arm=arm, workspace=ws)).status == PASS
    (ckpt / "latest_checkpointed_iteration.txt").write_text("1")
    bad = check_checkpoint(Context(arm=arm, workspace=ws))
    assert bad.status == FAIL and "differs from its provenance" in bad.reason


def test_checkpoint_of_the_arms_stack_is_chosen_not_the_last_by_name(tmp_path):
    ws = tmp_path / "ws"
    arm = vime_arm()
    ours = make_checkpoint(ws, arm.stack_sha256, "1" * 64, created_at="2026-01-02T00:00:00Z")
    # another stack whose sha256 shares the 12 hex digits of the directory name, and sorts last by name
    other = make_checkpoint(ws, arm.stack_sha256[:12] + "f" * 52, "f" * 64, created_at="2026-03-01T00:00:00Z")
    assert max(p.name for p in (ws / "checkpoints").iterdir()) == other.name + ".provenance.json"
    (other / "latest_checkpointed_iteration.txt").write_text("tampered")  # would FAIL if it were chosen
    check = check_checkpoint(Context(arm=arm, workspace=ws))
    assert check.status == PASS and ours.name in check.reason, check.reason

    # two checkpoints of the arm's stack (two models): the newest of the host's platform is used, and said so
    newer = make_checkpoint(ws, arm.stack_sha256, "2" * 64, created_at="2026-02-01T00:00:00Z")
    check = check_checkpoint(Context(arm=arm, workspace=ws))
    assert check.status == PASS and newer.name in check.reason and "newest of 2 checkpoints" in check.reason


def test_model_is_rehashed_and_compared(tmp_path):
    ws = tmp_path / "ws"
    arm = vime_arm()
    assert check_model(Context(arm=smoke_arm(), workspace=ws)).status == SKIP
    assert check_model(Context(arm=None, workspace=ws)).status == SKIP
    assert check_model(Context(arm=arm)).status == FAIL
    missing = check_model(Context(arm=arm, workspace=ws))
    assert missing.status == FAIL and "kit prepare" in missing.reason and "--model" in missing.reason

    model = make_model(tmp_path / "Qwen3-tiny")
    tree = prepare_model(ws, model).document["tree_sha256"]
    ok = check_model(Context(arm=arm, workspace=ws))
    assert ok.status == PASS and tree[:12] in ok.reason and "every hashed model" in ok.reason

    # same size, new mtime: the cache does not answer, the re-hash finds the change and names the file
    weight = model / "model-00002-of-00002.safetensors"
    weight.write_bytes(bytes(b ^ 0xFF for b in weight.read_bytes()))
    changed = check_model(Context(arm=arm, workspace=ws))
    assert changed.status == FAIL and "model-00002-of-00002.safetensors: sha256" in changed.reason
    now = hashlib.sha256(weight.read_bytes()).hexdigest()[:12]
    then = prepare_model_files(ws, tree)["model-00002-of-00002.safetensors"][:12]
    assert changed.details["differences"] == [f"model-00002-of-00002.safetensors: sha256 {now}... differs from {then}..."]
    (model / "extra.bin").write_bytes(b"x")
    (model / "config.json").unlink()
    changed = check_model(Context(arm=arm, workspace=ws))
    assert "config.json: missing" in changed.reason and "extra.bin: not in the provenance" in changed.reason

    shutil.rmtree(model)
    gone = check_model(Context(arm=arm, workspace=ws))
    assert gone.status == FAIL and "is gone" in gone.reason


def prepare_model_files(ws: Path, tree: str) -> dict:
    return json.loads(Workspace(ws).model_provenance(tree).read_text())["files"]


def test_model_check_follows_the_arms_checkpoint(tmp_path):
    """With several hashed models, the one the arm's checkpoint was converted from is checked."""
    ws = tmp_path / "ws"
    arm = vime_arm()
    used = make_model(tmp_path / "used")
    unused = make_model(tmp_path / "unused")
    used_tree = prepare_model(ws, used).document["tree_sha256"]
    prepare_model(ws, unused)
    make_checkpoint(ws, arm.stack_sha256, used_tree)
    (unused / "config.json").write_text("changed")  # not the arm's model: does not matter
    check = check_model(Context(arm=arm, workspace=ws))
    assert check.status == PASS and str(used) in check.reason and str(unused) not in check.reason
    (used / "config.json").write_text("changed")
    assert check_model(Context(arm=arm, workspace=ws)).status == FAIL


def test_default_workspace_is_kit_runs(tmp_path, monkeypatch):
    """Without --workspace, doctor reads the inputs from ./.workspace, where kit run and kit suite look."""
    monkeypatch.chdir(tmp_path)
    src = write_parquet(tmp_path / "train.parquet")
    prepare_dataset(tmp_path / ".workspace", source=str(src), accept_new_hash=True)
    result = CliRunner().invoke(cli, ["doctor", "--arm", "G10", "--json"],
                                env={"KIT_WORKSPACE": None, "RAY_ADDRESS": None})
    doc = json.loads(result.stdout)
    assert doc["workspace"] == str(tmp_path / ".workspace")
    checks = {c["name"]: c for c in doc["checks"]}
    # the data found there are judged (G10 pins the published hash; these test data are not it)
    prompt = checks["inputs.prompt_data"]
    assert prompt["details"]["path"] == str(tmp_path / ".workspace" / "data" / "dapo-math-17k.jsonl"), prompt
    assert prompt["status"] == FAIL and "inputs.prompt_data_sha256" in prompt["reason"], prompt
    assert not any("no workspace" in c["reason"] for c in doc["checks"])
    # $KIT_WORKSPACE still wins over the default, as for kit run
    other = tmp_path / "elsewhere"
    result = CliRunner().invoke(cli, ["doctor", "--arm", "G10", "--json"],
                                env={"KIT_WORKSPACE": str(other), "RAY_ADDRESS": None})
    assert json.loads(result.stdout)["workspace"] == str(other)
    # a file where the workspace should be is bad input naming where the path came from
    (tmp_path / "afile").write_text("x")
    result = CliRunner().invoke(cli, ["doctor", "--arm", "G10", "--workspace", str(tmp_path / "afile")])
    assert result.exit_code == 2 and "--workspace" in result.stderr


def test_model_rehash_reports_progress_on_stderr_only(tmp_path):
    ws = tmp_path / "ws"
    arm = vime_arm()
    model = make_model(tmp_path / "Qwen3-tiny")
    prepare_model(ws, model)
    # a new mtime makes the cache miss, so the files are read again
    for f in model.iterdir():
        os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1000))
    progress = io.StringIO()
    assert check_model(Context(arm=arm, workspace=ws, progress=progress)).status == PASS
    size = sum(f.stat().st_size for f in model.iterdir())
    assert f"hashing {model}: 4/4 files, {size / 1024:.1f} KiB/{size / 1024:.1f} KiB (100%)" in progress.getvalue()
    quiet = io.StringIO()        # now answered from the cache: nothing was hashed, nothing printed
    assert check_model(Context(arm=arm, workspace=ws, progress=quiet)).status == PASS
    assert quiet.getvalue() == ""


def test_report_document_validates():
    report = run_doctor(Context(arm=load_arm("G10")))
    assert schema_problems(report.to_json(), "rlk-kit/doctor/v1") == []
    assert report.passed == all(c.status != FAIL for c in report.checks)


def test_inputs_are_judged_against_the_hashes_the_arm_pins(tmp_path):
    """An arm's inputs.prompt_data_sha256 / model_tree_sha256 decide, whatever kit prepare accepted."""
    def pinning(**pins) -> ArmSpec:
        arm = vime_arm()
        return ArmSpec("V2", {**arm.document, "inputs": pins}, arm.stack_name, arm.stack_document, arm.stack_sha256)

    src = write_parquet(tmp_path / "train.parquet")
    ws = tmp_path / "ws"
    prepare_dataset(ws, source=str(src), accept_new_hash=True)
    actual = hashlib.sha256(Workspace(ws).data.read_bytes()).hexdigest()
    assert check_prompt_data(Context(arm=vime_arm(), workspace=ws)).status == PASS     # accepted at prepare time
    refused = check_prompt_data(Context(arm=pinning(prompt_data_sha256=PUBLISHED_OUTPUT_SHA256), workspace=ws))
    assert refused.status == FAIL and "inputs.prompt_data_sha256" in refused.reason and actual in refused.reason
    assert check_prompt_data(Context(arm=pinning(prompt_data_sha256=actual), workspace=ws)).status == PASS

    model = make_model(tmp_path / "Qwen3-tiny")
    tree = prepare_model(ws, model).document["tree_sha256"]
    wrong = check_model(Context(arm=pinning(model_tree_sha256="0" * 64), workspace=ws))
    assert wrong.status == FAIL and "inputs.model_tree_sha256" in wrong.reason and tree in wrong.reason
    assert check_model(Context(arm=pinning(model_tree_sha256=tree), workspace=ws)).status == PASS
