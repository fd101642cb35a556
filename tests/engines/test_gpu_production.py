"""Fused production ("P+") of the gpu arms: the arm's ``production`` field (arm/v5), its comparison factor,
the CPU fallback to the eager formula, the fused passes interpreted on the CPU against the eager ones, and
(on a CUDA machine only) the fused kernels and rollout against the eager formula at bf16."""

from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before the production kernels are defined

from kit.evidence.compare import compare_arms, run_view  # noqa: E402
from kit.model.arm import production_of  # noqa: E402
from kit.model.catalog import Catalog  # noqa: E402
from kit.model.documents import read_json_file, schema_problems  # noqa: E402
from rlk_kernels.grpo.config import GrpoConfig  # noqa: E402
from rlk_kernels.grpo.run import run_grpo  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PAIR = REPO / "tests" / "data" / "gpu-pair"
MODULES = ("attention", "ffn", "logp")


def tiny(name: str, production=None, rollouts: int = 2) -> dict:
    doc = copy.deepcopy(read_json_file(REPO / "manifests" / f"{name}.json"))
    doc["model"].update(name="tiny", layers=2, hidden=128, ffn_hidden=256, heads=16, query_groups=8, head_dim=8,
                        padded_vocab=64)
    doc["workload"].update(rollout_batch_size=8, global_batch_size=32, max_response_len=8, rollouts=rollouts)
    doc["workload"]["optimizer"]["lr"] = 3e-3
    if production is None:
        doc.pop("production", None)
    else:
        doc["production"] = production
    return doc


# --- the field -------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["fused", "eager"])
def test_arm_v5_accepts_production(value):
    doc = read_json_file(REPO / "manifests" / "gpu-native.json") | {"production": value}
    assert doc["schema"] == "rlk-kit/arm/v5" and schema_problems(doc, "arm") == []


@pytest.mark.parametrize("value", [True, "fast", 1, None])
def test_arm_v5_refuses_other_production_values_naming_the_accepted_ones(value):
    doc = read_json_file(REPO / "manifests" / "gpu-native.json") | {"production": value}
    problems = dict(schema_problems(doc, "arm"))
    assert "/production" in problems and "'fused'" in problems["/production"] and "'eager'" in problems["/production"]


def test_older_arm_schemas_have_no_production_and_still_read():
    old = read_json_file(REPO / "manifests" / "gpu-native.json")
    old = {k: v for k, v in old.items() if k != "production"} | {"schema": "rlk-kit/arm/v2"}
    assert schema_problems(old, "arm") == []
    assert any("production" in m for _, m in schema_problems(old | {"production": "eager"}, "arm"))  # v2 never had it
    assert production_of(old) == "eager"
    assert GrpoConfig.from_arm(tiny("gpu-native"), device="cpu").production == "eager"


def test_grpo_config_reads_production_and_refuses_other_values():
    assert GrpoConfig.from_arm(tiny("gpu-native", "fused"), device="cpu").production == "fused"
    with pytest.raises(ValueError, match=r"/production: True; accepted: eager, fused"):
        GrpoConfig.from_arm(tiny("gpu-native", True), device="cpu")


def test_the_three_gpu_arms_declare_production():
    catalog = Catalog.load(REPO / "manifests")
    assert {n: catalog.arm(n).production for n in ("gpu-native", "gpu-consistency", "gpu-native-eager")} == {
        "gpu-native": "fused", "gpu-consistency": "fused", "gpu-native-eager": "eager"}
    assert {n: catalog.arm(n).operators["logp"] for n in ("gpu-native", "gpu-consistency", "gpu-native-eager")} == {
        "gpu-native": "P/P", "gpu-consistency": "R/R", "gpu-native-eager": "P/P"}
    assert "eager" in catalog.arm("gpu-native-eager").document["description"]


