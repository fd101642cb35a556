"""kit compare, kit plan and the CLI's contract: exit codes, one-line errors, fast start-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.cli import COMMANDS, cli

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_help_lists_every_command_with_its_purpose():
    result = run("--help")
    assert result.exit_code == 0
    for name, (_, purpose) in COMMANDS.items():
        assert name in result.output
        assert purpose.split()[0] in result.output


def test_start_up_imports_no_heavy_module():
    code = ("import sys; from kit.cli import cli; "
            "from click.testing import CliRunner; CliRunner().invoke(cli, ['--help']); "
            "print(sorted(m for m in ('torch','ray','docker','numpy','jsonschema','matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_compare_g10_g11_names_the_uncontrolled_pins():
    result = run("compare", str(MANIFESTS / "G10.json"), str(MANIFESTS / "G11.json"))
    assert result.exit_code == 1
    lines = {line.split()[1]: line.split()[0] for line in result.output.splitlines() if line.startswith("  ")}
    assert lines["stack.sources.rl-kernel.commit"] == "uncontrolled"
    assert lines["stack.sources.vime.commit"] == "uncontrolled"
    assert lines["stack.packages.transformer-engine"] == "uncontrolled"
    assert lines["attention_backend"] == "uncontrolled"
    assert lines["operators.logp"] == "declared"


def test_compare_by_name_and_json():
    result = run("compare", "G10", "G11", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["schema"] == "rlk-kit/comparison/v4" and doc["controlled"] is False
    assert {d["path"] for d in doc["differences"] if d["status"] == "uncontrolled"} == {
        "attention_backend", "stack.packages.transformer-engine", "stack.sources.rl-kernel.commit", "stack.sources.vime.commit",
        # G10's TE 2.18 selects its CUDA 12 core explicitly (docs/locks.md)
        "stack.packages.transformer-engine-cu12", "stack.excludes.transformer-engine-cu13"}
    # the audit's finding: the published G10 software cannot be built again from source (G11's can)
    rebuild = [n for n in doc["notes"] if "not rebuildable from source" in n]
    assert len(rebuild) == 1 and rebuild[0].startswith("G10: stack vime-g10") and "te-torch-symm-mem-header" in rebuild[0]


def test_compare_native_consistency_is_controlled():
    result = run("compare", "native", "consistency")
    assert result.exit_code == 0, result.output
    assert "controlled" in result.output and "uncontrolled" not in result.output


def test_compare_without_declaration_is_uncontrolled():
    result = run("compare", "native", "G10", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["declared_factors"] == [] and "declares a comparison" in doc["notes"][0]


def test_compare_unknown_arm_is_bad_input():
    result = run("compare", "native", "G99")
    assert result.exit_code == 2
    assert "unknown arm 'G99'" in result.output and "consistency" in result.output


def plan(*args):
    result = run("plan", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def pairs(argv):
    return {(a, b) for a, b in zip(argv, argv[1:])}


def test_plan_tp2_cp4_memory_and_flags():
    doc = plan("--arm", "consistency", "--tp-size", "2", "--cp-size", "4")
    assert doc["topology"]["vllm_gpu_memory_utilization"] == 0.4
    argv = doc["command"]["argv"]
    assert {("--tensor-model-parallel-size", "2"), ("--context-parallel-size", "4"),
            ("--make-vocab-size-divisible-by", "512"), ("--vllm-gpu-memory-utilization", "0.4")} <= pairs(argv)
    assert doc["evidence_level"] == "experimental"


def test_plan_tp1_cp8_memory_and_derived_cp():
    doc = plan("--arm", "consistency", "--tp-size", "1")
    assert doc["topology"]["cp"] == 8
    assert doc["topology"]["vllm_gpu_memory_utilization"] == 0.2
    assert "--no-offload-train" in doc["command"]["argv"]
    doc = plan("--arm", "consistency", "--tp-size", "1", "--rollout-tp-size", "1")
    assert doc["topology"]["offload_train"] is True and "--offload-train" in doc["command"]["argv"]
    assert doc["topology"]["vllm_gpu_memory_utilization"] == 0.4
    assert doc["capture_sizes"] == [1]


@pytest.mark.parametrize("args, words", [
    (("--tp-size", "3"), "--tp-size 3"),
    (("--rollout-cp-size", "2"), "prefill-context-parallel"),
    (("--tp-size", "2", "--cp-size", "2"), "must equal the 8 GPUs"),
    (("--tp-size", "0"), "positive"),
])
def test_plan_refuses_bad_topologies(args, words):
    result = run("plan", "--arm", "consistency", *args)
    assert result.exit_code == 2
    assert words in result.output and "Traceback" not in result.output


def test_plan_reference_layout_and_complete_command():
    doc = plan("--arm", "consistency")
    assert doc["evidence_level"] == "reference"
    argv = doc["command"]["argv"]
    for pair in [("--actor-num-gpus-per-node", "8"), ("--rollout-num-gpus", "8"), ("--rollout-num-gpus-per-engine", "4"),
                 ("--vllm-prefill-context-parallel-size", "1"), ("--advantage-estimator", "grpo"), ("--rm-type", "deepscaler"),
                 ("--linear-logp-provider-mode", "strict"), ("--attention-backend", "fused"),
                 ("--seed", "1234"), ("--rollout-seed", "1234"), ("--vllm-attention-backend", "flash_attn")]:
        assert pair in pairs(argv), pair
    assert argv[-1] == '{"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[1,2,3,4],"max_cudagraph_capture_size":4}'
    assert "--ci-test" in argv and "--use-rollout-logprobs" not in argv
    env = doc["ray_job"]["runtime_env"]["env_vars"]
    assert env["RL_KERNEL_LOGP_CASE"] == "R/R" and env["RL_KERNEL_CANONICAL_CP_GRAD"] == "1"
    assert env["RL_KERNEL_STRICT_CANONICAL_VOCAB_SIZE"] == "152576"
    assert env["PYTHONPATH"].startswith("/opt/rlk/src/")
    assert doc["ray_job"]["submission_id"] == f"rlk-{doc['run_id']}"


def test_plan_g10_is_the_historical_launcher():
    doc = plan("--arm", "G10")
    argv = doc["command"]["argv"]
    assert doc["capture_sizes"] == list(range(1, 9))
    assert "--use-rollout-logprobs" in argv and "--optimizer" not in argv
    assert "--linear-logp-provider" not in argv and "--ci-test" not in argv
    assert ("--attention-backend", "fused") in pairs(argv)
    assert plan("--arm", "G11")["ray_job"]["runtime_env"]["env_vars"]["RL_KERNEL_VLLM_PADDED_VOCAB_SIZE"] == "152064"


@pytest.mark.parametrize("arm, provider, strict_ci", [
    ("M000", False, False), ("M100", False, False), ("M010", False, False), ("M001", True, False),
    ("M110", False, False), ("M101", True, False), ("M011", True, False), ("M111", True, True)])
def test_module_matrix_provider_flags(arm, provider, strict_ci):
    argv = plan("--arm", arm)["command"]["argv"]
    assert ("--linear-logp-provider" in argv) is provider
    assert ("--ci-test" in argv) is strict_ci


def test_mode_with_arm_sets_every_case():
    doc = plan("--arm", "consistency", "--mode", "native")
    assert set(doc["arm"]["operators"].values()) == {"P/P"}
    assert doc["arm"]["name"] == "consistency-native"
    assert doc["arm"]["comparison"] == {"with": "consistency", "factors": ["operators"]}
    assert plan("--mode", "native")["arm"]["name"] == "native"


def test_plan_needs_an_arm():
    result = run("plan")
    assert result.exit_code == 2 and "--arm" in result.output


def test_console_script_exit_codes():
    ok = subprocess.run(["kit", "compare", "native", "consistency"], capture_output=True, text=True)
    bad = subprocess.run(["kit", "plan", "--arm", "nope"], capture_output=True, text=True)
    usage = subprocess.run(["kit", "plan", "--tp-size", "x"], capture_output=True, text=True)
    assert (ok.returncode, bad.returncode, usage.returncode) == (0, 2, 2)
    assert bad.stderr.startswith("kit: unknown arm 'nope'") and "Traceback" not in bad.stderr
