"""kit analyze perf: stage formulas, subsets, bootstrap pairing, OLS, comparability labels, output rules."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures_vime_logs import synthetic_rows, write_log
from test_comparability import make_run as sealed_run
from kit.analysis.comparability import assess
from kit.analysis.perf import analyze_perf, step_rows
from kit.analysis.stats import Resampler, ols, t_quantile
from kit.analysis.table import load_arm
from kit.cli import cli
from kit.model.documents import schema_problems


def run_dir(root: Path, name: str, rows, gbs=8, max_len=256) -> Path:
    d = root / name
    d.mkdir(parents=True)
    write_log(d / "run.log", rows, gbs=gbs)
    (d / "manifest.json").write_text(json.dumps(
        {"run_id": name, "arm": {"name": name, "workload": {"global_batch_size": gbs, "max_response_len": max_len}}}))
    return d


def test_stage_formulas(tmp_path):
    log = tmp_path / "a.log"
    log.write_text(
        "rollout 0: {'rollout/response_lengths': 100.0, 'rollout/total_lengths': 150.0, 'rollout/truncated_ratio': 0.5}\n"
        "perf 0: {'perf/rollout_time': 10.0, 'perf/tokens_per_gpu_per_sec': 20.0}\n"
        "step 0: {'train/global_batch_size': 4}\n"
        "perf 0: {'perf/step_time': 30.0, 'perf/train_wait_time': 17.0, 'perf/update_weights_time': 5.0,"
        " 'perf/train_time': 12.0, 'perf/actor_train_time': 9.0, 'perf/actor_train_tok_per_s': 66.0}\n")
    (row,) = step_rows(load_arm(log))
    assert row["rollout_time_s"] == 10.0
    assert row["update_weights_time_s"] == 5.0
    assert row["wait_residual_time_s"] == 17.0 - 10.0 - 5.0
    assert row["actor_train_time_s"] == 9.0
    assert row["train_residual_time_s"] == 12.0 - 9.0
    assert row["unattributed_time_s"] == 30.0 - 17.0 - 12.0
    assert row["response_tokens_total"] == 400.0 and row["total_tokens_total"] == 600.0
    assert row["prompt_length_mean"] == 50.0
    assert row["rollout_aggregate_tok_s"] == 40.0
    assert row["rollout_s_per_1k_response_tokens"] == 10.0 / 0.4


def test_subsets_steady_and_fully_truncated(tmp_path):
    rows = synthetic_rows(30, seed=3)
    arm = load_arm(run_dir(tmp_path, "a", rows))
    out = step_rows(arm, steady_from=5)
    assert [r["step"] for r in out if r["steady"]] == list(range(5, 30))
    expected = [r["step"] for r in rows if r["response_length"] == 256 and r["truncated_ratio"] == 1.0]
    assert expected and [r["step"] for r in out if r["fully_truncated"]] == expected


def test_pairing_is_automatic_and_forced(tmp_path):
    a = load_arm(run_dir(tmp_path, "a", synthetic_rows(20, seed=1)))
    b = load_arm(run_dir(tmp_path, "b", synthetic_rows(20, seed=2, slowdown=1.3)))
    short = load_arm(run_dir(tmp_path, "c", synthetic_rows(15, seed=2, slowdown=1.3)))
    method = lambda r: r.summary["subsets"]["all"]["comparisons"][0]["bootstrap_method"]
    assert method(analyze_perf([a, b], draws=500)) == "paired"
    assert method(analyze_perf([a, b], draws=500, pairing="unpaired")) == "unpaired"
    assert method(analyze_perf([a, short], draws=500)) == "unpaired"
    with pytest.raises(Exception, match="--paired needs every arm to have the same step indices"):
        analyze_perf([a, short], pairing="paired")


@pytest.mark.parametrize("pairing", ["auto", "paired"])
def test_a_subset_whose_steps_differ_between_arms_is_compared_unpaired(tmp_path, pairing):
    a = load_arm(run_dir(tmp_path, "a", synthetic_rows(40, seed=1)))
    b = load_arm(run_dir(tmp_path, "b", synthetic_rows(40, seed=2, slowdown=1.3)))
    doc = analyze_perf([a, b], draws=500, pairing=pairing).summary
    steps = {n: [r["step"] for r in step_rows(arm) if r["fully_truncated"]] for n, arm in (("a", a), ("b", b))}
    assert steps["a"] != steps["b"] and set(steps["a"]) & set(steps["b"])  # same run steps, different subset
    assert doc["subsets"]["all"]["comparisons"][0]["bootstrap_method"] == "paired"
    assert doc["settings"]["pairing_used"] == "paired"
    comparison = doc["subsets"]["fully_truncated"]["comparisons"][0]
    assert comparison["bootstrap_method"] == "unpaired" and comparison["paired_steps"] is None
    assert "differ" in comparison["pairing_reason"]
    step = comparison["metrics"]["step_time_s"]
    # the CI is about the number reported next to it: every step of the subset in each arm
    assert step["bootstrap"]["n"] == [len(steps["a"]), len(steps["b"])]
    assert step["bootstrap"]["estimate"] == step["difference"]
    assert step["bootstrap"]["ci95_low"] < step["difference"] < step["bootstrap"]["ci95_high"]


def test_a_subset_with_the_same_steps_in_both_arms_stays_paired(tmp_path):
    # the same lengths (same rng stream), slower timings: both arms truncate at the same steps
    a = load_arm(run_dir(tmp_path, "a", synthetic_rows(40, seed=1)))
    b = load_arm(run_dir(tmp_path, "b", synthetic_rows(40, seed=1, slowdown=1.3)))
    comparison = analyze_perf([a, b], draws=500).summary["subsets"]["fully_truncated"]["comparisons"][0]
    n = sum(1 for r in step_rows(a) if r["fully_truncated"])
    assert comparison["bootstrap_method"] == "paired" and comparison["paired_steps"] == n
    assert comparison["metrics"]["step_time_s"]["bootstrap"]["n"] == [n]


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    ref = [float(i % 7) for i in range(50)]
    other = [v + 2.0 + (i % 3) * 0.1 for i, v in enumerate(ref)]
    one, two = Resampler(seed=5).paired(ref, other), Resampler(seed=5).paired(ref, other)
    assert one == two and one["draws"] == 20_000
    assert one["ci95_low"] <= one["estimate"] <= one["ci95_high"]
    assert Resampler(seed=6).paired(ref, other) != one
    unpaired = Resampler(seed=5).unpaired(ref, other)
    # pairing removes the shared step-to-step variation: the paired interval is much narrower
    assert (one["ci95_high"] - one["ci95_low"]) < 0.5 * (unpaired["ci95_high"] - unpaired["ci95_low"])


def test_ols_recovers_a_known_model_with_valid_intervals():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 50, 400)
    arm = (np.arange(400) % 2).astype(float)
    y = 3.0 + 1.5 * x + 7.0 * arm + rng.normal(0, 1.0, 400)
    fit = ols("y", list(y), {"intercept": [1.0] * 400, "x": list(x), "arm[b]": list(arm)})
    for name, truth in (("intercept", 3.0), ("x", 1.5), ("arm[b]", 7.0)):
        i = fit.regressors.index(name)
        assert fit.ci95[i][0] < truth < fit.ci95[i][1]
    assert fit.df_resid == 397 and fit.r_squared > 0.99
    # standard errors agree with the textbook formula computed independently
    X = np.column_stack([np.ones(400), x, arm])
    resid = y - X @ np.linalg.solve(X.T @ X, X.T @ y)
    se = np.sqrt(np.diag(resid @ resid / 397 * np.linalg.inv(X.T @ X)))
    assert np.allclose(fit.std_errors, se, rtol=1e-9)


@pytest.mark.parametrize("df,expected", [(1, 12.7062047361747), (5, 2.57058183563631), (30, 2.04227245630124),
                                         (397, 1.96595742796682)])
def test_t_quantile_matches_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-9)


def test_regression_has_one_indicator_per_other_arm(tmp_path):
    arms = [load_arm(run_dir(tmp_path, n, synthetic_rows(20, seed=i, slowdown=1 + i / 10)))
            for i, n in enumerate(["a", "b", "c"])]
    report = analyze_perf(arms, draws=200)
    step_fit = report.summary["regressions"][0]
    assert step_fit["model"] == "step_time_s ~ 1 + response_ktokens + arm[b] + arm[c]"
    assert [c["name"] for c in step_fit["coefficients"]] == ["intercept", "response_ktokens", "arm[b]", "arm[c]"]
    assert len(report.summary["subsets"]["all"]["comparisons"]) == 2


@dataclass(frozen=True)
class _Diff:
    path: str


@dataclass(frozen=True)
class _Result:
    controlled: bool
    uncontrolled: list


def test_comparability_needs_manifests_for_every_arm(tmp_path):
    with_manifest = load_arm(sealed_run(tmp_path, "native", "a", synthetic_rows(3)))
    bare = load_arm(write_log(tmp_path / "b.log", synthetic_rows(3)))
    verdict = assess([with_manifest, bare], compare=lambda m1, m2: _Result(True, []))
    assert not verdict.controlled
    assert verdict.pairs[0].reasons == ("b has no run manifest and no seal (bare log): its software identity is unknown",)


def test_comparability_follows_the_compare_result(tmp_path):
    a = load_arm(sealed_run(tmp_path, "native", "a", synthetic_rows(3)))
    b = load_arm(sealed_run(tmp_path, "consistency", "b", synthetic_rows(3)))
    seen = []
    yes = assess([a, b], compare=lambda m1, m2: seen.append((m1["run_id"], m2["run_id"])) or _Result(True, []))
    assert yes.controlled and yes.label == "controlled comparison" and seen == [("a", "b")]
    no = assess([a, b], compare=lambda m1, m2: _Result(False, [_Diff("/stack/sources/0/commit")]))
    assert not no.controlled and no.pairs[0].uncontrolled_paths == ("/stack/sources/0/commit",)
    assert "/stack/sources/0/commit" in no.headline()


def test_manifests_the_real_compare_cannot_read_are_not_controlled(tmp_path):
    # these manifests carry an arm name and workload only: no stack, so nothing proves the software
    a = load_arm(run_dir(tmp_path, "a", synthetic_rows(3)))
    b = load_arm(run_dir(tmp_path, "b", synthetic_rows(3)))
    verdict = assess([a, b])
    assert not verdict.controlled and verdict.label == "descriptive, not causal"
    assert "could not compare the manifests" in verdict.pairs[0].reasons[0]


def test_cli_outputs_and_labels_when_not_controlled(tmp_path):
    a = run_dir(tmp_path, "native", synthetic_rows(25, seed=1))
    b = write_log(tmp_path / "strict.log", synthetic_rows(25, seed=2, slowdown=1.2, mismatch=False))
    out = tmp_path / "report" / "perf"
    result = CliRunner().invoke(cli, ["analyze", "perf", str(a), str(b), "--out", str(out), "--steady-from", "3",
                                      "--draws", "1000"])
    assert result.exit_code == 0, result.output
    assert "NOT a controlled comparison" in result.output and "descriptive, not causal" in result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["step-metrics.csv", "summary.csv", "summary.json"] + [
        f"{s}.{e}" for s in ("performance-decomposition", "length-controlled-scaling", "stage-time-series",
                             "token-normalized-throughput") for e in ("png", "pdf")])
    summary = json.loads((out / "summary.json").read_text())
    assert schema_problems(summary, "analysis-perf") == []
    assert summary["settings"]["steady_from"] == 3 and summary["subsets"]["steady"]["arms"]["native"]["steps"] == 22
    with open(out / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["comparison"] for r in rows if r["arm"] == "strict"} == {"descriptive, not causal"}
    with open(out / "step-metrics.csv") as fh:
        metrics = list(csv.DictReader(fh))
    assert len(metrics) == 50 and metrics[0]["arm"] == "native"
    # every step row says whether its arm is part of a controlled comparison, as summary.csv does
    assert {r["comparison"] for r in metrics if r["arm"] == "native"} == {"reference"}
    assert {r["comparison"] for r in metrics if r["arm"] == "strict"} == {"descriptive, not causal"}
    assert (out / "performance-decomposition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "performance-decomposition.pdf").read_bytes()[:5] == b"%PDF-"


def test_cli_json_single_arm(tmp_path):
    log = write_log(tmp_path / "solo.log", synthetic_rows(10))
    result = CliRunner().invoke(cli, ["analyze", "perf", str(log), "--out", str(tmp_path / "o"), "--json", "--no-figures"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["comparison"]["applicable"] is False and doc["speedups"] == []
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["step-metrics.csv", "summary.csv", "summary.json"]
    with open(tmp_path / "o" / "step-metrics.csv") as fh:
        assert {r["comparison"] for r in csv.DictReader(fh)} == {"single arm"}


def test_existing_output_file_is_refused_and_nothing_is_written(tmp_path):
    log = write_log(tmp_path / "a.log", synthetic_rows(5))
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    result = CliRunner().invoke(cli, ["analyze", "perf", str(log), "--out", str(out), "--no-figures"])
    assert result.exit_code == 2
    assert f"{out / 'summary.json'}: already exists" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    assert (out / "summary.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")] == []


def test_existing_empty_out_dir_is_filled(tmp_path):
    log = write_log(tmp_path / "a.log", synthetic_rows(5))
    (tmp_path / "out").mkdir()
    result = CliRunner().invoke(cli, ["analyze", "perf", str(log), "--out", str(tmp_path / "out"), "--no-figures"])
    assert result.exit_code == 0 and len(list((tmp_path / "out").iterdir())) == 3


def test_failure_leaves_no_output(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("step 0: {'train/loss': 1.0, 'train/global_batch_size': 2}\nstep 0: {'train/loss': 3.0}\n")
    result = CliRunner().invoke(cli, ["analyze", "perf", str(log), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "lines 1 and 2" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_duplicate_arm_names_need_renaming(tmp_path):
    a = write_log(tmp_path / "a.log", synthetic_rows(4))
    result = CliRunner().invoke(cli, ["analyze", "perf", str(a), str(a), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "given twice" in result.output
    result = CliRunner().invoke(cli, ["analyze", "perf", str(a), str(a), "--name", "one", "--name", "two",
                                      "--out", str(tmp_path / "o"), "--no-figures", "--draws", "200"])
    assert result.exit_code == 0, result.output
