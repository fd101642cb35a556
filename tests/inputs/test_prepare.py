"""`kit prepare`: DAPO parquet -> JSONL, provenance, model hashing, conversion command and refusals.

Everything runs offline on a parquet and a model directory made here.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures_prepare import EXPECTED_JSONL, make_model, rows, write_parquet
from kit.cli import cli
from kit.model.documents import schema_problems
from kit.model.errors import BadInput, CheckFailed
from kit.inputs.files import HashCache, hash_file_cached, hash_tree, tree_sha256
from kit.inputs.checkpoint import conversion_command
from kit.inputs.prepare import (
    PUBLISHED_OUTPUT_SHA256,
    PUBLISHED_URL,
    Workspace,
    expected_output_sha256,
    matches_published_output,
    prepare_dataset,
    prepare_model,
)


def run_kit(*args, env=None):
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.output


def leftovers(ws: Path) -> list[str]:
    """Anything under data/ that is not a finished product: temp files, partials."""
    data = ws / "data"
    return sorted(p.name for p in data.iterdir() if p.name.startswith(".")) if data.exists() else []


@pytest.fixture
def parquet(tmp_path):
    return write_parquet(tmp_path / "train.parquet")


def test_conversion_bytes_and_provenance(tmp_path, parquet):
    ws = tmp_path / "ws"
    result = prepare_dataset(ws, source=str(parquet), accept_new_hash=True)
    assert Workspace(ws).data.read_bytes() == EXPECTED_JSONL.encode("utf-8")
    doc = result.document
    assert schema_problems(doc, "rlk-kit/provenance/v1") == []
    assert (doc["rows_read"], doc["rows_written"], doc["duplicates_removed"]) == (4, 3, 1)
    assert doc["output_sha256"] == hashlib.sha256(EXPECTED_JSONL.encode()).hexdigest()
    assert doc["source_sha256"] == hashlib.sha256(parquet.read_bytes()).hexdigest()
    assert doc["source"] == str(parquet.resolve())
    # a local DAPO-shaped parquet is held to the published output hash; this one differs, accepted
    assert doc["expected_output_sha256"] == PUBLISHED_OUTPUT_SHA256 and doc["accepted_new_hash"] is True
    assert matches_published_output(doc) is False
    on_disk = json.loads(Workspace(ws).data_provenance.read_text())
    assert on_disk == doc
    assert leftovers(ws) == []


def test_local_parquet_that_is_not_the_published_data_is_refused_without_accept(tmp_path, parquet):
    ws = tmp_path / "ws"
    with pytest.raises(CheckFailed, match="not the published DAPO-Math-17k conversion.*--accept-new-hash"):
        prepare_dataset(ws, source=str(parquet))
    w = Workspace(ws)
    assert not w.data.exists() and not w.data_provenance.exists()
    assert [p.name for p in w.data.parent.glob("*.rejected-*")] == \
        [f"dapo-math-17k.jsonl.rejected-{hashlib.sha256(EXPECTED_JSONL.encode()).hexdigest()[:12]}"]

    code, out = run_kit("prepare", "--workspace", str(tmp_path / "ws2"), "--dataset-source", str(parquet))
    assert code == 1 and "--accept-new-hash" in out and PUBLISHED_OUTPUT_SHA256 in out


def test_rerun_reuses_and_detects_changes(tmp_path, parquet):
    ws = tmp_path / "ws"
    first = prepare_dataset(ws, source=str(parquet), accept_new_hash=True)
    again = prepare_dataset(ws, source=str(parquet))
    assert again.reused and again.document == first.document
    other = write_parquet(tmp_path / "other.parquet", rows()[:2])
    with pytest.raises(BadInput, match="already prepared from"):
        prepare_dataset(ws, source=str(other), accept_new_hash=True)
    data = Workspace(ws).data
    data.write_bytes(data.read_bytes().replace(b"1/3", b"1/4"))
    with pytest.raises(CheckFailed, match="changed after preparation"):
        prepare_dataset(ws, source=str(parquet))


def test_expected_hash_rule():
    # every source is held to the published conversion; only an explicit table overrides it
    for source in (PUBLISHED_URL, "/data/train.parquet", "https://mirror.example/train.parquet"):
        assert expected_output_sha256(source, "0" * 64) == PUBLISHED_OUTPUT_SHA256
    assert expected_output_sha256("/x.parquet", "0" * 64, {"/x.parquet": "e" * 64}) == "e" * 64
    assert matches_published_output({"output_sha256": PUBLISHED_OUTPUT_SHA256})
    assert not matches_published_output({"output_sha256": "0" * 64})


def test_published_source_with_other_hash_is_refused_then_accepted(tmp_path, parquet):
    ws = tmp_path / "ws"
    src = str(parquet.resolve())
    wrong = "f" * 64
    with pytest.raises(CheckFailed, match="--accept-new-hash"):
        prepare_dataset(ws, source=src, expectations={src: wrong})
    w = Workspace(ws)
    assert not w.data.exists() and not w.data_provenance.exists()
    rejected = list(w.data.parent.glob("dapo-math-17k.jsonl.rejected-*"))
    assert len(rejected) == 1 and rejected[0].read_bytes() == EXPECTED_JSONL.encode()
    assert leftovers(ws) == []

    accepted = prepare_dataset(ws, source=src, accept_new_hash=True, expectations={src: wrong})
    assert accepted.document["accepted_new_hash"] is True
    assert accepted.document["expected_output_sha256"] == wrong
    assert schema_problems(accepted.document, "rlk-kit/provenance/v1") == []


def test_published_source_with_its_hash_passes(tmp_path, parquet):
    src = str(parquet.resolve())
    good = hashlib.sha256(EXPECTED_JSONL.encode()).hexdigest()
    doc = prepare_dataset(tmp_path / "ws", source=src, expectations={src: good}).document
    assert doc["expected_output_sha256"] == good and doc["accepted_new_hash"] is False


def test_cli_prepare_json(tmp_path, parquet):
    ws = tmp_path / "ws"
    model = make_model(tmp_path / "Qwen3-tiny")
    result = CliRunner().invoke(cli, ["prepare", "--workspace", str(ws), "--dataset-source", str(parquet),
                                      "--accept-new-hash", "--model", str(model), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "rlk-kit/prepare-result/v1" and schema_problems(doc, "prepare-result") == []
    assert doc["workspace"] == str(ws.resolve()) and set(doc) == {"schema", "workspace", "dataset", "model"}
    assert doc["model"]["document"]["kind"] == "model" and doc["model"]["reused"] is False
    assert f"hashing {model}:" not in result.output          # --json: no progress, on either stream
    assert doc["dataset"]["document"]["rows_written"] == 3
    assert doc["dataset"]["matches_published_output"] is False
    assert doc["dataset"]["document"]["accepted_new_hash"] is True
    assert "is NOT the published DAPO-Math-17k conversion" in result.stderr
    result = CliRunner().invoke(cli, ["prepare", "--dataset-source", str(parquet)], env={"KIT_WORKSPACE": str(ws)})
    assert result.exit_code == 0 and "unchanged" in result.stdout and "NOT the published" in result.stdout
    assert "kit: warning:" in result.stderr


# --- bad input: exit 2, nothing half-written -------------------------------------------------------

def _assert_clean_refusal(ws: Path, code: int, out: str, *needles: str, checked_first: bool = True):
    assert code == 2, out
    assert "Traceback" not in out
    for needle in needles:
        assert needle in out, out
    w = Workspace(ws)
    assert not w.data.exists() and not w.data_provenance.exists()
    assert leftovers(ws) == []
    if checked_first:  # refused by the checks that run before anything is written
        assert not ws.exists(), sorted(str(p) for p in ws.rglob("*"))


def test_missing_parquet(tmp_path):
    ws = tmp_path / "ws"
    code, out = run_kit("prepare", "--workspace", str(ws), "--dataset-source", str(tmp_path / "nope.parquet"))
    _assert_clean_refusal(ws, code, out, "--dataset-source", "nope.parquet", "no such file")


def test_corrupt_parquet(tmp_path, parquet):
    ws = tmp_path / "ws"
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(parquet.read_bytes()[: parquet.stat().st_size // 2])  # truncated mid-file
    code, out = run_kit("prepare", "--workspace", str(ws), "--dataset-source", str(bad))
    _assert_clean_refusal(ws, code, out, "--dataset-source", "bad.parquet", "parquet")


def test_wrong_columns(tmp_path):
    ws = tmp_path / "ws"
    src = write_parquet(tmp_path / "cols.parquet", drop="ability")
    code, out = run_kit("prepare", "--workspace", str(ws), "--dataset-source", str(src))
    _assert_clean_refusal(ws, code, out, "missing column(s) ability", "extra_info")


def test_row_without_index(tmp_path):
    ws = tmp_path / "ws"
    data = rows()
    data[1]["extra_info"] = {"index": None}
    src = write_parquet(tmp_path / "noidx.parquet", data)
    code, out = run_kit("prepare", "--workspace", str(ws), "--dataset-source", str(src), "--accept-new-hash")
    # the rows are read only while converting: the workspace exists, but holds no data and no provenance
    _assert_clean_refusal(ws, code, out, "row 2", "extra_info.index", checked_first=False)


def test_every_input_is_checked_before_the_dataset_is_written(tmp_path, parquet):
    """A bad --model is refused before the dataset is converted: nothing at all is written."""
    ws = tmp_path / "ws"
    for model, needle in ((tmp_path / "no-such-model", "no such directory"),
                          (make_model(tmp_path / "no-weights", weights=False), "no weights")):
        code, out = run_kit("prepare", "--workspace", str(ws), "--dataset-source", str(parquet),
                            "--accept-new-hash", "--model", str(model))
        _assert_clean_refusal(ws, code, out, f"--model {model}", needle)
    code, out = run_kit("prepare", "--workspace", str(ws), "--dataset-source", str(parquet), "--accept-new-hash",
                        "--model", str(make_model(tmp_path / "m")), "--convert-checkpoint", "--arm", "nope")
    _assert_clean_refusal(ws, code, out, "unknown arm 'nope' given to --arm", "G10")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=2048))
def test_arbitrary_bytes_are_bad_input(tmp_path_factory, blob):
    tmp = tmp_path_factory.mktemp("blob")
    src = tmp / "x.parquet"
    src.write_bytes(blob)
    with pytest.raises(BadInput):
        prepare_dataset(tmp / "ws", source=str(src))
    assert not Workspace(tmp / "ws").data.exists()


# --- model hashing ---------------------------------------------------------------------------------

def test_model_hashes_and_cache(tmp_path):
    ws = tmp_path / "ws"
    model = make_model(tmp_path / "Qwen3-tiny")
    result = prepare_model(ws, model)
    doc = result.document
    assert schema_problems(doc, "rlk-kit/provenance/v1") == []
    assert doc["files"] == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in model.iterdir()}
    assert doc["weights"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert doc["tree_sha256"] == tree_sha256(doc["files"])
    assert result.provenance_path == Workspace(ws).model_provenance(doc["tree_sha256"])
    assert prepare_model(ws, model).reused

    # The cache answers while size and mtime are unchanged, and re-hashes when either changes.
    cache_file = Workspace(ws).hash_cache
    assert str((model / "config.json").resolve()) in json.loads(cache_file.read_text())["entries"]
    target = model / "config.json"
    st_ = target.stat()
    target.write_text('{"model_type": "qwen9"}')  # same size
    os.utime(target, ns=(st_.st_atime_ns, st_.st_mtime_ns))
    assert hash_file_cached(target, HashCache(cache_file)) == doc["files"]["config.json"]
    os.utime(target, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1))
    assert hash_file_cached(target, HashCache(cache_file)) == hashlib.sha256(target.read_bytes()).hexdigest()
    assert hash_tree(model, cache_file)["config.json"] != doc["files"]["config.json"]


def test_default_workspace_is_where_kit_run_reads(tmp_path, parquet, monkeypatch):
    from kit.cli.run import default_workspace

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["prepare", "--dataset-source", str(parquet), "--accept-new-hash"],
                                env={"KIT_WORKSPACE": None})
    assert result.exit_code == 0, result.output
    assert Workspace(tmp_path / default_workspace()).data.read_bytes() == EXPECTED_JSONL.encode()
    (tmp_path / "afile").write_text("x")
    result = CliRunner().invoke(cli, ["prepare", "--no-dataset", "--model", str(tmp_path)],
                                env={"KIT_WORKSPACE": str(tmp_path / "afile")})
    assert result.exit_code == 2 and "KIT_WORKSPACE" in result.stderr and "is a file" in result.stderr


def test_prepare_result_schema_refuses_what_it_does_not_describe():
    from kit.model.documents import schema_problems as problems

    entry = {"path": "/ws/x", "provenance": "/ws/p.json", "reused": False,
             "document": {"schema": "rlk-kit/provenance/v1", "kind": "model"}}
    good = {"schema": "rlk-kit/prepare-result/v1", "workspace": "/ws", "model": entry}
    assert problems(good, "prepare-result") == []
    assert problems({k: v for k, v in good.items() if k != "schema"}, "prepare-result")
    assert problems({**good, "model": {**entry, "document": {**entry["document"], "kind": "dataset"}}}, "prepare-result")
    assert problems({**good, "dataset": {**entry, "document": {**entry["document"], "kind": "dataset"}}},
                    "prepare-result")            # a dataset entry says whether it is the published conversion
    assert problems({**good, "extra": 1}, "prepare-result")


def test_model_hashing_shows_progress_on_stderr(tmp_path):
    ws = tmp_path / "ws"
    model = make_model(tmp_path / "Qwen3-tiny")
    (model / "model-00003-of-00003.safetensors").write_bytes(os.urandom(3 << 20))
    result = CliRunner().invoke(cli, ["prepare", "--workspace", str(ws), "--no-dataset", "--model", str(model)])
    assert result.exit_code == 0, result.output
    size = sum(f.stat().st_size for f in model.iterdir())
    assert f"hashing {model}: 5/5 files, {size / 2**20:.1f} MiB/{size / 2**20:.1f} MiB (100%)" in result.stderr
    assert f"hashing {model}:" not in result.stdout

    # throttled: with a zero interval every block is reported, each line counting up to the total
    import io

    from kit.inputs.files import HashProgress, hash_file_cached, list_tree

    names = list_tree(model)
    stream = io.StringIO()
    bar = HashProgress(stream, model, names, interval_s=0.0)
    for rel in names:
        hash_file_cached(model / rel, None, on_bytes=bar.advance)
        bar.file_done(model / rel)
    bar.finish()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 4 and lines[-1].startswith(f"hashing {model}: 5/5 files")
    assert any(" 4/5 files" in line or " 3/5 files" in line for line in lines[:-1])


def test_model_without_weights(tmp_path):
    ws = tmp_path / "ws"
    model = make_model(tmp_path / "empty-model", weights=False)
    code, out = run_kit("prepare", "--workspace", str(ws), "--no-dataset", "--model", str(model))
    assert code == 2 and "no weights (*.safetensors or *.bin)" in out and "empty-model" in out
    assert not ws.exists()


# --- checkpoint conversion -------------------------------------------------------------------------

def test_conversion_command_is_exact():
    stack = {"name": "vime-g10", "sources": [{"name": "megatron-lm"}, {"name": "rl-kernel"}, {"name": "vime"}]}
    cmd = conversion_command(stack, "/workspace/checkpoints/.torch_dist-abc.partial")
    assert cmd == [
        "bash", "-lc",
        "set -euo pipefail; source /opt/rlk/src/vime/scripts/models/qwen3-8B.sh; "
        "PYTHONPATH=/opt/rlk/src/megatron-lm /opt/rlk/venv/bin/python "
        "/opt/rlk/src/vime/tools/convert_hf_to_torch_dist.py \"${MODEL_ARGS[@]}\" "
        "--hf-checkpoint /inputs/model --save /workspace/checkpoints/.torch_dist-abc.partial",
    ]
    with pytest.raises(BadInput, match="'vime' and a 'megatron\\*' source"):
        conversion_command({"name": "x", "sources": [{"name": "vime"}]}, "/workspace/o")


def test_convert_refused_without_engine(tmp_path, parquet):
    """No Docker engine answers: exit 2 naming --convert-checkpoint, dockerd and DOCKER_HOST; nothing written."""
    ws = tmp_path / "ws"
    model = make_model(tmp_path / "Qwen3-tiny")
    result = CliRunner().invoke(cli, ["prepare", "--workspace", str(ws), "--dataset-source", str(parquet),
                                      "--accept-new-hash", "--model", str(model), "--convert-checkpoint",
                                      "--arm", "G10"],
                                env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert result.exit_code == 2, result.output
    # the model is hashed first (its tree names the checkpoint), so its progress line may come before the error
    assert result.stderr.splitlines()[-1].startswith("kit: --convert-checkpoint: no Docker engine answers")
    assert "dockerd" in result.stderr and "DOCKER_HOST" in result.stderr and "Traceback" not in result.output
    # only the documented cache may exist: the model was hashed to look for an earlier conversion
    assert sorted(p.relative_to(ws).as_posix() for p in ws.rglob("*")) in ([], ["cache", "cache/hashes.json"])


def test_convert_refused_without_image(tmp_path, docker_engine):
    """The real engine has no image of the G10 stack here: exit 2 naming the image and `kit build`."""
    ws = tmp_path / "ws"
    model = make_model(tmp_path / "Qwen3-tiny")
    code, out = run_kit("prepare", "--workspace", str(ws), "--no-dataset", "--model", str(model),
                        "--convert-checkpoint", "--arm", "G10")
    assert code == 2, out
    assert "image not built" in out and "rlk-kit/vime-g10:cuda-" in out and "kit build cuda --arm G10" in out
    assert not (ws / "checkpoints").exists() or not list((ws / "checkpoints").iterdir())


def test_convert_flags(tmp_path):
    model = make_model(tmp_path / "m")
    code, out = run_kit("prepare", "--workspace", str(tmp_path / "ws"), "--no-dataset", "--convert-checkpoint")
    assert code == 2 and "--convert-checkpoint" in out
    code, out = run_kit("prepare", "--workspace", str(tmp_path / "ws"), "--no-dataset", "--model", str(model),
                        "--convert-checkpoint", "--arm", "smoke")
    assert code == 2 and "needs a vime arm" in out
    code, out = run_kit("prepare", "--workspace", str(tmp_path / "ws"), "--no-dataset")
    assert code == 2 and "--no-dataset: nothing left to prepare" in out and not (tmp_path / "ws").exists()
