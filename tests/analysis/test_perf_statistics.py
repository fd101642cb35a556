"""kit analyze perf on uneven data, the published bootstrap scheme, % effects, tails, length lines."""

from __future__ import annotations

import json
import re

import numpy as np
from click.testing import CliRunner

from fixtures_vime_logs import write_published_logs
from kit.analysis.perf import analyze_perf
from kit.analysis.table import load_arms
from kit.cli import cli


def _uneven_logs(tmp_path):
    """G10 cut to 150 steps; G11 with the train-side perf record of step 57 removed."""
    logs = write_published_logs(tmp_path / "logs")
    g10 = logs["G10"].read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(g10) if re.search(r"\brollout 150:", line))
    logs["G10"].write_text("".join(g10[:cut]))
    g11 = [line for line in logs["G11"].read_text().splitlines(keepends=True)
           if not (re.search(r"\bperf 57:", line) and "perf/step_time" in line)]
    logs["G11"].write_text("".join(g11))
    return logs


def test_uneven_data_is_stated_and_strict_exits_1(tmp_path):
    logs = _uneven_logs(tmp_path)
    args = ["analyze", "perf", str(logs["G10"]), str(logs["G11"]), "--no-figures", "--draws", "500"]
    result = CliRunner().invoke(cli, args + ["--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    al = summary["alignment"]
    assert al["aligned"] is False
    assert al["step_counts"] == {"G10": 150, "G11": 200}
    assert al["missing_steps"]["G10"] == list(range(150, 200))
    assert al["incomplete_steps"]["G11"]["step_time_s"] == [57]
    text = " | ".join(al["warnings"])
    assert "G10: 150, G11: 200" in text and "step_time_s is missing at step(s) 57" in text
    # the difference and its CI describe the same samples: 150 and 199 step times, unpaired
    m = summary["subsets"]["all"]["comparisons"][0]["metrics"]["step_time_s"]
    assert (m["n_reference"], m["n_other"]) == (150, 199)
    assert m["bootstrap"]["method"] == "unpaired" and m["bootstrap"]["n"] == [150, 199]
    assert summary["subsets"]["all"]["comparisons"][0]["paired_steps"] is None
    notes = (tmp_path / "a" / "notes.txt").read_text()
    assert "uneven data: G11: step_time_s is missing at step(s) 57" in notes and "G10: 150, G11: 200" in notes
    assert "warning: uneven data" in result.output      # CliRunner mixes stderr in

    strict = CliRunner().invoke(cli, args + ["--out", str(tmp_path / "b"), "--strict"])
    assert strict.exit_code == 1, strict.output
    assert "--strict: the arms are not aligned" in strict.output
    assert (tmp_path / "b" / "summary.json").is_file()      # the report is still written


def test_one_missing_record_with_equal_steps_unpairs_only_that_metric(tmp_path):
    logs = write_published_logs(tmp_path / "logs")
    g11 = [line for line in logs["G11"].read_text().splitlines(keepends=True)
           if not (re.search(r"\bperf 57:", line) and "perf/step_time" in line)]
    logs["G11"].write_text("".join(g11))
    report = analyze_perf(load_arms([logs["G10"], logs["G11"]]), draws=500)
    comp = report.summary["subsets"]["all"]["comparisons"][0]
    assert comp["bootstrap_method"] == "paired" and comp["paired_steps"] == 200
    st = comp["metrics"]["step_time_s"]
    assert st["bootstrap"]["method"] == "unpaired" and st["incomplete_steps"] == [57]
    assert st["note"].startswith("unpaired: step(s) 57")
    assert comp["metrics"]["rollout_time_s"]["bootstrap"]["method"] == "paired"
    assert report.summary["alignment"]["aligned"] is False


def test_published_scheme_reproduces_the_published_draws(tmp_path):
    logs = write_published_logs(tmp_path / "logs")
    arms = load_arms([logs["G10"], logs["G11"]])
    report = analyze_perf(arms, scheme="published")
    rows = {a: [r for r in report.rows if r["arm"] == a] for a in ("G10", "G11")}
    a = np.array([r["step_time_s"] for r in rows["G10"]])
    b = np.array([r["step_time_s"] for r in rows["G11"]])
    idx = np.random.default_rng(1234).integers(0, 200, (20000, 200))
    lo, hi = np.percentile((b - a)[idx].mean(axis=1), [2.5, 97.5])
    pct = np.percentile(100 * (b[idx].mean(axis=1) / a[idx].mean(axis=1) - 1), [2.5, 97.5])
    boot = report.summary["subsets"]["all"]["comparisons"][0]["metrics"]["step_time_s"]["bootstrap"]
    assert (boot["ci95_low"], boot["ci95_high"]) == (float(lo), float(hi))      # bit for bit
    assert (boot["percent"]["ci95_low"], boot["percent"]["ci95_high"]) == (float(pct[0]), float(pct[1]))
    assert boot["scheme"] == "published"
    assert report.summary["settings"]["bootstrap"]["scheme"] == "published"
    # the kit's scheme draws other indices: same estimate, a CI equal only within Monte Carlo noise
    kit = analyze_perf(arms).summary["subsets"]["all"]["comparisons"][0]["metrics"]["step_time_s"]["bootstrap"]
    assert kit["estimate"] == boot["estimate"] and kit["ci95_low"] != boot["ci95_low"]
    assert abs(kit["ci95_low"] - boot["ci95_low"]) < 0.2


def test_tails_joint_cap_subset_and_per_arm_lines(tmp_path):
    logs = write_published_logs(tmp_path / "logs")
    report = analyze_perf(load_arms([logs["G10"], logs["G11"]]), draws=2000, gpus=8)
    s = report.summary
    d = s["subsets"]["all"]["arms"]["G10"]["metrics"]["rollout_time_s"]
    values = [r["rollout_time_s"] for r in report.rows if r["arm"] == "G10"]
    assert d["p50"] == float(np.percentile(values, 50)) and d["p99"] == float(np.percentile(values, 99))
    assert d["p05"] <= d["p50"] <= d["p90"] <= d["p95"] <= d["p99"] <= d["max"]
    # 87 and 82 fully truncated steps, 78 shared: the joint subset is paired over those 78
    joint = s["subsets"]["joint_fully_truncated"]
    assert {a: joint["arms"][a]["steps"] for a in ("G10", "G11")} == {"G10": 78, "G11": 78}
    assert joint["comparisons"][0]["bootstrap_method"] == "paired"
    assert s["subsets"]["fully_truncated"]["comparisons"][0]["bootstrap_method"] == "unpaired"
    # per-GPU throughput: tokens / (GPUs x seconds)
    r = report.rows[0]
    assert r["step_response_tok_per_gpu_s"] == r["response_tokens_total"] / (8 * r["step_time_s"])
    # per-arm lines are the separate fits of each arm, evaluated at the pooled mean length
    doc = next(d for d in s["length_control"]["per_arm"] if d["response"] == "rollout_time_s")
    x = {a: np.array([r["response_tokens_total"] / 1e3 for r in report.rows if r["arm"] == a]) for a in ("G10", "G11")}
    y = {a: np.array([r["rollout_time_s"] for r in report.rows if r["arm"] == a]) for a in ("G10", "G11")}
    centre = np.concatenate([x["G10"], x["G11"]]).mean()
    pred = {a: np.polyval(np.polyfit(x[a], y[a], 1), centre) for a in x}
    gap = next(c for c in doc["coefficients"] if c["name"] == "arm[G11]")
    assert abs(gap["estimate"] - (pred["G11"] - pred["G10"])) < 1e-8
    assert gap["label"] == "descriptive, not causal"
    assert abs(doc["lines"]["G11"]["slope_s_per_ktoken"] - np.polyfit(x["G11"], y["G11"], 1)[0]) < 1e-9
    assert s["length_control"]["default"] == "shared" and "one gap" in s["length_control"]["why_default"]
