"""Comparability of analysed runs through the real `kit compare` over run manifests built from the catalog."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures_vime_logs import published_rounds, synthetic_rows, write_log
from kit.catalog import Catalog
from kit.cli import cli


def run_manifest(arm, run_id: str) -> dict:
    # the fields kit.compare.compare_run_manifests reads from a run manifest
    return {"run_id": run_id, "arm": arm.document, "stack": {"document": arm.stack.document},
            "image": {"id": "sha256:" + "0" * 64}, "observed_identity": {}}


def make_run(root: Path, arm_name: str, run_id: str, rows, gbs: int) -> Path:
    d = root / "convergence" / run_id
    d.mkdir(parents=True)
    write_log(d / "run.log", rows, gbs=gbs, with_tqdm=False)
    (d / "manifest.json").write_text(json.dumps(run_manifest(Catalog.default().arm(arm_name), run_id)))
    return d


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
