"""kit analyze convergence: runs.csv, the 29-column rounds.csv, per-group summaries, figures, smoke-format logs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures_vime_logs import DATA, synthetic_rows, write_log
from kit.cli import cli
from kit.model.documents import schema_problems

PUBLISHED_ROUNDS_HEADER = (DATA / "rounds.csv").read_text().splitlines()[0].split(",")
PUBLISHED_RUNS_HEADER = (DATA / "runs.csv").read_text().splitlines()[0].split(",")


def smoke_run(root: Path, run_id: str, arm: str, rows, gbs: int, phase: str = "smoke") -> Path:
    d = root / phase / run_id
    d.mkdir(parents=True)
    write_log(d / "run.log", rows, gbs=gbs, with_tqdm=False)
    (d / "manifest.json").write_text(json.dumps({
        "run_id": run_id,
        "arm": {"name": arm, "use_rollout_logprobs": True, "operators": {"logp": "R/R" if arm == "consistency" else "P/P"},
                "workload": {"global_batch_size": gbs, "max_response_len": 256, "seed": 7, "rollout_seed": 9,
                             "rollouts": len(rows)}},
    }))
    (d / "run-validation.json").write_text(json.dumps({"passed": True}))
    return d


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return reader.fieldnames, list(reader)


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    runs = [smoke_run(root, "native-1", "native", synthetic_rows(6, seed=1), gbs=4),
            smoke_run(root, "native-2", "native", synthetic_rows(6, seed=2), gbs=4),
            smoke_run(root, "consistency-1", "consistency", synthetic_rows(6, seed=3, mismatch=False), gbs=4)]
    out = root / "out"
    result = CliRunner().invoke(cli, ["analyze", "convergence", *map(str, runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_rounds_csv_has_the_29_published_columns_in_order(smoke_report):
    header, rows = read_csv(smoke_report[0] / "rounds.csv")
    assert len(header) == 29 and header == PUBLISHED_ROUNDS_HEADER
    assert len(rows) == 18


def test_runs_csv_header_and_manifest_fields(smoke_report):
    header, rows = read_csv(smoke_report[0] / "runs.csv")
    assert header == PUBLISHED_RUNS_HEADER
    first = rows[0]
    assert (first["phase"], first["run_id"], first["group"], first["seed"], first["rollout_seed"], first["num_rollout"],
            first["validation_passed"], first["rounds_observed"]) == ("smoke", "native-1", "native", "7", "9", "6", "True", "6")


def test_counts_are_per_sample_means_times_the_manifest_batch_size(smoke_report):
    _, rows = read_csv(smoke_report[0] / "rounds.csv")
    expected = synthetic_rows(6, seed=1)
    for got, want in zip(rows[:6], expected):
        # the log printed want/4, the table multiplies back by the manifest's global batch size 4
        assert float(got["active_token_count"]) == want["active_token_count"]
        assert float(got["mismatch_count"]) == want["mismatch_count"]
    assert rows[0]["operator_case"] == "P/P" and rows[0]["framework_consistency"] == "True"


def test_runs_of_one_arm_are_summarised_together(smoke_report):
    summary = json.loads((smoke_report[0] / "summary.json").read_text())
    assert schema_problems(summary, "analysis-convergence") == []
    groups = {s["group"]: s for s in summary["summaries"]}
    assert (groups["native"]["run_count"], groups["native"]["round_count"]) == (2, 12)
    rows = synthetic_rows(6, seed=1) + synthetic_rows(6, seed=2)
    tokens = sum(r["active_token_count"] for r in rows)
    assert groups["native"]["active_token_exposure"] == tokens
    assert groups["native"]["bitwise_mismatch_rate"] == sum(r["mismatch_count"] for r in rows) / tokens
    assert groups["consistency"]["bitwise_mismatch_count"] == 0.0 and groups["consistency"]["max_abs_dlogp"] == 0.0


def test_figures_and_labels(smoke_report):
    out, text = smoke_report
    for stem in ("consistency", "learning", "optimization", "performance"):
        assert (out / f"{stem}.png").stat().st_size > 10_000 and (out / f"{stem}.pdf").exists()
    # compare_run_manifests may or may not accept these manifests; either way the verdict is printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["comparison"]["headline"].splitlines()[0] in text
    _, rows = read_csv(out / "summary.csv")
    assert {r["comparison"] for r in rows} == {summary["comparison"]["label"]}


def test_smoke_logs_analyse_with_the_perf_command_too(tmp_path):
    run = smoke_run(tmp_path, "native-1", "native", synthetic_rows(8, seed=4), gbs=2)
    result = CliRunner().invoke(cli, ["analyze", "perf", str(run), "--out", str(tmp_path / "p"), "--no-figures", "--json"])
    assert result.exit_code == 0, result.output
    arm = json.loads(result.output)["arms"][0]
    assert (arm["name"], arm["global_batch_size"], arm["max_response_len"]) == ("native", 2, 256)


def test_repeated_run_id_is_refused(tmp_path):
    log = write_log(tmp_path / "a.log", synthetic_rows(3))
    result = CliRunner().invoke(cli, ["analyze", "convergence", str(log), str(log), "--name", "x", "--name", "y",
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "appears twice" in result.output
    assert not (tmp_path / "o").exists()


def _validation_report(arm_name: str, engine_lines: list[str]) -> dict:
    """validation.json as kit run writes it: the real gate table applied to the engine's lines."""
    from kit.model.catalog import Catalog
    from kit.gates.engine import evaluate
    from kit.gates.rules import RunEvidence

    arm = Catalog.default().arm(arm_name).document
    report = evaluate(RunEvidence(arm=arm, job_status="SUCCEEDED", engine_lines=engine_lines), run_id="r1")
    assert schema_problems(report, "validation-report") == []
    return report


