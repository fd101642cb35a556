"""The VIME command follows the launcher revision of the arm's stack (reference §2.1–§2.4).

G10/G11 pin the commits of the published runs, whose launcher (the oldest run_arm.py) lacked every flag and env
var the reference marks †; a command with them would fail at start-up on that code. native, consistency and the
module matrix keep the current launcher.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.model.catalog import Catalog
from kit.cli import cli
from kit.model.documents import schema_problems
from kit.model.errors import BadInput
from kit.run.plan import TopologyOverrides, resolve_plan
from kit.model.stack import Stack
from kit.engines.vime import command as vime

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"

# reference §2.4: train.py flags marked † (absent in the historical launcher)
DAGGER_FLAGS = ["--rollout-top-k", "--optimizer", "--lr", "--lr-decay-style", "--weight-decay", "--adam-beta1",
                "--adam-beta2", "--entropy-coef", "--make-vocab-size-divisible-by", "--vllm-logprobs-mode",
                "--custom-update-weight-post-write-path"]
# reference §2.3: env vars marked †, plus the sidecar dir "absent in the oldest version"
DAGGER_ENV = ["RL_KERNEL_COMPLETE_SAMPLING_SUPPORT", "RL_KERNEL_STRICT_CANONICAL_TP",
              "RL_KERNEL_STRICT_CANONICAL_VOCAB_SIZE", "RL_KERNEL_WEIGHT_AUDIT_DIR", "RL_KERNEL_CANONICAL_CP_GRAD"]
OLDEST_ABSENT_ENV = ["RL_KERNEL_MISMATCH_SIDECAR_DIR"]
# the current launcher's module paths (§1.1, §2.4); the historical ones are below
CURRENT_MODULES = [vime.LOGP_PROVIDER, vime.MEGATRON_INIT, vime.TIS_HOOK]
HISTORICAL_PROVIDER = "rl_engine.integrations.vime.linear_logp_provider.provider"
HISTORICAL_INIT = "rl_engine.integrations.megatron_runtime.initialize_from_environment"
HISTORICAL_TIS = "vime_rocm_attention_ablation.tis_metrics.metrics_only_tis"


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def plan(*args) -> dict:
    result = run("plan", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def pairs(argv):
    return set(zip(argv, argv[1:]))


def value_of(argv, flag):
    assert argv.count(flag) == 1, flag
    return argv[argv.index(flag) + 1]


@pytest.fixture(scope="module")
def catalog():
    return Catalog.default()


def test_the_g10_and_g11_stacks_name_the_historical_launcher(catalog):
    for stack_file in ("stack-vime-g10.json", "stack-vime-g11.json"):
        assert json.loads((MANIFESTS / stack_file).read_text())["launcher"] == vime.HISTORICAL, stack_file
    assert vime.launcher_for_stack(catalog.stack("vime-g10")).name == "historical"
    assert vime.launcher_for_stack(catalog.stack("vime-g11")).name == "historical"
    # vime-current extends vime-g11 (G11's RL-Kernel commit) with another VIME, and names the current launcher
    assert vime.launcher_for_stack(catalog.stack("vime-current")).name == "current"


def test_the_launcher_is_part_of_the_stack_identity(catalog):
    g10 = catalog.stack("vime-g10")
    other = Stack(g10.name, {**g10.document, "launcher": vime.CURRENT})
    assert other.sha256 != g10.sha256
    assert vime.launcher_for_stack(other).name == "current"
    bad = {**json.loads((MANIFESTS / "stack-vime-g10.json").read_text()), "launcher": "newest"}
    assert any(ptr == "/launcher" for ptr, _ in schema_problems(bad, "stack"))


@pytest.mark.parametrize("arm", ["G10", "G11"])
def test_historical_plan_has_no_dagger_flag_or_env_var(arm):
    doc = plan("--arm", arm)
    argv, env = doc["command"]["argv"], doc["ray_job"]["runtime_env"]["env_vars"]
    for flag in DAGGER_FLAGS:
        assert flag not in argv, flag
    for name in DAGGER_ENV + OLDEST_ABSENT_ENV:
        assert name not in env, name
    text = json.dumps([argv, env])
    for module in CURRENT_MODULES:
        assert module not in text, module


@pytest.mark.parametrize("arm", ["G10", "G11"])
def test_historical_plan_has_the_historical_values(arm):
    doc = plan("--arm", arm)
    argv, env = doc["command"]["argv"], doc["ray_job"]["runtime_env"]["env_vars"]
    # §2.3: padded vocab 152064, temperature "1.0", capture 1..rollout_batch_size×samples (1×8)
    assert env["RL_KERNEL_VLLM_PADDED_VOCAB_SIZE"] == "152064"
    assert env["RL_KERNEL_VLLM_TEMPERATURE"] == "1.0"
    assert env["RL_KERNEL_VLLM_CUDAGRAPH_MAX_CAPTURE_SIZE"] == "8"
    assert doc["capture_sizes"] == list(range(1, 9))
    assert argv[-1] == ('{"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[1,2,3,4,5,6,7,8],'
                        '"max_cudagraph_capture_size":8}')
    # §2.3: the historical TIS hook lives under <rlk>/examples
    assert env["PYTHONPATH"].split(":")[0] == "/opt/rlk/src/rl-kernel/examples"
    # §2.4: constant sampling, always --no-offload-train, historical init and hook paths; §1.5 default 0.4
    assert {("--rollout-temperature", "1.0"), ("--rollout-top-p", "1.0"),
            ("--custom-megatron-init-path", HISTORICAL_INIT), ("--custom-tis-function-path", HISTORICAL_TIS),
            ("--vllm-gpu-memory-utilization", "0.4"), ("--tensor-model-parallel-size", "4"),
            ("--context-parallel-size", "2")} <= pairs(argv)
    assert "--no-offload-train" in argv and "--offload-train" not in argv
    assert "--use-rollout-logprobs" in argv
    # the plan records the revision: under `command` and in the job metadata the run manifest keeps
    launcher = doc["command"]["launcher"]
    assert launcher["revision"] == "historical" and launcher["stack"] == doc["stack"]["name"]
    assert launcher["pins"] == {s["name"]: s["commit"] for s in Catalog.default().stack(launcher["stack"]).sources
                                if s["name"] in ("rl-kernel", "vime")}
    assert doc["ray_job"]["metadata"]["launcher_revision"] == "historical"
    assert schema_problems(doc, "plan") == []


def test_g10_and_g11_differ_only_as_their_arms_do():
    g10, g11 = plan("--arm", "G10"), plan("--arm", "G11")
    assert value_of(g10["command"]["argv"], "--attention-backend") == "fused"
    assert value_of(g11["command"]["argv"], "--attention-backend") == "auto"
    argv = g11["command"]["argv"]
    # §1.1: the historical provider path for a strict training-side logp; all R/R keeps the --ci-test flags
    assert ("--linear-logp-provider", HISTORICAL_PROVIDER) in pairs(argv)
    assert "--ci-test" in argv
    assert "--linear-logp-provider" not in g10["command"]["argv"]
    assert g11["ray_job"]["runtime_env"]["env_vars"]["RL_KERNEL_LOGP_CASE"] == "R/R"


def test_native_keeps_the_current_launcher():
    doc = plan("--arm", "native")
    argv, env = doc["command"]["argv"], doc["ray_job"]["runtime_env"]["env_vars"]
    for flag in ("--rollout-top-k", "--optimizer", "--make-vocab-size-divisible-by", "--vllm-logprobs-mode"):
        assert flag in argv, flag
    assert {("--custom-megatron-init-path", vime.MEGATRON_INIT), ("--custom-tis-function-path", vime.TIS_HOOK),
            ("--make-vocab-size-divisible-by", "256")} <= pairs(argv)
    for name in DAGGER_ENV + OLDEST_ABSENT_ENV:
        assert name in env, name
    assert env["RL_KERNEL_VLLM_PADDED_VOCAB_SIZE"] == "152576"
    assert env["PYTHONPATH"].split(":")[0] == "/opt/rlk/src/rl-kernel"
    assert doc["capture_sizes"] == [1, 2, 3, 4]
    assert doc["command"]["launcher"]["revision"] == "current"
    assert doc["ray_job"]["metadata"]["launcher_revision"] == "current"
    assert ("--linear-logp-provider", vime.LOGP_PROVIDER) in pairs(plan("--arm", "consistency")["command"]["argv"])


def test_smoke_plan_has_no_launcher():
    doc = plan("--arm", "smoke")
    assert "launcher" not in doc["command"] and "launcher_revision" not in doc["ray_job"]["metadata"]


def test_historical_launcher_fixes_training_tp_cp():
    result = run("plan", "--arm", "G10", "--tp-size", "2")
    assert result.exit_code == 2
    assert "--tp-size 2" in result.output and "TP4/CP2" in result.output and "Traceback" not in result.output
    # the rollout TP stays free; the historical capture sizes do not follow the engines
    doc = plan("--arm", "G11", "--rollout-tp-size", "2")
    assert doc["topology"]["rollout_engines"] == 4 and doc["capture_sizes"] == list(range(1, 9))


@pytest.mark.parametrize("path, value, words", [
    (("workload", "temperature"), 0.7, "constant 1.0"),
    (("workload", "top_p"), 0.95, "constant 1.0"),
    (("workload", "top_k"), 50, "--rollout-top-k"),
    (("workload", "optimizer"), {"name": "adam", "lr": 5e-7, "weight_decay": 0.1, "adam_beta1": 0.9, "adam_beta2": 0.98},
     "no optimizer flags"),
    (("graph", "capture_sizes"), [1, 2, 3, 4], "captures 1..8"),
    (("model", "padded_vocab"), 152576, "RL_KERNEL_VLLM_PADDED_VOCAB_SIZE=152064"),
])
def test_historical_launcher_refuses_what_it_cannot_pass(catalog, path, value, words):
    arm = catalog.arm("G10")
    doc = copy.deepcopy(arm.document)
    doc[path[0]][path[1]] = value
    with pytest.raises(BadInput, match=words.replace(".", r"\.")):
        resolve_plan(type(arm)(arm.name, doc, arm.stack, arm.source_file), TopologyOverrides(), run_id="r1")


def test_same_arm_on_the_current_stack_gets_the_current_command(catalog):
    arm = catalog.arm("G10")
    doc = copy.deepcopy(arm.document)
    current = catalog.stack("vime-current")
    doc["stack"] = {"name": current.name, "sha256": current.sha256}
    argv = resolve_plan(type(arm)(arm.name, doc, current, arm.source_file), run_id="r1")["command"]["argv"]
    assert "--rollout-top-k" in argv and "--vllm-logprobs-mode" in argv
    assert ("--custom-megatron-init-path", vime.MEGATRON_INIT) in pairs(argv)


def test_run_dry_run_carries_the_historical_command(tmp_path):
    env = dict(os.environ, KIT_WORKSPACE=str(tmp_path / "ws"))
    proc = subprocess.run([sys.executable, "-m", "kit", "run", "--arm", "G10", "--dry-run", "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    train = doc["manifest_preview"]["commands"]["train"]
    assert train == doc["plan"]["command"]["argv"]
    assert not set(DAGGER_FLAGS) & set(train)
    assert not set(DAGGER_ENV + OLDEST_ABSENT_ENV) & set(doc["manifest_preview"]["environment"]["job"])
    assert doc["plan"]["command"]["launcher"]["revision"] == "historical"
    assert not (tmp_path / "ws").exists()
