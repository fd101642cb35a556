"""`kit run` on the local runtime, end to end through the CLI: seal, verify, tamper, modes, secrets,
dry run, run-id reuse, interruption, comparison of runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from kit.model.documents import schema_problems

SECRET = "hf_TopSecretValue_4242"
PASSWORD = "pa55-w0rd-xyz"


def kit(*args, env=None, timeout=600):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "kit", *map(str, args)], capture_output=True, text=True, env=full_env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="module")
def strict_run(workspace):
    proc = kit("run", "--arm", "smoke", "--rollouts", "2", "--run-id", "strict-1", "--allow-dirty",
               env={"KIT_WORKSPACE": str(workspace), "HF_TOKEN": SECRET, "DB_PASSWORD": PASSWORD})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return workspace / "runs" / "strict-1", proc


def test_local_run_seals_and_verifies(strict_run):
    run_dir, proc = strict_run
    assert "sealed" in proc.stdout and str(run_dir) in proc.stdout
    for key in ("steps", "reward (last)", "mismatched tokens (all steps)", "mismatched tokens (last step)", "step time"):
        assert key in proc.stdout
    assert sorted(p.name for p in run_dir.iterdir()) == ["arm.json", "kit.log", "manifest.json", "metrics.jsonl",
                                                         "monitors", "run.log", "seal.json", "status.json",
                                                         "validation.json"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert schema_problems(manifest, "run-manifest") == []
    assert manifest["inputs"]["model"]["weights_sha256"]
    assert manifest["observed_identity"]["schema"] == "rlk-kit/probe/v1"
    first = (run_dir / "run.log").read_text().splitlines()[0]
    assert first.startswith("# rlk-kit run strict-1 ") and "manifest_sha256=" in first
    report = json.loads((run_dir / "validation.json").read_text())
    assert report["passed"] and report["summary"]["mismatch_count_total"] == 0
    assert {g["id"]: g["status"] for g in report["gates"]}["operator-routes"] == "passed"
    ok = kit("verify", str(run_dir))
    assert ok.returncode == 0, ok.stdout


def test_secrets_appear_in_no_file(strict_run):
    run_dir, _ = strict_run
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert SECRET.encode() not in data and PASSWORD.encode() not in data, path
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["environment"]["host"]["HF_TOKEN"] == "<redacted>"
    assert "DB_PASSWORD" in manifest["environment"]["redacted_names"]


@pytest.mark.parametrize("mutation, named", [("flip", "/run.log"), ("delete", "/metrics.jsonl")])
def test_tampering_is_named(strict_run, tmp_path, mutation, named):
    run_dir, _ = strict_run
    copy = tmp_path / run_dir.name          # a copy keeps the run's name: the seal holds the run id
    shutil.copytree(run_dir, copy)
    if mutation == "flip":
        log = copy / "run.log"
        log.chmod(0o644)
        data = bytearray(log.read_bytes())
        data[len(data) // 2] ^= 0x20
        log.write_bytes(bytes(data))
    else:
        (copy / "metrics.jsonl").unlink()
    proc = kit("verify", "--json", str(copy))
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert [p["pointer"] for p in doc["results"][0]["problems"]] == [named]


def test_run_id_is_never_reused(strict_run, workspace):
    proc = kit("run", "--arm", "smoke", "--rollouts", "1", "--run-id", "strict-1", "--allow-dirty",
               env={"KIT_WORKSPACE": str(workspace)})
    assert proc.returncode == 2 and "already used" in proc.stderr and "Traceback" not in proc.stderr


def test_native_mode_records_mismatch_and_passes_pp_gates(workspace, strict_run):
    proc = kit("run", "--arm", "smoke", "--mode", "native", "--rollouts", "2", "--run-id", "native-1", "--allow-dirty",
               "--json", env={"KIT_WORKSPACE": str(workspace)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""                       # --json: no progress, no chatter
    assert json.loads(proc.stdout)["status"] == "succeeded"
    run_dir = workspace / "runs" / "native-1"
    report = json.loads((run_dir / "validation.json").read_text())
    assert report["passed"] and report["summary"]["mismatch_count_total"] > 0
    statuses = {g["id"]: g["status"] for g in report["gates"]}
    assert statuses["rr-bitwise-zero"] == "not_applicable" and statuses["operator-routes"] == "passed"
    # the mismatch figures are counts: per-sample mean × global batch size, summed over the steps
    gbs = json.loads((run_dir / "arm.json").read_text())["workload"]["global_batch_size"]
    means = [r["payload"]["train/train_current_rollout_logprob_mismatch_count"]
             for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]
    assert report["summary"]["mismatch_count_total"] == pytest.approx(sum(m * gbs for m in means))
    assert report["summary"]["mismatch_count_last"] == pytest.approx(means[-1] * gbs)
    # native vs consistency: the derived arm declares the comparison with its base; only operators differ
    cmp = kit("compare", "--json", str(strict_run[0]), str(run_dir))
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr
    doc = json.loads(cmp.stdout)
    assert doc["controlled"] and doc["declared_factors"] == ["operators"]
    assert {d["path"] for d in doc["differences"]} == {"operators.attention", "operators.ffn", "operators.logp"}


def test_same_arm_twice_is_a_controlled_pair(workspace, strict_run):
    proc = kit("run", "--arm", "smoke", "--mode", "consistency", "--rollouts", "2", "--run-id", "strict-2",
               "--allow-dirty", env={"KIT_WORKSPACE": str(workspace)})
    assert proc.returncode == 0, proc.stderr
    cmp = kit("compare", str(strict_run[0]), str(workspace / "runs" / "strict-2"))
    assert cmp.returncode == 0, cmp.stdout


def test_dry_run_creates_nothing(tmp_path):
    proc = kit("run", "--arm", "G10", "--dry-run", "--json", env={"KIT_WORKSPACE": str(tmp_path / "ws")})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "rlk-kit/run-dry-run/v2" and not schema_problems(doc, expected="run-dry-run")
    argv = doc["plan"]["command"]["argv"]
    assert "train.py" in argv and "--tensor-model-parallel-size" in argv
    assert doc["manifest_preview"]["commands"]["train"] == argv
    assert not (tmp_path / "ws").exists()


def test_dry_run_names_every_input_and_its_state(tmp_path):
    # no flags, an empty workspace: the image (none of G11's stack here) and each of the three inputs fail
    env = {"KIT_WORKSPACE": str(tmp_path / "ws")}
    doc = json.loads(kit("run", "--arm", "G11", "--dry-run", "--json", env=env).stdout)
    states = {c["name"]: c["status"] for c in doc["checks"]}
    assert states == {"image": "FAIL", "inputs.model": "FAIL", "inputs.checkpoint": "FAIL",
                      "inputs.prompt_data": "FAIL", "inputs.pins": "SKIP"} and doc["ready"] is False
    assert "kit build cuda --arm G11" in next(c["reason"] for c in doc["checks"] if c["name"] == "image")
    # given inputs are found, and the pinned prompt-data hash is checked against the file given
    model, ckpt, data = tmp_path / "model", tmp_path / "torch_dist", tmp_path / "prompts.jsonl"
    model.mkdir(), ckpt.mkdir()
    data.write_text('{"prompt": "1+1", "label": "2"}\n')
    doc = json.loads(kit("run", "--arm", "G11", "--dry-run", "--json", "--model", model, "--checkpoint", ckpt,
                         "--prompt-data", data, env=env).stdout)
    states = {c["name"]: c["status"] for c in doc["checks"]}
    assert states["inputs.model"] == states["inputs.checkpoint"] == states["inputs.prompt_data"] == "PASS"
    pins = next(c for c in doc["checks"] if c["name"] == "inputs.pins")
    assert pins["status"] == "FAIL" and "prompt_data_sha256" in pins["reason"], pins
    assert doc["manifest_preview"]["input_mounts"][str(model)] == "/inputs/model"
    # the text form says the same, and a real run names every missing input at once, the image first
    text = kit("run", "--arm", "G11", "--dry-run", env=env)
    assert text.returncode == 0 and "ready: no" in text.stdout and text.stdout.count("FAIL inputs.") == 3
    real = kit("run", "--arm", "G11", "--allow-dirty", env=env)
    lines = real.stderr.strip().splitlines()
    assert real.returncode == 2 and "kit build cuda --arm G11" in lines[0] and len(lines) == 4, real.stderr
    assert not (tmp_path / "ws" / "runs").exists()


def test_vime_arm_on_local_runtime_is_refused(tmp_path):
    proc = kit("run", "--arm", "G10", "--runtime", "local", "--allow-dirty", env={"KIT_WORKSPACE": str(tmp_path)})
    assert proc.returncode == 2 and "--runtime docker" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_sigterm_keeps_partial_evidence_without_seal(tmp_path):
    env = dict(os.environ, KIT_WORKSPACE=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", "--arm", "smoke", "--rollouts", "40", "--run-id", "stop-me",
                             "--allow-dirty"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "runs" / "stop-me" / "run.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (log.exists() and "step 0:" in log.read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    run_dir = tmp_path / "runs" / "stop-me"
    assert not (run_dir / "seal.json").exists()
    assert json.loads((run_dir / "status.json").read_text())["status"] == "interrupted"
    assert "step 0:" in (run_dir / "run.log").read_text()
    assert kit("verify", str(run_dir)).returncode == 1


def test_dirty_checkout_is_refused_without_allow_dirty(tmp_path):
    from kit.run.manifest import repository_state

    repo = tmp_path / "repo"
    (repo / "kit").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "kit" / "a.py").write_text("x = 1\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "a"], check=True)
    assert repository_state(repo)["dirty"] is False
    (repo / "kit" / "a.py").write_text("x = 2\n")
    (repo / "unrelated.txt").write_text("outside the run's paths\n")
    state = repository_state(repo)
    assert state["dirty"] is True and state["status"] == [" M kit/a.py"]


# --- refusals before anything starts ---------------------------------------------------------------------

@pytest.mark.parametrize("flag, value, needs", [("--image", "rlk-kit/smoke:x", "docker"),
                                                ("--ray-address", "http://127.0.0.1:1", "ray"),
                                                ("--network", "some-net", "docker")])
def test_flags_of_another_runtime_are_refused_on_local(tmp_path, flag, value, needs):
    proc = kit("run", "--arm", "smoke", "--runtime", "local", flag, value, "--allow-dirty",
               env={"KIT_WORKSPACE": str(tmp_path / "ws")})
    assert proc.returncode == 2, proc.stderr
    assert f"{flag} needs --runtime {needs}" in proc.stderr and "local" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("sub", ["", "below"])
def test_workspace_that_is_a_file_is_bad_input(tmp_path, sub):
    target = tmp_path / "a-file"
    target.write_text("not a directory\n")
    proc = kit("run", "--arm", "smoke", "--rollouts", "1", "--allow-dirty",
               env={"KIT_WORKSPACE": str(target / sub) if sub else str(target)})
    assert proc.returncode == 2, proc.stderr
    assert "KIT_WORKSPACE" in proc.stderr and str(target) in proc.stderr and "Traceback" not in proc.stderr


def test_bad_sign_key_is_refused_before_the_run_and_spends_no_run_id(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    bad = tmp_path / "bad.key"
    bad.write_bytes(b"not a key at all")
    env = {"KIT_WORKSPACE": str(tmp_path / "ws")}
    proc = kit("run", "--arm", "smoke", "--rollouts", "1", "--run-id", "signed-1", "--sign-key", str(bad),
               "--allow-dirty", env=env)
    assert proc.returncode == 2, proc.stderr
    assert "--sign-key" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "ws" / "runs" / "signed-1").exists()
    # the same run id is still free; a good key signs the seal
    key = Ed25519PrivateKey.generate()
    good, pub = tmp_path / "good.pem", tmp_path / "good.pub"
    good.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    proc = kit("run", "--arm", "smoke", "--rollouts", "1", "--run-id", "signed-1", "--sign-key", str(good),
               "--allow-dirty", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "ws" / "runs" / "signed-1"
    assert json.loads((run_dir / "seal.json").read_text())["signature"]["algorithm"] == "ed25519"
    assert kit("verify", "--key", str(pub), str(run_dir)).returncode == 0
    unreadable = kit("verify", "--key", str(tmp_path / "no-such.pub"), str(run_dir))
    assert unreadable.returncode == 2 and "--key" in unreadable.stderr and "Traceback" not in unreadable.stderr


def test_attach_refuses_what_it_cannot_finish(strict_run, tmp_path):
    run_dir, _ = strict_run
    sealed = kit("run", "--attach", str(run_dir))
    assert sealed.returncode == 2 and "already sealed" in sealed.stderr
    other = kit("run", "--attach", str(tmp_path))
    assert other.returncode == 2 and "not a run directory" in other.stderr
    mixed = kit("run", "--attach", str(run_dir), "--arm", "smoke", "--rollouts", "3")
    assert mixed.returncode == 2 and "--arm" in mixed.stderr and "--rollouts" in mixed.stderr
    for proc in (sealed, other, mixed):
        assert "Traceback" not in proc.stderr


def test_attach_refuses_a_run_that_was_not_detached(tmp_path):
    run_dir = _interrupted(tmp_path, "not-detached", signal.SIGINT)
    attached = kit("run", "--attach", str(run_dir))
    assert attached.returncode == 2 and "interrupted" in attached.stderr and "detached" in attached.stderr


# --- metrics.jsonl lines and comparisons of runs that did not complete -------------------------------------

def test_every_metrics_line_is_a_valid_metrics_record(strict_run):
    run_dir, _ = strict_run
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert lines
    for number, line in enumerate(lines, start=1):
        doc = json.loads(line)
        assert schema_problems(doc, "metrics-record") == [], (number, line)
    log = (run_dir / "run.log").read_text().splitlines()[1:]            # the job's own lines, after the header
    first = json.loads(lines[0])
    assert f"{first['kind']} {first['step']}:" in log[first["job_log_line"] - 1]


def test_metrics_lines_are_validated_as_they_are_written():
    from kit.model.errors import BadInput
    from kit.run.manifest import metrics_lines
    from kit.engines.vime.records import Record, parse_records

    records = list(parse_records(["(pid=1) step 0: {'train/loss': nan, 'train/x': -inf, 'train/ids': {1, 2}}"]))
    (line,) = metrics_lines(records).splitlines()
    doc = json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert schema_problems(doc, "metrics-record") == []
    assert doc["payload"] == {"train/loss": "NaN", "train/x": "-Infinity", "train/ids": "{1, 2}"}
    with pytest.raises(BadInput, match=r"metrics\.jsonl line 2: /kind: 'stp' is not one of"):
        metrics_lines([records[0], Record("stp", 1, {"train/loss": 1.0}, 2)])


def _interrupted(workspace, run_id: str, signum=signal.SIGTERM):
    """A smoke run stopped by ``signum`` once its first step is logged; its run dir."""
    env = dict(os.environ, KIT_WORKSPACE=str(workspace))
    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", "--arm", "smoke", "--rollouts", "40", "--run-id", run_id,
                             "--allow-dirty"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = workspace / "runs" / run_id
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not ((run_dir / "run.log").exists() and "step 0:" in (run_dir / "run.log").read_text()):
        time.sleep(0.2)
    proc.send_signal(signum)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    return run_dir


def test_compare_with_a_run_that_did_not_complete_is_not_controlled(strict_run, workspace, tmp_path):
    sealed = strict_run[0]
    stopped = _interrupted(workspace, "stopped-1")
    cmp = kit("compare", "--json", str(sealed), str(stopped))
    assert cmp.returncode == 1, cmp.stdout + cmp.stderr
    doc = json.loads(cmp.stdout)
    assert schema_problems(doc, "comparison") == [] and doc["schema"] == "rlk-kit/comparison/v4"
    assert not doc["controlled"] and [d["path"] for d in doc["differences"]] == ["workload.rollouts"]
    assert [(n["run"], n["status"], n["sealed"]) for n in doc["not_comparable"]] == [(str(stopped), "interrupted", False)]
    # nothing differs between the interrupted run and a copy of it: only their standing makes the pair uncontrolled
    twin = tmp_path / "stopped-twin"
    shutil.copytree(stopped, twin)
    shown = kit("compare", str(stopped), str(twin))
    assert shown.returncode == 1 and "NOT a controlled comparison" in shown.stdout, shown.stdout + shown.stderr
    assert f"not comparable: {stopped}: status interrupted, not sealed" in shown.stdout
    assert f"not comparable: {twin}: status interrupted, not sealed" in shown.stdout

    # a run that succeeded but whose seal is gone is no evidence either
    unsealed = tmp_path / "unsealed"
    shutil.copytree(sealed, unsealed)
    (unsealed / "seal.json").unlink()
    cmp = kit("compare", "--json", str(sealed), str(unsealed))
    assert cmp.returncode == 1
    (entry,) = json.loads(cmp.stdout)["not_comparable"]
    assert entry["status"] == "succeeded" and not entry["sealed"] and "not sealed" in entry["reason"]
    # two sealed runs of the same arm stay a controlled pair
    assert kit("compare", str(sealed), str(sealed)).returncode == 0