def _engine_echo(arm_name: str) -> list[str]:
    from kit.model.catalog import Catalog

    sizes = Catalog.default().arm(arm_name).document["graph"]["capture_sizes"]
    return [f"INFO engine config: cudagraph_mode=<CUDAGraphMode.FULL_DECODE_ONLY: 2>, enforce_eager=False, "
            f"'cudagraph_capture_sizes': {sorted(sizes)}"]


@pytest.mark.parametrize("arm,lines,expected", [
    ("G11", _engine_echo("G11"), "True"),      # the gate passed
    ("G11", [], "False"),                      # the gate failed: no engine echo of graphs
    ("smoke", [], ""),                         # not applicable: unknown, not False
])
def test_cudagraph_passed_comes_from_the_kits_cuda_graph_gate(tmp_path, arm, lines, expected):
    run = smoke_run(tmp_path, "r1", "native", synthetic_rows(3, seed=1), gbs=4)
    (run / "run-validation.json").unlink()
    report = _validation_report(arm, lines)
    status = next(g["status"] for g in report["gates"] if g["id"] == "cuda-graph-engine")
    assert status == {"True": "passed", "False": "failed", "": "not_applicable"}[expected]
    (run / "validation.json").write_text(json.dumps(report))
    result = CliRunner().invoke(cli, ["analyze", "convergence", str(run), "--out", str(tmp_path / "o"), "--no-figures"])
    assert result.exit_code == 0, result.output
    _, rows = read_csv(tmp_path / "o" / "runs.csv")
    assert rows[0]["cudagraph_passed"] == expected
    assert rows[0]["validation_passed"] == str(report["passed"])


def test_cudagraph_passed_reads_the_older_validator_layout(tmp_path):
    run = smoke_run(tmp_path, "r1", "native", synthetic_rows(3, seed=1), gbs=4)
    (run / "run-validation.json").write_text(json.dumps({"passed": True, "cudagraph": {"passed": False}}))
    result = CliRunner().invoke(cli, ["analyze", "convergence", str(run), "--out", str(tmp_path / "o"), "--no-figures"])
    assert result.exit_code == 0, result.output
    assert read_csv(tmp_path / "o" / "runs.csv")[1][0]["cudagraph_passed"] == "False"