def test_production_is_a_named_comparison_factor():
    catalog = Catalog.load(REPO / "manifests")
    eager = compare_arms(catalog.arm("gpu-native-eager"), catalog.arm("gpu-native"))
    assert eager.declared_factors == ("production",)
    assert [(d.path, d.a, d.b, d.status) for d in eager.differences] == [("production", "eager", "fused", "declared")]
    pair = compare_arms(catalog.arm("gpu-native"), catalog.arm("gpu-consistency"))
    assert pair.declared_factors == ("operators",)
    assert {d.path for d in pair.differences} == {f"operators.{m}" for m in MODULES}
    assert all(d.status == "declared" for d in pair.differences)


def test_a_committed_gpu_run_without_the_field_compares_as_eager():
    manifest = read_json_file(next(PAIR.glob("gpu-native-*")) / "manifest.json")
    assert "production" not in manifest["arm"] and run_view(manifest)["production"] == "eager"


def test_production_fused_is_refused_for_engines_without_a_fused_path():
    from kit.model.arm import arm_rule_problems
    catalog = Catalog.load(REPO / "manifests")
    smoke = catalog.arm("smoke")
    doc = dict(smoke.document, production="fused", schema="rlk-kit/arm/v5")
    assert any(p == "/production" for p, _ in arm_rule_problems(doc, smoke.stack))
    assert not any(p == "/production" for p, _ in arm_rule_problems(dict(doc, production="eager"), smoke.stack))


# --- the workload ----------------------------------------------------------------------------------

