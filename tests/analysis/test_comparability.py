"""Comparability of analysed runs: sealed run dirs whose manifests (arms from the catalog) go through
the real `kit verify` checks and the real `kit compare`."""

from __future__ import annotations

import csv
import json
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures_vime_logs import published_rounds, synthetic_rows, write_log
from kit.evidence import bundle as E
from kit.cli import cli

from conftest import run_manifest, seal_test_run


def make_run(root: Path, arm_name: str, run_id: str, rows, gbs: int = 8, *, seal: bool = True,
             validation_passed: bool = True, phase: str = "convergence", **workload) -> Path:
    """A run dir as kit run leaves it: manifest, run.log, then the seal (unless ``seal`` is False)."""
    d = root / phase / run_id
    d.mkdir(parents=True)
    E.write_document(d, "manifest.json", run_manifest(arm_name, run_id, **workload))
    log = write_log(d / "run.log.tmp", rows, gbs=gbs, with_tqdm=False)
    E.write_new_text(d, "run.log", log.read_text())
    log.unlink()
    if seal:
        seal_test_run(d, run_id, validation_passed=validation_passed)
    return d


def tamper(run_dir: Path, to: Path | None = None) -> Path:
    """Edit one value of run.log after sealing (in a copy when ``to`` is given)."""
    if to is not None:
        shutil.copytree(run_dir, to)
        run_dir = to
    log = run_dir / "run.log"
    log.chmod(log.stat().st_mode | stat.S_IWUSR)
    text = log.read_text()
    log.write_text(text.replace("'perf/step_time': ", "'perf/step_time': 1", 1))
    return run_dir


