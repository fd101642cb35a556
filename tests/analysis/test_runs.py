"""`kit run` then `kit analyze` on the real run directories it wrote: the path a user takes, end to end.

Two sealed smoke runs are made through the CLI (``--mode native`` and ``--mode consistency``) in a
workspace under tmp_path; `kit analyze perf` and `kit analyze convergence` then read the run dirs.
The batch size must come from each run's manifest, and the verdict of `kit compare` over the two run
dirs must be what every analysis output reports.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.model.documents import schema_problems

ROLLOUTS = 3


def kit(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True, check=False,
                          env=dict(os.environ, **(env or {})), timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    dirs = []
    for mode in ("native", "consistency"):
        run_id = f"analyze-{mode}"
        proc = kit("run", "--arm", "smoke", "--mode", mode, "--rollouts", str(ROLLOUTS), "--run-id", run_id,
                   "--allow-dirty", "--json", env={"KIT_WORKSPACE": str(ws)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        dirs.append(ws / "runs" / run_id)
    return dirs, tmp_path_factory.mktemp("reports")


def manifest_workload(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())["arm"]["workload"]


def manifest_arm_name(run_dir: Path) -> str:
    return json.loads((run_dir / "manifest.json").read_text())["arm"]["name"]


@pytest.fixture(scope="module")
def verdict(runs):
    """What `kit compare` says of the two run dirs: (controlled, label, uncontrolled paths)."""
    (native, strict), _ = runs
    proc = kit("compare", "--json", str(native), str(strict))
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["controlled"] is (proc.returncode == 0)
    uncontrolled = {d["path"] for d in doc["differences"] if d["status"] == "uncontrolled"}
    label = "controlled comparison" if doc["controlled"] else "descriptive, not causal"
    return doc["controlled"], label, uncontrolled


def step_totals(run_dir: Path, key: str) -> float:
    """A per-sample mean summed over the run's steps × its manifest's global batch size."""
    gbs = manifest_workload(run_dir)["global_batch_size"]
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return sum(r["payload"][key] * gbs for r in records if r["kind"] == "step")


def test_perf_on_run_dirs(runs, verdict):
    (native, strict), reports = runs
    controlled, label, uncontrolled = verdict
    out = reports / "perf"
    proc = kit("analyze", "perf", str(native), str(strict), "--out", str(out), "--no-figures", "--draws", "500")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("controlled comparison" if controlled else "NOT a controlled comparison")
    assert proc.stderr == ""  # no skipped record lines in a real run log

    doc = json.loads((out / "summary.json").read_text())
    assert schema_problems(doc, "analysis-perf") == []
    names = [manifest_arm_name(native), manifest_arm_name(strict)]
    assert [a["name"] for a in doc["arms"]] == names
    for arm, run_dir in zip(doc["arms"], (native, strict)):
        assert arm["run_dir"] == str(run_dir) and arm["bare_log"] is False and arm["steps"] == ROLLOUTS
        assert arm["global_batch_size"] == manifest_workload(run_dir)["global_batch_size"]
        assert arm["global_batch_size_origin"] == "manifest workload.global_batch_size"
        assert arm["max_response_len"] == manifest_workload(run_dir)["max_response_len"]
    reported = doc["comparison"]
    assert reported["applicable"] is True and reported["controlled"] is controlled
    assert set(reported["pairs"][0]["uncontrolled_paths"]) == uncontrolled
    assert doc["speedups"][0]["label"] == label and doc["stage_contributions"][0]["label"] == label

    with open(out / "step-metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * ROLLOUTS
    assert {(r["arm"], r["comparison"]) for r in rows} == {(names[0], "reference"), (names[1], label)}
    with open(out / "summary.csv") as fh:
        assert {r["comparison"] for r in csv.DictReader(fh) if r["arm"] == names[1]} == {label}
    gbs = manifest_workload(native)["global_batch_size"]
    first = rows[0]
    assert float(first["response_tokens_total"]) == pytest.approx(float(first["response_length_mean"]) * gbs)


def test_convergence_on_run_dirs(runs, verdict):
    (native, strict), reports = runs
    controlled, label, uncontrolled = verdict
    out = reports / "convergence"
    proc = kit("analyze", "convergence", str(native), str(strict), "--out", str(out), "--no-figures", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert schema_problems(doc, "analysis-convergence") == []
    assert doc["comparison"]["controlled"] is controlled and doc["comparison"]["label"] == label
    assert set(doc["comparison"]["pairs"][0]["uncontrolled_paths"]) == uncontrolled
    for run, run_dir in zip(doc["runs"], (native, strict)):
        assert run["run_id"] == run_dir.name
        assert run["global_batch_size"] == manifest_workload(run_dir)["global_batch_size"]
        assert run["global_batch_size_origin"] == "manifest workload.global_batch_size"
    groups = {s["group"]: s for s in doc["summaries"]}
    native_name, strict_name = manifest_arm_name(native), manifest_arm_name(strict)
    assert groups[native_name]["bitwise_mismatch_count"] > 0
    assert groups[strict_name]["bitwise_mismatch_count"] == 0 and groups[strict_name]["round_count"] == ROLLOUTS

    # counts are the run's own per-sample means (metrics.jsonl) × the manifest's global batch size
    with open(out / "rounds.csv") as fh:
        rounds = list(csv.DictReader(fh))
    for run_dir, name in ((native, native_name), (strict, strict_name)):
        for column, key in (("mismatch_count", "train/train_current_rollout_logprob_mismatch_count"),
                            ("active_token_count", "train/train_current_rollout_logprob_numel")):
            total = sum(float(r[column]) for r in rounds if r["group"] == name)
            assert total == pytest.approx(step_totals(run_dir, key))
    with open(out / "summary.csv") as fh:
        assert {r["comparison"] for r in csv.DictReader(fh)} == {label}
