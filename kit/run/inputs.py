"""A run's inputs: which files a VIME arm reads (flags or what ``kit prepare`` left in the workspace),
their pinned hashes, how they are mounted into the container, and the hashes the manifest records.

Example::

    files = vime_input_files(request)      # {"model": Path, "checkpoint": Path, "prompt_data": Path}
    input_mounts(files)[str(files["model"])]    # '/opt/rlk/model' (read-only)
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from kit.build import layout as L
from kit.inputs.files import HashCache, hash_file_cached, hash_tree, tree_sha256
from kit.inputs.checkpoint import select_checkpoint
from kit.inputs.prepare import read_provenance
from kit.model.errors import BadInput, CheckFailed
from kit.model.workspace import Workspace
from kit.run.request import RunRequest


def file_inputs(paths: dict[str, Path | None], cache: Path, progress: TextIO | None = None) -> dict:
    """sha256 of prompt data / model / checkpoint files or trees, cached by path, size and mtime;
    a tree's hashing is reported on ``progress`` (a 16 GiB model takes minutes the first time)."""

    out = {}
    for name, path in paths.items():
        if path is None:
            out[name] = None
        elif Path(path).is_dir():
            files = hash_tree(path, cache, progress=progress)
            out[name] = {"path": str(path), "sha256": tree_sha256(files), "files": len(files)}
        else:
            c = HashCache(cache)
            out[name] = {"path": str(path), "sha256": hash_file_cached(path, c)}
            c.save()
    return out


def vime_input_files(request: RunRequest) -> dict[str, Path]:
    """The files a VIME arm reads, from the flags or the workspace that ``kit prepare`` filled; each must
    exist. Every missing one is named in one BadInput, one line each: a site fixes them in one go."""
    found, missing = find_input_files(request)
    if missing:
        raise BadInput("\n".join(missing.values()))
    return found


def find_input_files(request: RunRequest) -> tuple[dict[str, Path], dict[str, str]]:
    """(the input files found: name -> resolved path, the missing ones: name -> what to give)."""
    ws = Workspace(request.workspace)
    # Without flags: the checkpoint kit prepare --convert-checkpoint made with this arm's stack, and
    # the model it was converted from, as the workspace's provenance records them. A default never
    # pairs a checkpoint with a model it was not converted from.
    checkpoint, model = request.checkpoint, request.model

    def model_of(checkpoint_record: dict) -> str | None:
        record = ws.model_provenance(checkpoint_record["model_tree_sha256"])
        return read_provenance(record, "model")["path"] if record.is_file() else None

    if checkpoint is None:
        arm = request.arm
        _, converted, _ = select_checkpoint(ws, arm.stack.name, arm.stack.sha256, arm.platform)
        if converted is not None and (model is None or _same_path(model_of(converted), model)):
            checkpoint = ws.root / converted["output"]
            model = model or model_of(converted)
    elif model is None and ws.checkpoint_provenance(Path(checkpoint)).is_file():
        model = model_of(read_provenance(ws.checkpoint_provenance(Path(checkpoint)), "checkpoint"))
    given = {"model": (model, "--model DIR (the Hugging Face checkpoint; default: the one the workspace's "
                              "converted checkpoint came from)"),
             "checkpoint": (checkpoint, "--checkpoint DIR (default: the torch_dist checkpoint kit prepare "
                                        "--convert-checkpoint wrote for this stack)"),
             "prompt_data": (request.prompt_data or ws.data, f"--prompt-data FILE (default {ws.data}, written by kit prepare)")}
    found, missing = {}, {}
    for name, (path, flag) in given.items():
        if path is None:
            missing[name] = f"arm {request.arm.name} reads {name.replace('_', ' ')}: give {flag}"
        elif not Path(path).exists():
            missing[name] = f"{path}: not found; give {flag}"
        else:
            found[name] = Path(path).resolve()
    return found, missing


def _same_path(a: str | Path | None, b: str | Path) -> bool:
    return a is not None and Path(a).resolve() == Path(b).resolve()


def check_pinned_inputs(request: RunRequest, files: dict[str, Path], progress: TextIO | None = None) -> None:
    """CheckFailed, before any run dir exists, when the arm pins an input hash (``inputs``) that its
    file does not have: the prompt data's sha256, the model's tree sha256."""
    pins = request.arm.document.get("inputs") or {}
    if not pins:
        return
    cache_path = Workspace(request.workspace).hash_cache
    found = {}
    if "prompt_data_sha256" in pins:
        cache = HashCache(cache_path)
        found["prompt_data_sha256"] = (files["prompt_data"], hash_file_cached(files["prompt_data"], cache),
                                       "--prompt-data FILE")
        cache.save()
    if "model_tree_sha256" in pins:   # cached per file: the manifest's hashing later answers from it
        found["model_tree_sha256"] = (files["model"], tree_sha256(hash_tree(files["model"], cache_path,
                                                                             progress=progress)), "--model DIR")
    if "dataset_sha256" in pins:   # the parquet is not read by the run: its hash is the data's provenance's
        ws = Workspace(request.workspace)
        if not _same_path(files["prompt_data"], ws.data) or not ws.data_provenance.is_file():
            raise CheckFailed(f"{files['prompt_data']}: arm {request.arm.name} pins the parquet its prompt data come "
                              f"from (inputs.dataset_sha256 {pins['dataset_sha256']}), and only the workspace's "
                              f"{ws.data} has a provenance saying which; prepare it with kit prepare --arm "
                              f"{request.arm.name}")
        source = read_provenance(ws.data_provenance, "dataset")
        found["dataset_sha256"] = (ws.data_provenance, source["source_sha256"], "the data kit prepare --arm makes")
    for field, (path, actual, flag) in found.items():
        if actual != pins[field]:
            raise CheckFailed(f"{path}: sha256 {actual} is not the {pins[field]} arm {request.arm.name} pins "
                              f"(inputs.{field}); prepare it with kit prepare, or give {flag} with that hash")


def input_mounts(files: dict[str, Path]) -> dict[str, str]:
    """Host path -> in-image path, all read-only (kit/build/layout.py)."""

    mounts = {str(files["model"]): L.MODEL_DIR, str(files["checkpoint"]): L.CHECKPOINT_DIR}
    mounts[str(files["prompt_data"])] = f"{L.DATA_DIR}/dapo-math-17k.jsonl"
    return mounts
