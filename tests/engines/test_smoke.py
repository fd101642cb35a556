"""The embedded smoke workload: records, exact zero under R/R, mismatch under P, learning, Ray actors."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit.engines.vime.records import parse_records
from rlk_kernels.smoke import SmokeConfig, run_smoke, run_smoke_on_ray

ARM = json.loads((Path(__file__).resolve().parents[2] / "manifests" / "smoke.json").read_text())
MISMATCH = "train/train_current_rollout_logprob_mismatch_count"
MAX_DIFF = "train/train_current_rollout_logprob_max_abs_diff"


def arm(cases=("R/R", "R/R", "R/R"), **topology):
    doc = copy.deepcopy(ARM)
    doc["operators"] = dict(zip(("attention", "ffn", "logp"), cases))
    doc["topology"].update(topology)
    return doc


def run(doc, rollouts):
    lines = []
    steps = run_smoke(SmokeConfig.from_arm(doc).with_rollouts(rollouts), emit=lines.append)
    assert steps == rollouts
    return lines


def steps_of(lines):
    return [r.payload for r in parse_records(lines) if r.kind == "step"]


def test_consistency_is_bitwise_zero_for_tp2_cp4_against_rollout_tp4():
    lines = run(arm(tp=2, cp=4, rollout_tp=4), 8)
    steps = steps_of(lines)
    assert len(steps) == 8
    for s in steps:
        assert s[MISMATCH] == 0 and s[MAX_DIFF] == 0 and s["train/train_rollout_logprob_abs_diff"] == 0
        assert s["train/train_current_rollout_logprob_numel"] > 0
    assert any(s["train/grad_norm"] > 0 for s in steps)


def test_native_shows_mismatch_and_modules_attribute_it():
    native = steps_of(run(arm(("P/P",) * 3, tp=1, cp=1, rollout_tp=1), 2))
    assert all(s[MISMATCH] > 0 and s[MAX_DIFF] > 0 for s in native)
    for cases in (("P/P", "R/R", "R/R"), ("R/R", "P/P", "R/R"), ("R/R", "R/R", "P/P"), ("R/P", "R/R", "R/R")):
        got = steps_of(run(arm(cases, tp=4, cp=2, rollout_tp=2), 1))
        assert got[0][MISMATCH] > 0, cases


def test_records_routes_and_marker_lines():
    lines = run(arm(("R/R", "P/P", "R/R"), tp=8, cp=1, rollout_tp=8), 2)
    records = list(parse_records(lines))
    perf = [r.payload for r in records if r.kind == "perf"]
    assert [r.kind for r in records[:4]] == ["rollout", "perf", "step", "perf"]
    assert len(perf) == 4 and "perf/rollout_time" in perf[0] and "perf/step_time" in perf[1]
    for key in ("perf/train_time", "perf/actor_train_time", "perf/update_weights_time", "perf/train_wait_time",
                "perf/data_preprocess_time", "perf/actor_train_tok_per_s", "perf/actor_train_tflops"):
        assert key in perf[1]
    rollout = [r.payload for r in records if r.kind == "rollout"][0]
    for key in ("rollout/raw_reward", "rollout/rewards", "rollout/response_lengths", "rollout/total_lengths",
                "rollout/truncated", "rollout/truncated_ratio", "rollout/response_len/mean"):
        assert key in rollout
    step = steps_of(lines)[0]
    for key in ("train/loss", "train/pg_loss", "train/pg_clipfrac", "train/entropy_loss", "train/ppo_kl",
                "train/grad_norm", "train/lr-pg_0", "train/kl_loss", "train/train_rollout_logprob_abs_diff",
                "train/train_current_rollout_logprob_numel"):
        assert key in step
    assert lines.count("rlkernel mismatch sidecar active: logp_case=R/R") == 1
    routes = [l for l in lines if l.startswith("[RL-Kernel][route]")]
    assert len(routes) == 6 and not any("fallback=true" in l for l in routes)
    assert any("framework=smoke-train target=training module=ffn requested=production" in l for l in routes)
    assert any("framework=smoke-rollout target=rollout module=attention requested=rl_kernel actual=rlkernel." in l for l in routes)


# reference section 4.1: the perf keys of VIME's two per-step perf lines, by the line that carries them
PERF_ROLLOUT_KEYS = ("perf/rollout_time", "perf/tokens_per_gpu_per_sec", "perf/effective_tokens_per_gpu_per_sec",
                     "perf/longest_sample_tokens_per_sec", "perf/longest_effective_sample_tokens_per_sec")
PERF_TRAIN_KEYS = ("perf/step_time", "perf/train_time", "perf/train_wait_time", "perf/wait_time_ratio",
                   "perf/update_weights_time", "perf/data_preprocess_time", "perf/actor_train_time",
                   "perf/actor_train_tok_per_s", "perf/actor_train_tflops", "perf/log_probs_time", "perf/log_probs_tflops")
PERF_REF_KEYS = ("perf/ref_log_probs_time", "perf/ref_log_probs_tflops")  # only with a reference model (KL loss)


def perf_lines(lines):
    """{step: (rollout-side perf payload, train-side perf payload)}, told apart as kit's reader does."""
    by_step = {}
    for r in parse_records(lines):
        if r.kind == "perf":
            by_step.setdefault(r.step, []).append(r.payload)
    assert all(len(pair) == 2 for pair in by_step.values())
    return by_step


