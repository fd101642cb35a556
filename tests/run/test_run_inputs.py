"""VIME arms read a model, a checkpoint and prompt data: named by flags or the workspace, checked before anything starts."""

from __future__ import annotations

import json

import pytest

from kit.model.catalog import Catalog
from kit.model.errors import BadInput, CheckFailed
from kit.run.request import RunRequest
from kit.run.inputs import input_mounts, vime_input_files

from conftest import run_kit


@pytest.fixture()
def inputs(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"w" * 64)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("release\n")
    data = tmp_path / "ws" / "data" / "dapo-math-17k.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text('{"prompt":[]}\n')
    return tmp_path


def test_missing_model_is_named(inputs):
    proc = run_kit("run", "--arm", "native", "--workspace", str(inputs / "ws"), "--allow-dirty",
                   "--checkpoint", str(inputs / "ckpt"))
    assert proc.returncode == 2
    assert "--model DIR" in proc.stderr and "Traceback" not in proc.stderr
    assert not (inputs / "ws" / "runs").exists()


def test_prompt_data_defaults_to_the_prepared_workspace_and_mounts_read_only(inputs):
    arm = Catalog.default().arm("native")
    request = RunRequest(arm=arm, workspace=inputs / "ws", runtime="docker", model=inputs / "model",
                         checkpoint=inputs / "ckpt")
    files = vime_input_files(request)
    assert files["prompt_data"] == (inputs / "ws" / "data" / "dapo-math-17k.jsonl").resolve()
    mounts = input_mounts(files)
    assert mounts[str(files["model"])] == "/inputs/model"
    assert mounts[str(files["checkpoint"])] == "/inputs/torch_dist"
    assert mounts[str(files["prompt_data"])] == "/inputs/data/dapo-math-17k.jsonl"
    # the train command reads exactly those in-image paths
    plan = json.loads(run_kit("plan", "--arm", "native", "--json").stdout)
    argv = plan["command"]["argv"]
    assert argv[argv.index("--hf-checkpoint") + 1] == "/inputs/model"
    assert argv[argv.index("--ref-load") + 1] == "/inputs/torch_dist"
    assert argv[argv.index("--prompt-data") + 1] == "/inputs/data/dapo-math-17k.jsonl"
    (inputs / "ws" / "data" / "dapo-math-17k.jsonl").unlink()
    with pytest.raises(BadInput, match="--prompt-data FILE"):
        vime_input_files(request)


def test_dry_run_shows_the_mounts(inputs):
    proc = run_kit("run", "--arm", "G10", "--dry-run", "--json", "--workspace", str(inputs / "ws"),
                   "--model", str(inputs / "model"), "--checkpoint", str(inputs / "ckpt"))
    assert proc.returncode == 0, proc.stderr
    preview = json.loads(proc.stdout)["manifest_preview"]
    assert sorted(preview["input_mounts"].values()) == ["/inputs/data/dapo-math-17k.jsonl", "/inputs/model", "/inputs/torch_dist"]
    assert not (inputs / "ws" / "runs").exists()


def _converted_checkpoint(ws_root, arm, model_tree: str):
    """A torch_dist checkpoint and its provenance, as kit prepare --convert-checkpoint leaves them."""
    import os

    from kit.model.documents import write_new_document
    from kit.inputs.files import hash_tree, tree_sha256
    from kit.inputs.prepare import Workspace

    ws = Workspace(ws_root)
    ckpt = ws.checkpoint_dir(arm.stack.sha256, model_tree)
    (ckpt / "iter_0000001").mkdir(parents=True)
    (ckpt / "iter_0000001" / "__0_0.distcp").write_bytes(os.urandom(64))
    files = hash_tree(ckpt)
    write_new_document(ws.checkpoint_provenance(ckpt), {
        "schema": "rlk-kit/provenance/v1", "kind": "checkpoint", "created_at": "2026-01-01T00:00:00Z",
        "kit_version": "0.1.0", "arm": arm.name, "stack": {"name": arm.stack.name, "sha256": arm.stack.sha256},
        "image": {"ref": "rlk-kit/vime-current:cuda-0123456789ab", "id": "sha256:" + "1" * 64}, "platform": "cuda",
        "model_tree_sha256": model_tree, "command": ["bash", "-lc", "true"],
        "output": ckpt.relative_to(ws_root).as_posix(), "files": files, "tree_sha256": tree_sha256(files)})
    return ckpt


