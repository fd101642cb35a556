"""Stacks, arms and the module matrix: kit verify over the shipped locks and over broken ones."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.model.catalog import Catalog
from kit.cli import cli

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"


def run(*args, env=None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


@pytest.fixture()
def lock_dir(tmp_path):
    """A writable copy of manifests/ to break things in."""
    dest = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, dest)
    return dest


def edit(path: Path, fn):
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc, indent=2))


def test_every_shipped_lock_verifies():
    files = sorted(str(p) for p in MANIFESTS.glob("*.json"))
    assert len(files) >= 10
    result = run("verify", *files)
    assert result.exit_code == 0, result.output
    assert "FAIL" not in result.output
    assert result.output.count("OK  ") == len(files)


def test_verify_json_document_validates_and_reports_unpinned_bases():
    result = run("verify", "--json", str(MANIFESTS / "stack-vime-g10.json"), str(MANIFESTS / "G10.json"))
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert doc["schema"] == "rlk-kit/verification/v2" and doc["passed"] is True
    notes = " ".join(doc["results"][0]["notes"])
    assert "unpinned input" in notes and "rocm" in notes


def test_g10_g11_pins_are_the_published_ones():
    cat = Catalog.load(MANIFESTS)
    g10, g11 = cat.arm("G10"), cat.arm("G11")
    assert g10.stack.source("rl-kernel")["commit"] == "d2173e8d948e8cf062ac36be32bdf53bac75daa0"
    assert g11.stack.source("rl-kernel")["commit"] == "5403df6e3c5244343438916248ccfcc597dd96f6"
    assert g10.stack.source("vime")["commit"] == "1a113710e80aa7cfc271caa9bd90bcf348a7af08"
    assert g11.stack.source("vime")["commit"] == "a013293fb6dfdc5cd27152b54f64209ea2691d26"
    for arm in (g10, g11):
        assert arm.stack.source("megatron-lm")["commit"] == "1dcf0dafa884ad52ffb243625717a3471643e087"
        assert arm.stack.python == "3.11.15"
        assert {k: arm.stack.packages[k] for k in ("torch", "vllm", "ray")} == {"torch": "2.9.1", "vllm": "0.16.0", "ray": "2.57.0"}
        assert arm.document["graph"] == {"mode": "FULL_DECODE_ONLY", "capture_sizes": list(range(1, 9))}
        assert arm.document["use_rollout_logprobs"] is True
        wl = arm.workload
        assert (wl["rollout_batch_size"], wl["samples_per_prompt"], wl["max_response_len"], wl["seed"], wl["rollouts"]) == (1, 8, 7168, 1234, 200)
    assert (g10.stack.packages["transformer-engine"], g11.stack.packages["transformer-engine"]) == ("2.18.0", "2.11.0")
    assert (g10.document["attention_backend"], g11.document["attention_backend"]) == ("fused", "auto")
    assert set(g10.operators.values()) == {"P/P"} and set(g11.operators.values()) == {"R/R"}


def test_no_pin_is_written_twice():
    """Every commit and package version appears in exactly one stack file."""
    seen: dict[str, str] = {}
    for path in MANIFESTS.glob("stack-*.json"):
        doc = json.loads(path.read_text())
        pins = [(f"source {s['name']}", s["commit"]) for s in doc.get("sources", [])]
        pins += [(f"package {k}", v) for k, v in doc.get("packages", {}).items()]
        for what, value in pins:
            key = f"{what}={value}"
            assert key not in seen, f"{key} written in {path.name} and {seen[key]}"
            seen[key] = path.name
    for path in MANIFESTS.glob("*.json"):
        if not path.name.startswith("stack-"):
            text = path.read_text()
            assert "1dcf0dafa884ad52ffb243625717a3471643e087" not in text


def test_module_matrix_is_generated_from_one_definition():
    cat = Catalog.load(MANIFESTS)
    names = [n for n in cat.arm_names() if n.startswith("M")]
    assert names == sorted(["M000", "M100", "M010", "M001", "M110", "M101", "M011", "M111"])
    assert not any(p.name.startswith("M") for p in MANIFESTS.glob("*.json"))
    m101 = cat.arm("M101")
    assert m101.operators == {"attention": "R/R", "ffn": "P/P", "logp": "R/R"}
    assert m101.stack.sha256 == cat.arm("consistency").stack.sha256
    assert m101.document["use_rollout_logprobs"] is False
    assert cat.arm("smoke-M010").engine == "smoke"


@pytest.mark.parametrize("mutate, pointer, words", [
    (lambda d: d["sources"][0].update(commit="d2173e8"), "/sources/0/commit", "40-hex"),
    (lambda d: d["sources"][0].update(commit="main"), "/sources/0/commit", "40-hex"),
    (lambda d: d.setdefault("packages", {}).update({"transformer-engine": ">=2.18"}), "/packages/transformer-engine", "exact version"),
    (lambda d: d.setdefault("packages", {}).update({"transformer-engine": "2.18.*"}), "/packages/transformer-engine", "exact version"),
    (lambda d: d["sources"][0].update(repository="https://user:ghp_x@github.com/RL-Align/RL-Kernel.git"),
     "/sources/0/repository", "without user or token"),
    (lambda d: d["sources"][0].update(patches=[{"path": "../../etc/passwd", "sha256": "0" * 64}]),
     "/sources/0/patches/0/path", "without '..'"),
    (lambda d: d.update(colour="blue"), "/", "unknown field"),
])
def test_bad_stack_pins_fail_with_pointer(lock_dir, mutate, pointer, words):
    path = lock_dir / "stack-vime-g11.json"
    edit(path, mutate)
    result = run("verify", str(path))
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output and pointer in result.output and words in result.output


@pytest.mark.parametrize("version", ["2.18", "2024.1", "9.10.2.21", "2.9.1+rocm6.3", "1.0rc1"])
def test_exact_pep440_versions_of_any_length_are_accepted(lock_dir, version):
    # '==2.18' matches 2.18 (= 2.18.0) only, so two components are as exact as three
    path = lock_dir / "stack-vime-g11.json"
    edit(path, lambda d: d.setdefault("packages", {}).update({"transformer-engine": version}))
    result = run("verify", str(path))
    assert result.exit_code == 0, result.output


def test_tag_where_digest_required_fails(lock_dir):
    path = lock_dir / "stack-vime-base.json"
    edit(path, lambda d: d["platforms"]["cuda"].update(base_image="nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04"))
    result = run("verify", str(path))
    assert result.exit_code == 1
    assert "/platforms/cuda/base_image" in result.output and "unresolved" in result.output


@pytest.mark.parametrize("mutate, pointer", [
    (lambda d: d["workload"].update(global_batch_size=16), "/workload/global_batch_size"),
    (lambda d: d["workload"]["kl"].update(coef=0.001), "/workload/kl"),
    (lambda d: d["topology"].update(tp=3), "/topology"),
    (lambda d: d["topology"].update(rollout_cp=2), "/topology/rollout_cp"),
    (lambda d: d["graph"].update(capture_sizes=[1, 2, 3]), "/graph/capture_sizes"),
    (lambda d: d.update(evidence_level="experimental"), "/evidence_level"),
    (lambda d: d["stack"].update(sha256="0" * 64), "/stack/sha256"),
    (lambda d: d["comparison"].update({"with": "G99"}), "/comparison/with"),
    (lambda d: d["operators"].update(ffn="X/Y"), "/operators/ffn"),
    (lambda d: d["workload"].update(seed="1234"), "/workload/seed"),
    (lambda d: d["workload"]["algorithm"].update(reward_model="copy"), "/workload/algorithm/reward_model"),
    (lambda d: d["workload"]["algorithm"].update(advantage_estimator="ppo"), "/workload/algorithm/advantage_estimator"),
])
def test_bad_arm_rules_fail_with_pointer(lock_dir, mutate, pointer):
    path = lock_dir / "G10.json"
    edit(path, mutate)
    result = run("verify", str(path))
    assert result.exit_code == 1, result.output
    assert pointer in result.output


def test_unreadable_inputs_exit_2(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"schema": "rlk-kit/arm/v1",')
    non_utf8 = tmp_path / "latin.json"
    non_utf8.write_bytes(b'{"name": "caf\xe9"}')
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(16 * 1024 * 1024 + 1)
    loop = tmp_path / "loop.json"
    os.symlink(loop, loop)
    for path, words in [(bad_json, "malformed JSON"), (non_utf8, "not UTF-8"), (big, "16 MiB"),
                        (loop, "link loop"), (tmp_path / "missing.json", "no such file")]:
        result = run("verify", str(path))
        assert result.exit_code == 2, (path, result.output)
        assert words in result.output, result.output


def test_readable_but_invalid_beats_nothing_and_unreadable_wins(tmp_path, lock_dir):
    path = lock_dir / "G10.json"
    edit(path, lambda d: d["workload"].update(rollouts=0))
    result = run("verify", str(path), str(tmp_path / "missing.json"))
    assert result.exit_code == 2
    assert "FAIL" in result.output and "/workload/rollouts" in result.output


def test_platform_packages_override_the_stacks_own():
    from kit.build.probe import identity_differences
    from kit.model.lock import requirements_of

    stack = Catalog.load(MANIFESTS).stack("vime-g10")
    assert stack.packages_for("cuda")["torch"] == "2.9.1"
    assert stack.packages_for("rocm")["torch"] == "2.9.1+rocm6.3"
    assert "torch==2.9.1+rocm6.3" in requirements_of(stack.document, "rocm")
    assert "torch==2.9.1" in requirements_of(stack.document, "cuda")
    observed = {"python": {"version": "3.11.15"}, "sources": [],
                "packages": {"torch": "2.9.1+rocm6.3", "vllm": "0.16.0", "ray": "2.57.0", "transformer-engine": "2.18.0"}}
    rocm = [d[0] for d in identity_differences(observed | {"torch": {"hip": "6.3"}}, stack.document)]
    cuda = [d[0] for d in identity_differences(observed | {"torch": {"cuda": "12.8"}}, stack.document)]
    assert "packages.torch" not in rocm and "packages.torch" in cuda


def test_two_lock_files_with_one_name_fail_verify_and_are_refused_by_name(lock_dir):
    twin = lock_dir / "smoke-copy.json"
    twin.write_text((lock_dir / "smoke.json").read_text())
    result = run("verify", str(lock_dir / "smoke.json"), str(twin))
    assert result.exit_code == 1 and "/name" in result.output and "also used by" in result.output, result.output
    from kit.model.catalog import Catalog
    from kit.model.errors import BadInput

    with pytest.raises(BadInput, match="defined by 2 files"):
        Catalog.load(lock_dir).arm("smoke", flag="--arm")


def test_an_arm_file_named_like_a_generated_arm_fails_the_matrix(lock_dir):
    doc = json.loads((lock_dir / "consistency.json").read_text())
    doc["name"] = "M000"
    doc.pop("comparison", None)
    (lock_dir / "M000.json").write_text(json.dumps(doc))
    result = run("verify", str(lock_dir / "module-matrix.json"))
    assert result.exit_code == 1 and "generated arm M000 collides with a written arm" in result.output, result.output


def test_an_arm_without_algorithm_means_grpo_with_its_engines_reward(lock_dir):
    """Arms written before workload.algorithm existed still verify and plan: GRPO, the engine's reward."""
    from kit.model.arm import algorithm_of
    from kit.engines.vime.command import train_command

    path = lock_dir / "G10.json"
    edit(path, lambda d: d["workload"].pop("algorithm"))
    assert run("verify", str(path)).exit_code == 0
    doc = json.loads(path.read_text())
    assert algorithm_of(doc) == {"advantage_estimator": "grpo", "reward_model": "deepscaler"}
    layout = {"tp": 4, "cp": 2, "rollout_tp": 4, "rollout_cp": 1, "actor_gpus": 8, "rollout_gpus": 8,
              "offload_train": False, "vllm_gpu_memory_utilization": 0.4}
    argv = train_command(doc, layout, "/workspace/runs/r", capture_sizes=[1, 2]).argv
    assert argv[argv.index("--rm-type") + 1] == "deepscaler" and argv[argv.index("--advantage-estimator") + 1] == "grpo"


def test_a_schema_problem_under_a_key_with_control_characters_stays_on_one_line():
    from kit.model.documents import json_pointer, schema_problems

    assert json_pointer(["inputs", "a\rb", "c/d", "e~", 0]) == "/inputs/a\\rb/c~1d/e~0/0"
    doc = {"schema": "rlk-kit/run-manifest/v2", "inputs": {"\r\n\x1b": False}}
    pointers = [p for p, _ in schema_problems(doc, "run-manifest")]
    assert pointers and all(p.isprintable() for p in pointers)
    assert "/inputs/\\r\\n\\x1b" in pointers