@pytest.mark.parametrize("use_kl", [False, True])
def test_perf_records_carry_every_reference_perf_key(use_kl):
    doc = arm()
    if use_kl:
        doc["workload"]["kl"] = {"use_kl_loss": True, "coef": 0.01}
    lines = run(doc, 2)
    train_keys = PERF_TRAIN_KEYS + (PERF_REF_KEYS if use_kl else ())
    by_step = perf_lines(lines)
    assert sorted(by_step) == [0, 1]
    for rollout_side, train_side in by_step.values():
        assert set(rollout_side) == set(PERF_ROLLOUT_KEYS)
        assert set(train_side) == set(train_keys)
        for payload in (rollout_side, train_side):
            assert all(isinstance(v, float) and v > 0 for v in payload.values()), payload
        # the logp recompute is the actor's training forward, so it lies inside actor_train_time
        assert train_side["perf/log_probs_time"] <= train_side["perf/actor_train_time"]
        # every generated token is in the loss mask: effective throughputs equal the raw ones
        assert rollout_side["perf/effective_tokens_per_gpu_per_sec"] == rollout_side["perf/tokens_per_gpu_per_sec"]
    all_keys = set(PERF_ROLLOUT_KEYS + PERF_TRAIN_KEYS + PERF_REF_KEYS)
    assert len(all_keys) == 18
    printed = set().union(*(set(a) | set(b) for a, b in by_step.values()))
    assert all_keys - printed == (set() if use_kl else set(PERF_REF_KEYS))


def test_forward_flops_counts_the_model_matmuls():
    from rlk_kernels.model import ModelConfig
    from rlk_kernels.smoke import forward_flops
    cfg = ModelConfig.smoke()
    one, two = forward_flops(cfg, [1]), forward_flops(cfg, [2])
    # params of the matmuls (embedding lookup excluded) x 2 per token, plus causal attention
    matmul_params = sum(cfg.hidden * n for n in (cfg.heads * cfg.head_dim, 2 * cfg.query_groups * cfg.head_dim,
                                                  cfg.heads * cfg.head_dim, 3 * cfg.ffn_hidden)) * cfg.layers
    matmul_params += cfg.hidden * cfg.padded_vocab
    attention_per_key = 4 * cfg.heads * cfg.head_dim * cfg.layers
    assert one == 2 * matmul_params + attention_per_key
    assert two == 4 * matmul_params + 3 * attention_per_key
    assert forward_flops(cfg, [1, 2]) == one + two


def test_reward_improves_with_training():
    lines = run(ARM, 40)
    rewards = [r.payload["rollout/raw_reward"] for r in parse_records(lines) if r.kind == "rollout"]
    assert sum(rewards[30:40]) / 10 > sum(rewards[0:10]) / 10


def test_kl_loss_runs_and_is_reported():
    doc = arm()
    doc["workload"]["kl"] = {"use_kl_loss": True, "coef": 0.01}
    steps = steps_of(run(doc, 2))
    assert steps[1]["train/kl_loss"] > 0 and steps[1][MISMATCH] == 0


@pytest.mark.parametrize("pointer, value, message", [
    (("topology", "tp"), 3, "/topology/tp"),
    (("topology", "cp"), 8, "tp*cp"),
    (("workload", "global_batch_size"), 15, "/workload/global_batch_size"),
    (("operators", "ffn"), "X/Y", "/operators/ffn"),
    (("model", "vocab"), 8, "/model/vocab"),
])
def test_bad_arms_name_the_field(pointer, value, message):
    doc = copy.deepcopy(ARM)
    doc[pointer[0]][pointer[1]] = value
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        SmokeConfig.from_arm(doc)


def test_module_entry_point(tmp_path):
    path = tmp_path / "arm.json"
    path.write_text(json.dumps(ARM))
    done = subprocess.run([sys.executable, "-m", "rlk_kernels.smoke", "--arm-file", str(path), "--rollouts", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [r.kind for r in parse_records(done.stdout.splitlines())] == ["rollout", "perf", "step", "perf"]
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    done = subprocess.run([sys.executable, "-m", "rlk_kernels.smoke", "--arm-file", str(bad)], capture_output=True, text=True)
    assert done.returncode == 2 and "bad.json" in done.stderr


def _without_timers(lines):
    out = []
    for r in parse_records(lines):
        if r.kind != "perf":
            out.append((r.kind, r.step, r.payload))
    return out


@pytest.mark.ray
def test_ray_actors_give_the_in_process_records(monkeypatch):
    import tempfile

    import ray

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")   # else a new local ray.init() turns token auth on in os.environ
    # Ray's socket paths must stay under 107 bytes, so a short temp dir rather than pytest's tmp_path
    temp = tempfile.mkdtemp(prefix="rlk-ray-")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp)
    try:
        config = SmokeConfig.from_arm(arm(tp=2, cp=2, rollout_tp=4)).with_rollouts(3)
        remote = []
        assert run_smoke_on_ray(config, emit=remote.append) == 3
    finally:
        ray.shutdown()
    local = []
    run_smoke(config, emit=local.append)
    assert _without_timers(remote) == _without_timers(local)
    assert len(_without_timers(local)) == 6