def test_model_and_checkpoint_default_to_what_kit_prepare_recorded_for_the_stack(tmp_path):
    """After kit prepare --model M --convert-checkpoint --arm A, kit run --arm A needs no input flags."""
    from fixtures_prepare import make_model
    from kit.inputs.prepare import Workspace, prepare_model

    arm = Catalog.default().arm("native")
    ws_root = tmp_path / "ws"
    model = make_model(tmp_path / "Qwen3-tiny")
    model_tree = prepare_model(ws_root, model).document["tree_sha256"]
    ws = Workspace(ws_root)
    ckpt = _converted_checkpoint(ws_root, arm, model_tree)
    ws.data.parent.mkdir(parents=True, exist_ok=True)
    ws.data.write_text('{"prompt":[]}\n')

    files = vime_input_files(RunRequest(arm=arm, workspace=ws_root, runtime="docker"))
    assert files["checkpoint"] == ckpt.resolve() and files["model"] == model.resolve()
    # a flag still wins over the workspace
    other = tmp_path / "other-ckpt"
    other.mkdir()
    assert vime_input_files(RunRequest(arm=arm, workspace=ws_root, runtime="docker", checkpoint=other,
                                       model=model))["checkpoint"] == other.resolve()
    # ... and a checkpoint without a provenance says nothing of its model: the flag is asked for
    with pytest.raises(BadInput, match="--model DIR"):
        vime_input_files(RunRequest(arm=arm, workspace=ws_root, runtime="docker", checkpoint=other))
    # a checkpoint of another stack is not a default: the flag is asked for
    with pytest.raises(BadInput, match="--checkpoint DIR"):
        vime_input_files(RunRequest(arm=Catalog.default().arm("G10"), workspace=ws_root, runtime="docker",
                                    model=model))


def test_prompt_data_other_than_the_arms_pin_is_refused_before_anything_starts(inputs):
    proc = run_kit("run", "--arm", "native", "--workspace", str(inputs / "ws"), "--allow-dirty",
                   "--model", str(inputs / "model"), "--checkpoint", str(inputs / "ckpt"))
    assert proc.returncode == 1, proc.stderr
    assert "inputs.prompt_data_sha256" in proc.stderr and "dapo-math-17k.jsonl" in proc.stderr
    assert "Traceback" not in proc.stderr and not (inputs / "ws" / "runs").exists()


def test_hashing_an_input_tree_reports_progress_and_then_answers_from_the_cache(inputs):
    import io

    from kit.run.inputs import file_inputs

    cache = inputs / "ws" / "cache" / "hashes.json"
    first = io.StringIO()
    doc = file_inputs({"model": inputs / "model"}, cache, progress=first)
    assert doc["model"]["files"] == 1 and len(doc["model"]["sha256"]) == 64
    assert first.getvalue().startswith(f"hashing {inputs / 'model'}: 1/1 files"), first.getvalue()
    again = io.StringIO()
    assert file_inputs({"model": inputs / "model"}, cache, progress=again) == doc
    assert again.getvalue() == ""            # every hash from the cache: nothing to report


def test_a_default_never_pairs_a_checkpoint_with_another_model(tmp_path, inputs):
    """--model B alone does not take the checkpoint converted from model A; --checkpoint X alone takes X's model."""
    from fixtures_prepare import make_model
    from kit.inputs.prepare import Workspace, prepare_model

    arm = Catalog.default().arm("native")
    ws_root = inputs / "ws"
    model_a = make_model(tmp_path / "model-a")
    ckpt = _converted_checkpoint(ws_root, arm, prepare_model(ws_root, model_a).document["tree_sha256"])
    model_b = make_model(tmp_path / "model-b")
    (model_b / "extra.safetensors").write_bytes(b"other weights")
    with pytest.raises(BadInput, match="--checkpoint DIR"):
        vime_input_files(RunRequest(arm=arm, workspace=ws_root, runtime="docker", model=model_b))
    files = vime_input_files(RunRequest(arm=arm, workspace=ws_root, runtime="docker", checkpoint=ckpt))
    assert files["model"] == model_a.resolve()
    assert Workspace(ws_root).checkpoint_provenance(ckpt).is_file()


def test_a_model_other_than_the_arms_pin_is_refused_before_anything_starts(tmp_path, inputs):
    import hashlib

    from kit.inputs.files import hash_tree, tree_sha256
    from kit.run.inputs import check_pinned_inputs

    arm = Catalog.default().arm("native")
    data = inputs / "ws" / "data" / "dapo-math-17k.jsonl"
    pins = {"prompt_data_sha256": hashlib.sha256(data.read_bytes()).hexdigest(),
            "model_tree_sha256": tree_sha256(hash_tree(inputs / "model"))}
    pinned = Catalog.default().arm_from_document({**arm.document, "inputs": pins}, "pinned arm")
    files = {"model": inputs / "model", "checkpoint": inputs / "ckpt", "prompt_data": data}
    check_pinned_inputs(RunRequest(arm=pinned, workspace=inputs / "ws", runtime="docker"), files)   # both hold
    (inputs / "model" / "model.safetensors").write_bytes(b"v" * 64)
    with pytest.raises(CheckFailed, match="inputs.model_tree_sha256"):
        check_pinned_inputs(RunRequest(arm=pinned, workspace=inputs / "ws", runtime="docker"), files)
