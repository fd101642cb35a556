"""The gpu engine: its GRPO workload at tiny shapes on the CPU, kit run of a gpu arm, the monitors of every
run, and the committed H200 pair (gpu-native vs gpu-consistency) verified, compared and analysed on the CPU."""

from __future__ import annotations

import copy
import csv
import json
import re
from pathlib import Path

import pytest

from conftest import run_kit
from kit.engines.vime.records import parse_records
from kit.model.documents import read_json_file, schema_problems
from kit.run.monitors import Monitors, plan_samplers
from rlk_kernels.grpo.config import GrpoConfig
from rlk_kernels import ops
from rlk_kernels.grpo.run import run_grpo

REPO = Path(__file__).resolve().parents[2]
PAIR = REPO / "tests" / "data" / "gpu-pair"
MISMATCH = "train/train_current_rollout_logprob_mismatch_count"
MAX_DIFF = "train/train_current_rollout_logprob_max_abs_diff"
MODULES = ("attention", "ffn", "logp")


def tiny_arm(name: str, case: str, rollouts: int = 3) -> dict:
    """A gpu arm at the smoke model's shapes (16 live ids), runnable on the CPU in seconds."""
    doc = read_json_file(REPO / "manifests" / f"{name}.json")
    doc = copy.deepcopy(doc)
    doc["operators"] = {m: case for m in MODULES}
    doc["model"].update(name="tiny", layers=2, hidden=128, ffn_hidden=256, heads=16, query_groups=8, head_dim=8,
                        padded_vocab=64)
    doc["workload"].update(rollout_batch_size=8, global_batch_size=32, max_response_len=8, rollouts=rollouts)
    doc["workload"]["optimizer"]["lr"] = 3e-3
    return doc


def steps(lines):
    return [r.payload for r in parse_records(lines) if r.kind == "step"]


def rewards(lines):
    return [r.payload["rollout/raw_reward"] for r in parse_records(lines) if r.kind == "rollout"]


def test_strict_grpo_is_bitwise_equal_and_production_is_not():
    strict, native = [], []
    run_grpo(GrpoConfig.from_arm(tiny_arm("gpu-consistency", "R/R"), device="cpu"), emit=strict.append)
    run_grpo(GrpoConfig.from_arm(tiny_arm("gpu-native", "P/P"), device="cpu"), emit=native.append)
    assert len(steps(strict)) == len(steps(native)) == 3
    for s in steps(strict):
        assert s[MISMATCH] == 0 and s[MAX_DIFF] == 0 and s["train/train_current_rollout_logprob_numel"] == 8
    assert all(s[MISMATCH] > 0 and s[MAX_DIFF] > 0 for s in steps(native))
    assert any("rlkernel.linear_logp.bitwise.v1" in line for line in strict)
    assert any("torch.matmul_bf16.fp32_log_softmax" in line for line in native)


def test_the_count_on_task_is_learned():
    lines = []
    run_grpo(GrpoConfig.from_arm(tiny_arm("gpu-native", "P/P", rollouts=8), device="cpu"), emit=lines.append)
    got = rewards(lines)
    assert got[0] < 0.2 and max(got[-3:]) > got[0] + 0.2, got


def test_gpu_config_refuses_what_the_engine_cannot_run():
    doc = tiny_arm("gpu-native", "P/P")
    doc["topology"].update(gpus=2, tp=2)
    with pytest.raises(ValueError, match="/topology/tp: 2"):
        GrpoConfig.from_arm(doc, device="cpu")
    doc = tiny_arm("gpu-native", "P/P")
    doc["workload"].update(samples_per_prompt=2, global_batch_size=16)
    with pytest.raises(ValueError, match="at least 4"):
        GrpoConfig.from_arm(doc, device="cpu")


