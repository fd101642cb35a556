"""Data pins: the arm pins the dataset parquet's sha256 (arm/v4 inputs.dataset_sha256), the prompt data's
and the model's tree hash; kit prepare --arm, kit doctor and kit run refuse a mismatch naming file, pin and
what was found. Real parquet, real files, the real CLI."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from conftest import run_kit
from fixtures_prepare import make_model, write_parquet
from kit.inputs.files import hash_tree, tree_sha256
from kit.inputs.prepare import prepare_dataset
from kit.model.catalog import Catalog
from kit.model.documents import schema_problems
from kit.model.errors import CheckFailed
from kit.model.workspace import Workspace
from kit.run.doctor.context import FAIL, PASS, ArmSpec, Context
from kit.run.doctor.inputs import check_prompt_data
from kit.run.inputs import check_pinned_inputs
from kit.run.request import RunRequest


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _arm_file(tmp_path, pins: dict) -> dict:
    """Environment for run_kit: a copy of the catalog with arm 'pinned', the native arm as arm/v4 with these pins."""
    catalog = Catalog.default()
    manifests = tmp_path / f"manifests-{hashlib.sha256(json.dumps(pins).encode()).hexdigest()[:8]}"
    shutil.copytree(catalog.directory, manifests)
    doc = json.loads((catalog.directory / "native.json").read_text())
    doc.pop("comparison", None)
    doc.update(schema="rlk-kit/arm/v4", name="pinned", inputs=pins)
    assert schema_problems(doc, "arm") == []
    (manifests / "pinned.json").write_text(json.dumps(doc))
    return {"KIT_MANIFESTS": str(manifests)}


def test_prepare_refuses_a_parquet_other_than_the_pin_before_writing_anything(tmp_path):
    src = write_parquet(tmp_path / "train.parquet")
    proc = run_kit("prepare", "--workspace", str(tmp_path / "ws"), "--dataset-source", str(src), "--arm", "pinned",
                   "--accept-new-hash", env=_arm_file(tmp_path, {"dataset_sha256": "0" * 64}))
    assert proc.returncode == 1, proc.stderr
    assert f"sha256 {_sha(src)}" in proc.stderr and "0" * 64 in proc.stderr and "inputs.dataset_sha256" in proc.stderr
    assert str(src) in proc.stderr and "Traceback" not in proc.stderr
    assert not Workspace(tmp_path / "ws").data.exists() and not Workspace(tmp_path / "ws").data_provenance.exists()


def test_prepare_meets_the_pins_and_refuses_other_prompt_data_or_model(tmp_path):
    src = write_parquet(tmp_path / "train.parquet")
    model = make_model(tmp_path / "model")
    ws = tmp_path / "ws"
    # the pinned converted data: what this parquet converts to (accepted once, to learn its hash)
    out = prepare_dataset(tmp_path / "probe-ws", source=str(src), accept_new_hash=True).document["output_sha256"]
    good = {"dataset_sha256": _sha(src), "prompt_data_sha256": out, "model_tree_sha256": tree_sha256(hash_tree(model))}
    proc = run_kit("prepare", "--workspace", str(ws), "--dataset-source", str(src), "--model", str(model),
                   "--arm", "pinned", "--json", env=_arm_file(tmp_path, good))
    assert proc.returncode == 0, proc.stderr
    assert _sha(Workspace(ws).data) == out
    # another pin for the prompt data: the conversion is only kept as rejected, even with --accept-new-hash
    other = tmp_path / "other"
    proc = run_kit("prepare", "--workspace", str(other), "--dataset-source", str(src), "--accept-new-hash",
                   "--arm", "pinned", env=_arm_file(tmp_path, {**good, "prompt_data_sha256": "1" * 64}))
    assert proc.returncode == 1 and "1" * 64 in proc.stderr and out in proc.stderr, proc.stderr
    assert "inputs.prompt_data_sha256" in proc.stderr and not Workspace(other).data.exists()
    # another model tree
    proc = run_kit("prepare", "--workspace", str(tmp_path / "m"), "--no-dataset", "--model", str(model),
                   "--arm", "pinned", env=_arm_file(tmp_path, {"model_tree_sha256": "2" * 64}))
    assert proc.returncode == 1 and "inputs.model_tree_sha256" in proc.stderr and "2" * 64 in proc.stderr
    assert str(model) in proc.stderr and not (tmp_path / "m" / "provenance").exists()


def test_doctor_and_run_refuse_data_converted_from_another_parquet(tmp_path):
    src = write_parquet(tmp_path / "train.parquet")
    ws = tmp_path / "ws"
    prepare_dataset(ws, source=str(src), accept_new_hash=True)
    base = Catalog.default().arm("native")
    v4 = {**base.document, "schema": "rlk-kit/arm/v4"}

    def doctor(pins):
        arm = ArmSpec("P", {**base.document, "inputs": pins}, base.stack.name, base.stack.document, base.stack.sha256)
        return check_prompt_data(Context(arm=arm, workspace=ws))

    refused = doctor({"dataset_sha256": "3" * 64})
    assert refused.status == FAIL and "inputs.dataset_sha256" in refused.reason
    assert _sha(src) in refused.reason and "3" * 64 in refused.reason
    assert doctor({"dataset_sha256": _sha(src), "prompt_data_sha256": _sha(Workspace(ws).data)}).status == PASS

    files = {"model": tmp_path, "checkpoint": tmp_path, "prompt_data": Workspace(ws).data}
    pinned = Catalog.default().arm_from_document({**v4, "inputs": {"dataset_sha256": "3" * 64}}, "pinned")
    with pytest.raises(CheckFailed, match="inputs.dataset_sha256") as err:
        check_pinned_inputs(RunRequest(arm=pinned, workspace=ws, runtime="docker"), files)
    assert _sha(src) in str(err.value) and "3" * 64 in str(err.value)
    held = Catalog.default().arm_from_document({**v4, "inputs": {"dataset_sha256": _sha(src)}}, "pinned")
    check_pinned_inputs(RunRequest(arm=held, workspace=ws, runtime="docker"), files)
    # prompt data from elsewhere carry no provenance of their parquet: refused, not assumed
    elsewhere = tmp_path / "copy.jsonl"
    elsewhere.write_bytes(Workspace(ws).data.read_bytes())
    with pytest.raises(CheckFailed, match="provenance"):
        check_pinned_inputs(RunRequest(arm=held, workspace=ws, runtime="docker"), {**files, "prompt_data": elsewhere})
