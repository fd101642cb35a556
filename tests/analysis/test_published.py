"""Acceptance against published data: logs rebuilt from the G10/G11 CUDA 200-step rounds.csv must
reproduce every published per-arm figure, one assertion per number, through the `kit analyze` CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fixtures_vime_logs import published_summary, write_published_logs
from kit.cli import cli

PUBLISHED = published_summary()
# summary.json fields of the published collector (reference §5.1)
CONVERGENCE_FIELDS = (
    "round_count", "active_token_exposure", "bitwise_mismatch_count", "bitwise_mismatch_rate",
    "mean_abs_dlogp_token_weighted", "max_abs_dlogp", "reward_mean", "raw_reward_mean", "truncated_ratio_mean",
    "step_time_mean", "actor_tokens_per_second_mean", "unweighted_mean_abs_dlogp", "run_count",
)
# means README.md computed from rounds.csv with statistics.mean (not in the summary files)
EXTRA_MEANS = {
    ("G10", "rollout_time_s"): 61.609931322336195, ("G11", "rollout_time_s"): 93.70663462400437,
    ("G10", "train_time_s"): 6.009222514629364, ("G11", "train_time_s"): 9.015685225725173,
    ("G10", "update_weights_time_s"): 15.122801886796951, ("G11", "update_weights_time_s"): 15.07695339679718,
    ("G10", "response_length_mean"): 6204.403125, ("G11", "response_length_mean"): 6129.371875,
}
PERF_FROM_SUMMARY = {"step_time_s": "step_time_mean", "actor_train_tok_s": "actor_tokens_per_second_mean",
                     "rollout_truncated_ratio": "truncated_ratio_mean"}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("published")
    logs = write_published_logs(root / "logs")
    runner = CliRunner()
    perf = runner.invoke(cli, ["analyze", "perf", str(logs["G10"]), str(logs["G11"]), "--out", str(root / "perf")])
    assert perf.exit_code == 0, perf.output
    conv = runner.invoke(cli, ["analyze", "convergence", str(logs["G10"]), str(logs["G11"]),
                               "--out", str(root / "conv"), "--no-figures"])
    assert conv.exit_code == 0, conv.output
    return {
        "perf": json.loads((root / "perf" / "summary.json").read_text()),
        "conv": {s["group"]: s for s in json.loads((root / "conv" / "summary.json").read_text())["summaries"]},
        "conv_csv": (root / "conv" / "summary.csv").read_text(),
        "perf_text": perf.output,
    }


@pytest.mark.parametrize("group", ["G10", "G11"])
@pytest.mark.parametrize("field", CONVERGENCE_FIELDS)
def test_convergence_summary_reproduces_published(outputs, group, field):
    assert outputs["conv"][group][field] == PUBLISHED[group][field]


@pytest.mark.parametrize("group", ["G10", "G11"])
@pytest.mark.parametrize("metric", sorted(PERF_FROM_SUMMARY))
def test_perf_means_reproduce_published(outputs, group, metric):
    got = outputs["perf"]["subsets"]["all"]["arms"][group]["metrics"][metric]["mean"]
    assert got == PUBLISHED[group][PERF_FROM_SUMMARY[metric]]


@pytest.mark.parametrize("group,metric", sorted(EXTRA_MEANS))
def test_perf_means_reproduce_readme_values(outputs, group, metric):
    assert outputs["perf"]["subsets"]["all"]["arms"][group]["metrics"][metric]["mean"] == EXTRA_MEANS[(group, metric)]


@pytest.mark.parametrize("group,hours", [("G10", 4.8719), ("G11", 6.8128)])
def test_total_step_hours_reproduce_readme(outputs, group, hours):
    assert round(outputs["perf"]["throughput"][group]["step_time_total_hours"], 4) == hours


@pytest.mark.parametrize("group,count", [("G10", 87), ("G11", 82)])
def test_fully_truncated_steps_match_readme(outputs, group, count):
    arm = next(a for a in outputs["perf"]["arms"] if a["name"] == group)
    assert arm["fully_truncated_steps"] == count
    assert outputs["perf"]["subsets"]["fully_truncated"]["arms"][group]["steps"] == count


def test_global_batch_size_is_read_from_the_log(outputs):
    assert {(a["global_batch_size"], a["global_batch_size_origin"]) for a in outputs["perf"]["arms"]} == \
        {(8, "train/global_batch_size in the log")}


def test_pair_is_labelled_descriptive_everywhere(outputs):
    perf = outputs["perf"]
    assert perf["comparison"]["controlled"] is False
    assert perf["speedups"][0]["label"] == "descriptive, not causal"
    assert all(c["label"] == "descriptive, not causal" for s in perf["subsets"].values() for c in s["comparisons"])
    assert "NOT a controlled comparison" in outputs["perf_text"]
    assert "descriptive, not causal" in outputs["conv_csv"].splitlines()[1]


def test_paired_bootstrap_over_shared_steps(outputs):
    boot = outputs["perf"]["subsets"]["all"]["comparisons"][0]["metrics"]["step_time_s"]["bootstrap"]
    assert boot["method"] == "paired" and boot["draws"] == 20_000 and boot["n"] == [200]
    assert boot["ci95_low"] < PUBLISHED["G11"]["step_time_mean"] - PUBLISHED["G10"]["step_time_mean"] < boot["ci95_high"]


def test_fully_truncated_subset_is_unpaired_over_all_its_steps(outputs):
    # 87 and 82 fully truncated steps, 78 of them shared: a paired CI would describe 78-step pairs,
    # not the difference of the two subset means reported beside it
    comparison = outputs["perf"]["subsets"]["fully_truncated"]["comparisons"][0]
    assert comparison["bootstrap_method"] == "unpaired" and comparison["paired_steps"] is None
    step = comparison["metrics"]["step_time_s"]
    assert step["bootstrap"]["method"] == "unpaired" and step["bootstrap"]["n"] == [87, 82]
    assert step["bootstrap"]["estimate"] == step["difference"]
    assert step["bootstrap"]["ci95_low"] < step["difference"] < step["bootstrap"]["ci95_high"]


def test_length_controlled_gap_is_labelled_descriptive(outputs):
    for fit in outputs["perf"]["regressions"]:
        (gap,) = [c for c in fit["coefficients"] if c["name"] == "arm[G11]"]
        assert (gap["label"], gap["controlled"]) == ("descriptive, not causal", False)