def test_declared_factor_only_is_a_controlled_comparison(tmp_path):
    a = make_run(tmp_path, "native", "native-1", synthetic_rows(12, seed=1), gbs=8)
    b = make_run(tmp_path, "consistency", "consistency-1", synthetic_rows(12, seed=2, slowdown=1.2, mismatch=False), gbs=8)
    result = CliRunner().invoke(cli, ["analyze", "perf", str(a), str(b), "--out", str(tmp_path / "o"), "--json",
                                      "--no-figures", "--draws", "500"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["comparison"]["controlled"] is True
    assert doc["speedups"][0]["label"] == "controlled comparison"
    assert [a["name"] for a in doc["arms"]] == ["native", "consistency"]
    assert {a["global_batch_size_origin"] for a in doc["arms"]} == {"manifest workload.global_batch_size"}
    with open(tmp_path / "o" / "step-metrics.csv") as fh:
        labels = {(r["arm"], r["comparison"]) for r in csv.DictReader(fh)}
    assert labels == {("native", "reference"), ("consistency", "controlled comparison")}
    assert [a["verification"] for a in doc["arms"]] == [{"status": "verified", "problems": []}] * 2
    # the length-controlled gap is an arm difference like the others, and says so
    for fit in doc["regressions"]:
        arm_coefficient = next(c for c in fit["coefficients"] if c["name"] == "arm[consistency]")
        assert (arm_coefficient["label"], arm_coefficient["controlled"]) == ("controlled comparison", True)
        assert all("label" not in c for c in fit["coefficients"] if not c["name"].startswith("arm["))


def _unsealed(root):
    return make_run(root, "consistency", "consistency-2", synthetic_rows(12, seed=2, mismatch=False), seal=False)


def _gates_failed(root):
    return make_run(root, "consistency", "consistency-2", synthetic_rows(12, seed=2, mismatch=False),
                    validation_passed=False)


def _tampered(root):
    intact = make_run(root / "intact", "consistency", "consistency-2", synthetic_rows(12, seed=2, mismatch=False))
    return tamper(intact, root / "copy" / "consistency-2")


@pytest.mark.parametrize("make_other,problem", [
    (_tampered, "/run.log: changed"),
    (_unsealed, "/seal.json: missing: the run was not sealed"),
    (_gates_failed, "/seal.json/validation_passed: false"),
])
def test_a_run_dir_that_fails_kit_verify_is_never_a_controlled_comparison(tmp_path, make_other, problem):
    a = make_run(tmp_path, "native", "native-1", synthetic_rows(12, seed=1))
    b = make_other(tmp_path)
    verify = CliRunner().invoke(cli, ["verify", str(b)])
    assert verify.exit_code == 1, verify.output
    out = tmp_path / "perf"
    result = CliRunner().invoke(cli, ["analyze", "perf", str(a), str(b), "--out", str(out), "--draws", "500",
                                      "--no-figures"])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("NOT a controlled comparison") and problem in first and str(b) in first
    doc = json.loads((out / "summary.json").read_text())
    pair = doc["comparison"]["pairs"][0]
    assert pair["controlled"] is False and pair["uncontrolled_paths"] == []  # kit compare alone would say controlled
    assert any(problem in r for r in pair["reasons"])
    assert doc["arms"][0]["verification"]["status"] == "verified"
    assert doc["arms"][1]["verification"]["status"] == "failed"
    assert any(p.startswith(problem) for p in doc["arms"][1]["verification"]["problems"])
    assert doc["speedups"][0]["label"] == "descriptive, not causal"
    with open(out / "summary.csv") as fh:
        assert {r["comparison"] for r in csv.DictReader(fh) if r["arm"] == "consistency"} == {"descriptive, not causal"}


def test_a_manifest_that_fails_its_schema_is_not_evidence(tmp_path):
    a = make_run(tmp_path, "native", "native-1", synthetic_rows(8, seed=1))
    b = tmp_path / "hand" / "consistency-2"
    b.mkdir(parents=True)
    write_log(b / "run.log", synthetic_rows(8, seed=2), with_tqdm=False)
    manifest = run_manifest("consistency", "consistency-2")
    del manifest["host"]
    (b / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(cli, ["analyze", "perf", str(a), str(b), "--out", str(tmp_path / "o"), "--json",
                                      "--no-figures", "--draws", "500"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["comparison"]["controlled"] is False
    assert "/manifest.json: 'host' is a required property" in doc["arms"][1]["verification"]["problems"]


def test_g10_g11_run_dirs_are_descriptive_and_name_the_uncontrolled_pins(tmp_path):
    rounds = published_rounds()
    g10 = make_run(tmp_path, "G10", "g10-convergence-s1234", rounds["G10"], gbs=8)
    g11 = make_run(tmp_path, "G11", "g11-convergence-s1234", rounds["G11"], gbs=8)
    out = tmp_path / "perf"
    result = CliRunner().invoke(cli, ["analyze", "perf", str(g10), str(g11), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("NOT a controlled comparison")
    assert "stack.sources.rl-kernel.commit" in result.output and "stack.sources.vime.commit" in result.output
    doc = json.loads((out / "summary.json").read_text())
    pair = doc["comparison"]["pairs"][0]
    assert not pair["controlled"]
    assert {"stack.sources.rl-kernel.commit", "stack.sources.vime.commit", "stack.packages.transformer-engine",
            "attention_backend"} <= set(pair["uncontrolled_paths"])
    coefficient = next(c for c in doc["regressions"][0]["coefficients"] if c["name"] == "arm[G11]")
    assert (coefficient["label"], coefficient["controlled"]) == ("descriptive, not causal", False)
    with open(out / "summary.csv") as fh:
        assert {r["comparison"] for r in csv.DictReader(fh) if r["arm"] == "G11"} == {"descriptive, not causal"}

    conv = CliRunner().invoke(cli, ["analyze", "convergence", str(g10), str(g11), "--out", str(tmp_path / "conv"),
                                    "--no-figures"])
    assert conv.exit_code == 0, conv.output
    with open(tmp_path / "conv" / "runs.csv") as fh:
        runs = {r["group"]: r for r in csv.DictReader(fh)}
    # revisions and seeds come from the manifest, as in the published runs.csv
    assert runs["G10"]["rl_kernel_revision"] == "d2173e8d948e8cf062ac36be32bdf53bac75daa0"
    assert runs["G11"]["vime_revision"] == "a013293fb6dfdc5cd27152b54f64209ea2691d26"
    assert (runs["G10"]["phase"], runs["G10"]["seed"], runs["G10"]["num_rollout"]) == ("convergence", "1234", "200")
    with open(tmp_path / "conv" / "rounds.csv") as fh:
        first = next(csv.DictReader(fh))
    assert (first["operator_case"], first["framework_consistency"]) == ("P/P", "True")


# --- runs pooled under one name (kit analyze convergence) ------------------------------------------------

def test_pooling_runs_of_different_arms_under_one_name_is_refused(tmp_path):
    pp = make_run(tmp_path, "native", "native-1", synthetic_rows(6, seed=1))
    rr = make_run(tmp_path, "consistency", "consistency-1", synthetic_rows(6, seed=2, mismatch=False))
    other = make_run(tmp_path, "G10", "g10-1", synthetic_rows(6, seed=3))
    out = tmp_path / "conv"
    result = CliRunner().invoke(cli, ["analyze", "convergence", str(pp), str(rr), str(other), "--name", "pooled",
                                      "--name", "pooled", "--name", "g10", "--out", str(out), "--no-figures"])
    assert result.exit_code == 2, result.output
    assert str(pp) in result.output and str(rr) in result.output
    assert "operators.logp ('P/P' vs 'R/R')" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_seeds_of_one_arm_pool_and_a_pooled_run_that_fails_verify_is_named(tmp_path):
    seed1 = make_run(tmp_path, "native", "native-s1", synthetic_rows(6, seed=1), seed=1, rollout_seed=1)
    seed2 = make_run(tmp_path, "native", "native-s2", synthetic_rows(6, seed=2), seed=2, rollout_seed=2)
    strict = make_run(tmp_path, "consistency", "consistency-s1", synthetic_rows(6, seed=3, mismatch=False), seed=1,
                      rollout_seed=1)
    runner = CliRunner()
    intact = runner.invoke(cli, ["analyze", "convergence", str(seed1), str(seed2), str(strict),
                                 "--out", str(tmp_path / "a"), "--no-figures", "--json"])
    assert intact.exit_code == 0, intact.output
    doc = json.loads(intact.output)
    assert doc["comparison"]["controlled"] is True
    assert {s["group"]: s["run_count"] for s in doc["summaries"]} == {"native": 2, "consistency": 1}

    tamper(seed2)  # the second run of the reference group: the verdict must cover it too
    result = runner.invoke(cli, ["analyze", "convergence", str(seed1), str(seed2), str(strict),
                                 "--out", str(tmp_path / "b"), "--no-figures", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["comparison"]["controlled"] is False and doc["comparison"]["label"] == "descriptive, not causal"
    (reason,) = doc["comparison"]["pairs"][0]["reasons"]
    assert f"native (pooled run {seed2})" in reason and "/run.log: changed" in reason


def test_the_headline_names_the_first_reasons_and_counts_the_rest():
    """It goes into every figure's subtitle; the full list stays in pairs[].reasons."""
    from kit.analysis.comparability import Comparability, PairVerdict

    reasons = tuple(f"runs/r{i}: /run.log: changed" for i in range(5))
    verdict = Comparability((PairVerdict("a", "b", False, reasons, ()),))
    line = verdict.headline()
    assert all(r in line for r in reasons[:3]) and reasons[3] not in line and line.endswith("; and 2 more)")
    assert verdict.to_json()["pairs"][0]["reasons"] == list(reasons)
