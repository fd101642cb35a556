"""kit export mlflow into a fresh local store, read back with MLflow's own client."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from click.testing import CliRunner

from kit.analysis.table import load_arm
from kit.cli import cli
from kit.export.mlflow_runs import run_metrics, run_params
from kit.model.documents import schema_problems

PAIR = Path(__file__).resolve().parents[1] / "data" / "gpu-pair"


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
            h.update(str(p.stat().st_mtime_ns).encode())
    return h.hexdigest()


def test_export_reads_back_every_param_metric_and_artifact(tmp_path):
    from mlflow.tracking import MlflowClient

    runs = sorted(PAIR.iterdir())
    runs = [next(r for r in runs if r.name.startswith("gpu-native")), next(r for r in runs if r.name.startswith("gpu-consistency"))]
    before = {r: _tree_digest(r) for r in runs}
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "step.png").write_bytes(b"\x89PNG fixture")
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    result = CliRunner().invoke(cli, ["export", "mlflow", *map(str, runs), "--tracking-uri", uri,
                                      "--artifacts", str(tmp_path / "artifacts"), "--figures", str(figures), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert schema_problems(doc, "export-mlflow") == []
    assert {r: _tree_digest(r) for r in runs} == before        # export never modifies a run dir

    client = MlflowClient(tracking_uri=uri)
    for entry, run_dir in zip(doc["runs"], runs):
        arm = load_arm(run_dir)
        stored = client.get_run(entry["mlflow_run_id"])
        params = run_params(arm)
        assert stored.data.params == params
        assert params["stack_sha256"] and params["arm_sha256"] and params["seed"] == "1234"
        assert params["topology.gpus"] == "1"
        expected = {}
        for key, value, step in run_metrics(arm):
            expected.setdefault(key, []).append((step, value))
        assert set(stored.data.metrics) == set(expected)
        for key, points in expected.items():
            history = sorted((m.step, m.value) for m in client.get_metric_history(entry["mlflow_run_id"], key))
            assert history == sorted(points), key
        assert stored.data.tags["kit.trust"] == "verified"
        listed = {f.path for f in client.list_artifacts(entry["mlflow_run_id"], "evidence")} | \
                 {f.path for f in client.list_artifacts(entry["mlflow_run_id"], "figures")}
        assert listed == set(entry["artifacts"])
        assert {"evidence/manifest.json", "evidence/seal.json", "evidence/run.log", "figures/step.png"} <= listed
        local = Path(client.download_artifacts(entry["mlflow_run_id"], "evidence/seal.json", str(tmp_path / entry["arm"])))
        assert local.read_bytes() == (run_dir / "seal.json").read_bytes()
    tags = [r["tags"]["kit.comparison"] for r in doc["runs"]]
    assert tags == ["reference", "controlled comparison"]


def test_export_of_a_bare_log_says_so(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("step 0: {'train/loss': 0.5, 'train/global_batch_size': 2}\nstep 1: {'train/loss': 0.25}\n")
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    result = CliRunner().invoke(cli, ["export", "mlflow", str(log), "--tracking-uri", uri,
                                      "--artifacts", str(tmp_path / "art"), "--json"])
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)["runs"][0]
    assert run["tags"]["kit.trust"] == "bare log" and run["tags"]["kit.comparison"] == "single run"
    assert run["params"]["stack_sha256"] == "" and run["metric_values"] == 3   # loss at 0 and 1, batch size at 0


def _pair_runs():
    runs = sorted(PAIR.iterdir())
    return [next(r for r in runs if r.name.startswith("gpu-native")),
            next(r for r in runs if r.name.startswith("gpu-consistency"))]


def test_a_file_store_works_and_a_second_export_makes_no_duplicate(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")       # recorded, so the kit's setting is undone after
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    monkeypatch.chdir(tmp_path)
    uri = (tmp_path / "mlruns").as_uri()           # file:///…: MLflow 3 refuses it unless allowed
    args = ["export", "mlflow", *map(str, _pair_runs()), "--tracking-uri", uri, "--json"]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert schema_problems(doc, "export-mlflow") == []
    assert [r["action"] for r in doc["runs"]] == ["created", "created"]
    second = CliRunner().invoke(cli, args)
    assert second.exit_code == 0, second.output
    again = json.loads(second.stdout)
    assert schema_problems(again, "export-mlflow") == []
    assert [r["action"] for r in again["runs"]] == ["skipped", "skipped"]
    assert [r["mlflow_run_id"] for r in again["runs"]] == [r["mlflow_run_id"] for r in doc["runs"]]
    client = MlflowClient(tracking_uri=uri)
    stored = client.search_runs([doc["experiment_id"]])
    assert len(stored) == 2                          # read back from MLflow's store: no duplicate
    assert {r.data.tags["kit.run_id"] for r in stored} == {r["params"]["run_id"] for r in doc["runs"]}
    text = CliRunner().invoke(cli, args[:-1])
    assert text.exit_code == 0 and text.stdout.count("skipped") == 2, text.output


def test_the_same_run_id_with_another_seal_is_refused(tmp_path):
    import shutil

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    original = _pair_runs()[0]
    base = ["export", "mlflow", "--tracking-uri", uri, "--artifacts", str(tmp_path / "art")]
    assert CliRunner().invoke(cli, [*base, str(original)]).exit_code == 0
    copy = tmp_path / original.name
    shutil.copytree(original, copy)
    seal = json.loads((copy / "seal.json").read_text())
    (copy / "seal.json").write_text(json.dumps(seal, indent=1))   # same run id, other seal bytes
    result = CliRunner().invoke(cli, [*base, str(copy)])
    assert result.exit_code == 1, result.output
    assert "already in experiment" in result.stderr and "seal sha256" in result.stderr
    assert "Traceback" not in result.output


def test_an_mlflow_refusal_is_one_line_naming_the_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")      # the user's explicit choice is kept
    result = CliRunner().invoke(cli, ["export", "mlflow", str(_pair_runs()[0]),
                                      "--tracking-uri", (tmp_path / "mlruns").as_uri()])
    assert result.exit_code == 2, result.output
    assert "--tracking-uri" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