def _records(lines):
    from kit.engines.vime.records import parse_records
    return [(r.kind, r.payload) for r in parse_records(lines) if r.kind in ("rollout", "step")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU fallback: on a CUDA machine fused runs the kernels")
def test_fused_on_the_cpu_falls_back_to_the_eager_formula(monkeypatch):
    monkeypatch.delenv("RLK_TRITON_ON_CPU", raising=False)
    fused, eager = [], []
    run_grpo(GrpoConfig.from_arm(tiny("gpu-native", "fused"), device="cpu"), emit=fused.append)
    run_grpo(GrpoConfig.from_arm(tiny("gpu-native-eager", "eager"), device="cpu"), emit=eager.append)
    # the same formula; a CPU run repeats itself only to the float rounding of its threaded reductions
    assert len(_records(fused)) == len(_records(eager)) == 4
    for (kind_f, f), (kind_e, e) in zip(_records(fused), _records(eager)):
        assert kind_f == kind_e and f.keys() == e.keys()
        count = "train/train_current_rollout_logprob_mismatch_count"      # counts those roundings: not compared
        assert {k: v for k, v in f.items() if k != count} == pytest.approx({k: v for k, v in e.items() if k != count},
                                                                           rel=1e-3, abs=1e-6)
    assert any(line.startswith("gpu production: fused") and "on the CPU the eager formula runs" in line for line in fused)
    assert any("actual=torch.matmul_bf16.fp32_log_softmax" in line for line in fused)
    assert not any("[RL-Kernel][sdpa]" in line for line in fused)


class _Math:
    def backend(self, q, k, v, causal):
        return "MATH"


def _interpreted(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("on a CUDA machine the kernels run compiled: the CUDA test below covers them")
    # on the CPU this module sets TRITON_INTERPRET before triton's import; without it nothing is tested
    assert os.environ.get("TRITON_INTERPRET") == "1", "TRITON_INTERPRET=1 must be set before triton is imported"
    monkeypatch.setenv("RLK_TRITON_ON_CPU", "1")


def _tiny_policy():
    from rlk_kernels.grpo import policy
    cfg = GrpoConfig.from_arm(tiny("gpu-native", "fused"), device="cpu").model
    weights = policy.init_policy_weights(cfg, 1, "cpu")                      # fp32 on the CPU
    return cfg, weights, policy.rope_for(cfg, torch.float32, "cpu")


def test_fused_layers_and_logp_equal_the_eager_formula_interpreted(monkeypatch):
    _interpreted(monkeypatch)
    from rlk_kernels.grpo import fused, policy
    cfg, w, rope = _tiny_policy()
    tokens = torch.randint(0, cfg.vocab, (3, 12), generator=torch.Generator().manual_seed(0))
    fw = fused.FusedWeights(w, cfg)
    h = w["embed"][tokens[:, :-1]]
    normed, out = fused.fused_layers(fw, cfg, rope, h, start=0, caches=None, choice=_Math())
    torch.testing.assert_close(out, policy.layers_forward(w, cfg, rope, h, policy.ALL_P), atol=1e-4, rtol=1e-4)
    for temperature in (1.0, 0.7):
        eager = policy.sequence_logprobs(w, cfg, rope, tokens, policy.ALL_P, prompt_len=5, chunk=2,
                                         temperature=temperature)
        got = policy.sequence_logprobs(w, cfg, rope, tokens, policy.ALL_P, prompt_len=5, chunk=2,
                                       temperature=temperature, production="fused", choice=_Math())
        torch.testing.assert_close(got, eager, atol=1e-4, rtol=1e-4)
    # prefill + decode steps over the fused KV cache: the full-sequence pass's rows
    caches = fused.new_caches(cfg, 3, 11, torch.float32, "cpu", cfg.layers)
    rows = [fused.fused_layers(fw, cfg, rope, h[:, :5], start=0, caches=caches, choice=_Math())[1][:, -1]]
    for p in range(5, 11):
        rows.append(fused.fused_layers(fw, cfg, rope, h[:, p:p + 1], start=p, caches=caches, choice=_Math())[1][:, -1])
    torch.testing.assert_close(torch.stack(rows, 1), out[:, 4:], atol=1e-5, rtol=1e-5)


def test_fused_rollout_samples_what_the_eager_rollout_samples_interpreted(monkeypatch):
    _interpreted(monkeypatch)
    from rlk_kernels.grpo import policy
    from rlk_kernels.grpo.task import prompt_set
    cfg, w, _ = _tiny_policy()
    prompts = prompt_set()[:3]
    out, lines = {}, []
    for production in ("eager", "fused"):
        engine = policy.RolloutEngine(cfg, impls=policy.ALL_P, dtype=torch.float32, device="cpu", temperature=0.7,
                                      production=production, log=lines.append)
        engine.load_weights(w)
        out[production] = engine.generate(prompts, response_len=4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(out["fused"][0], out["eager"][0])
    torch.testing.assert_close(out["fused"][1], out["eager"][1], atol=1e-4, rtol=1e-4)
    # one SDPA choice per shape (prefill, then each decode length), logged
    assert [line.split(" chosen=")[0] for line in lines] == [
        "[RL-Kernel][sdpa] batch=3 tokens=5 kv=5 causal=true"] + [
        f"[RL-Kernel][sdpa] batch=3 tokens=1 kv={k} causal=false" for k in (6, 7, 8)]


# --- CUDA only -------------------------------------------------------------------------------------

def _check_module():
    spec = importlib.util.spec_from_file_location("gpu_production_check", REPO / "benchmarks" / "gpu_production_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_kernels_and_rollout_agree_with_the_eager_formula_on_cuda():
    """rms_norm, fused_add_rms_norm, silu_and_mul, qk_norm_rope, logp_from_logits and the SDPA choice at
    Qwen3-8B shapes (bf16), then the recompute and a RolloutEngine generate with 2 layers, fused vs eager."""
    from rlk_kernels.model import ModelConfig
    check = _check_module()
    cfg = ModelConfig.from_arm_model(read_json_file(REPO / "manifests" / "gpu-native.json")["model"])
    with torch.no_grad():
        check.kernel_checks(cfg)
        check.policy_checks(type(cfg)(**{**cfg.to_json(), "layers": 2}))
    failed = [(name, detail) for name, ok, detail in check.RESULTS if not ok]
    assert check.RESULTS and not failed, failed