def test_kit_run_of_a_gpu_arm_on_the_cpu_is_sealed_with_monitors(tmp_path):
    arms = tmp_path / "arms"
    arms.mkdir()
    (arms / "stack-gpu-h200.json").write_text((REPO / "manifests" / "stack-gpu-h200.json").read_text())
    (arms / "tiny.json").write_text(json.dumps(tiny_arm("gpu-consistency", "R/R", rollouts=2) | {"name": "tiny"}))
    proc = run_kit("run", "--arm", str(arms / "tiny.json"), "--runtime", "local", "--workspace", str(tmp_path / "ws"),
                   "--run-id", "g1", "--allow-dirty")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = tmp_path / "ws" / "runs" / "g1"
    manifest = read_json_file(run_dir / "manifest.json")
    assert manifest["runtime"]["accelerator"]["torch"]["cuda_available"] is False
    assert manifest["inputs"]["model"]["name"] == "tiny"
    monitors = read_json_file(run_dir / "monitors" / "monitors.json")
    assert schema_problems(monitors, "monitors") == []
    seal = read_json_file(run_dir / "seal.json")
    assert "monitors/monitors.json" in json.dumps(seal)
    assert run_kit("verify", str(run_dir)).returncode == 0


def test_a_smoke_run_has_host_monitors(tmp_path):
    proc = run_kit("run", "--arm", "smoke", "--rollouts", "1", "--run-id", "s1", "--allow-dirty",
                   "--workspace", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = read_json_file(tmp_path / "runs" / "s1" / "monitors" / "monitors.json")
    by_name = {s["name"]: s for s in doc["samplers"]}
    assert {"gpu", "vmstat", "iostat", "psutil"} <= set(by_name)
    host = [by_name[n] for n in ("vmstat", "psutil") if by_name[n]["status"] == "recorded"]
    assert host, "neither vmstat nor psutil recorded the host"
    assert all((tmp_path / "runs" / "s1" / s["file"]).is_file() and s["samples"] >= 1 for s in host)
    for s in doc["samplers"]:
        assert (s["status"] == "missing") == (s["file"] is None)
        assert s["status"] != "missing" or s["note"]


@pytest.mark.ray
def test_a_run_on_ray_samples_the_object_store(tmp_path):
    proc = run_kit("run", "--arm", "smoke", "--rollouts", "2", "--run-id", "r1", "--allow-dirty", "--ray-head",
                   "--workspace", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = tmp_path / "runs" / "r1"
    ray = {s["name"]: s for s in read_json_file(run_dir / "monitors" / "monitors.json")["samplers"]}["ray-object-store"]
    assert ray["status"] == "recorded" and ray["samples"] >= 1, ray
    with open(run_dir / ray["file"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and all(float(r["object_store_total_bytes"]) > 0 for r in rows)


def test_missing_monitor_tools_are_recorded_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    samplers = plan_samplers(0.2)
    assert [s.status for s in samplers if s.name != "psutil"] == ["missing", "missing", "missing"]
    monitors = Monitors(tmp_path, interval_s=0.2, samplers=samplers)
    monitors.start()
    doc = monitors.stop()
    assert schema_problems(doc, "monitors") == []
    assert read_json_file(tmp_path / "monitors" / "monitors.json") == doc


# --- the committed H200 pair ---------------------------------------------------------------------------

def pair_dirs():
    native = sorted(PAIR.glob("gpu-native-*"))
    consistency = sorted(PAIR.glob("gpu-consistency-*"))
    assert len(native) == len(consistency) == 1
    return native[0], consistency[0]


def test_committed_pair_verifies_and_is_a_controlled_comparison():
    native, consistency = pair_dirs()
    proc = run_kit("verify", str(native), str(consistency))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_kit("compare", str(native), str(consistency))
    assert proc.returncode == 0 and "controlled" in proc.stdout, proc.stdout + proc.stderr
    # the pair ran on the GPU host's own software, not in an image of its stack: same-host, not pinned
    assert "controlled, same-host" in proc.stdout, proc.stdout
    assert run_kit("compare", "--require-pinned", str(native), str(consistency)).returncode == 1
    for run_dir in (native, consistency):
        seal = json.dumps(read_json_file(run_dir / "seal.json"))
        assert "monitors/gpu-dmon.txt" in seal and "monitors/monitors.json" in seal
        accel = read_json_file(run_dir / "manifest.json")["runtime"]["accelerator"]
        assert accel["device"]["name"] == "NVIDIA H200"
        assert re.fullmatch(r"[0-9a-f]{64}", accel["conformance"]["fingerprint"])


def test_committed_pair_meets_the_headline():
    native, consistency = pair_dirs()
    summary = {d: read_json_file(d / "validation.json")["summary"] for d in (native, consistency)}
    assert summary[consistency]["steps_observed"] >= 50 and summary[native]["steps_observed"] >= 50
    assert summary[consistency]["mismatch_count_total"] == 0 and summary[consistency]["max_abs_dlogp"] == 0
    assert summary[native]["mismatch_count_total"] > 0
    tokens = re.search(r"generated_tokens=(\d+) compared_tokens=(\d+) mismatched_tokens=0",
                       (consistency / "run.log").read_text())
    assert tokens and int(tokens.group(1)) >= 10**6 and int(tokens.group(2)) == int(tokens.group(1))
    for run_dir in (native, consistency):
        got = rewards((run_dir / "run.log").read_text().splitlines())
        assert sum(got[-10:]) / 10 > got[0] + 0.5, got


def test_committed_pair_analyses_with_monitor_plots(tmp_path):
    native, consistency = pair_dirs()
    proc = run_kit("analyze", "perf", str(native), str(consistency), "--out", str(tmp_path / "perf"), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "perf" / "monitors.png").is_file() and (tmp_path / "perf" / "monitors.pdf").is_file()
    steady = json.loads(proc.stdout)["subsets"]["steady"]["comparisons"][0]
    assert steady["label"] == "controlled comparison"
    step = steady["metrics"]["step_time_s"]
    ratio = step["other_mean"] / step["reference_mean"]
    assert ratio <= 1.10, ratio
    proc = run_kit("analyze", "convergence", str(native), str(consistency), "--out", str(tmp_path / "conv"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "conv" / "runs.csv", newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 2


def test_width_one_pair_is_bitwise_equal_on_both_sides_and_controlled():
    lines = []
    run_grpo(GrpoConfig.from_arm(tiny_arm("gpu-consistency-w1", "R/R"), device="cpu"), emit=lines.append)
    assert [s[MISMATCH] for s in steps(lines)] == [0, 0, 0]
    assert all(s["train/train_current_rollout_logprob_numel"] > 0 for s in steps(lines))
    proc = run_kit("compare", "gpu-native-w1", "gpu-consistency-w1")
    assert proc.returncode == 0 and "controlled" in proc.stdout and "declared factors: operators" in proc.stdout


def test_graph_mode_is_read_from_the_arm_and_stated_in_the_log():
    from rlk_kernels.grpo.run import graph_line
    doc = tiny_arm("gpu-native", "P/P")
    config = GrpoConfig.from_arm(doc, device="cpu")
    assert config.decode_graph_sizes == () and graph_line(config).startswith("gpu decode graphs: NONE")
    doc["graph"] = {"mode": "FULL_DECODE_ONLY", "capture_sizes": list(range(1, 33))}
    config = GrpoConfig.from_arm(doc, device="cpu")
    assert config.decode_graph_sizes == tuple(range(1, 33))
    assert "batch sizes 1..32 (none here: no CUDA device" in graph_line(config)
    doc["graph"]["mode"] = "PIECEWISE"
    with pytest.raises(ValueError, match="/graph/mode: 'PIECEWISE'.*NONE or FULL_DECODE_ONLY"):
        GrpoConfig.from_arm(doc, device="cpu")


def test_a_weight_sync_refills_the_rollout_weights_and_layouts_in_place():
    import torch
    from rlk_kernels.grpo import policy
    config = GrpoConfig.from_arm(tiny_arm("gpu-consistency", "R/R"), device="cpu")
    cfg = config.model
    engine = policy.RolloutEngine(cfg, impls=config.impls("rollout"), dtype=torch.float32, device="cpu")
    params = policy.init_policy_weights(cfg, 3, "cpu")
    engine.load_weights(params)
    addresses = {k: v.data_ptr() for k, v in engine.weights.items()}
    layouts = [(w["qkv_shards"].data_ptr(), w["gate_up_shards"].data_ptr()) for w in engine.layer_ws]
    moved = {k: v + 0.5 for k, v in params.items()}
    engine.load_weights(moved)
    assert {k: v.data_ptr() for k, v in engine.weights.items()} == addresses
    assert [(w["qkv_shards"].data_ptr(), w["gate_up_shards"].data_ptr()) for w in engine.layer_ws] == layouts
    for index, w in enumerate(engine.layer_ws):
        fresh = ops.layer_weights(engine.weights, cfg, index)
        assert torch.equal(w["qkv_shards"], fresh["qkv_shards"]) and torch.equal(w["gate_up_shards"], fresh["gate_up_shards"])
    assert torch.equal(engine.weights["embed"], moved["embed"])
