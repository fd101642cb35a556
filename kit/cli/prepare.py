"""`kit prepare`: the prompt data, the hashed model and the torch_dist checkpoint, each with provenance."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kit.cli._output import emit_json
from kit.model.errors import BadInput, CheckFailed
from kit.inputs import checkpoint
from kit.inputs import prepare as prep
from kit.cli.run import workspace_from
from kit.run.doctor import load_arm
from kit.inputs.files import hash_tree, tree_sha256


@click.command(name="prepare")
@click.option("--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="Workspace directory (default $KIT_WORKSPACE, else ./.workspace, where kit run reads the inputs).")
@click.option("--dataset-source", metavar="PATH|URL", default=None,
              help="DAPO-Math-17k parquet: a local path or an http(s) URL (default: the published URL).")
@click.option("--no-dataset", is_flag=True, help="Skip the prompt data (only hash/convert the model).")
@click.option("--accept-new-hash", is_flag=True,
              help="Accept converted data whose sha256 is not the published conversion's; recorded in the "
                   "provenance (accepted_new_hash: true) and warned about on stderr.")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), metavar="PATH",
              help="Hugging Face checkpoint directory to hash file by file.")
@click.option("--convert-checkpoint", is_flag=True,
              help="Convert --model to torch_dist inside --arm's image with that stack's Megatron "
                   "(needs a Docker engine: dockerd running or DOCKER_HOST set).")
@click.option("--arm", "arm_name", metavar="A",
              help="Arm whose input pins (inputs: dataset_sha256, prompt_data_sha256, model_tree_sha256) the "
                   "prepared inputs must meet, and whose image runs --convert-checkpoint.")
@click.option("--platform", type=click.Choice(["cuda", "rocm"]), default="cuda", show_default=True,
              help="Image platform for --convert-checkpoint.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one rlk-kit/prepare-result/v1 document (each product's path, provenance path, reuse and "
                   "provenance document); no progress on stderr.")
def command(workspace, dataset_source, no_dataset, accept_new_hash, model_dir, convert_checkpoint, arm_name,
            platform, as_json):
    """Convert DAPO-Math-17k to VIME prompt JSONL, hash the model, convert the checkpoint.

    \b
    Expected hash: every source (the published URL, a local copy, a mirror)
    is a DAPO-Math-17k parquet, so its JSONL must have the published sha256
    73e2166517fd635e1157aff17202f86a5cced44ca1669e6f49d2d63a59bf509d.
    Another hash is refused (exit 1; the data are kept only as
    data/dapo-math-17k.jsonl.rejected-<sha12>) unless --accept-new-hash,
    which the provenance records (accepted_new_hash: true) and which prints
    a warning on stderr. --json adds matches_published_output: true|false.

    \b
    Every input is checked before anything is written: the --model directory
    (exists, holds *.safetensors or *.bin), the --dataset-source (a readable
    parquet with the DAPO columns, or an http(s) URL), --arm and, with
    --convert-checkpoint, the Docker engine and the arm's image. A refused
    run (exit 2) writes no data, provenance or checkpoint; it may leave only
    caches: cache/hashes.json (sha256 per file, keyed by path, size and
    mtime) and downloads/*.partial (an interrupted download, resumed by the
    next run). Downloads are checked against the sha256 the server states
    (on a redirect too: the Hugging Face hub sends it on its 302), else only
    their size; downloads/<file>.download.json records which, and a reused
    download's provenance says the same (source_checksum).
    Hashing a model shows files and bytes hashed on stderr.

    \b
    Examples:
      kit prepare --workspace /data/ws
      kit prepare --workspace /data/ws --dataset-source ./train-00000-of-00001.parquet
      kit prepare --workspace /data/ws --no-dataset --model /models/Qwen3-8B --convert-checkpoint --arm G10
      kit prepare --workspace /data/ws --arm G11        # refused (exit 1) unless the data meet G11's pins
    """

    workspace = workspace_from(workspace)
    if convert_checkpoint and not (model_dir and arm_name):
        raise BadInput("--convert-checkpoint: needs --model PATH (the Hugging Face checkpoint) and --arm A")
    if no_dataset and model_dir is None:
        raise BadInput("--no-dataset: nothing left to prepare; add --model PATH, or drop --no-dataset")
    if no_dataset and (dataset_source or accept_new_hash):
        raise BadInput("--no-dataset: cannot be combined with --dataset-source or --accept-new-hash")

    # Every input is checked before anything is written (hashing the model only fills the hash cache).
    source = dataset_source or prep.PUBLISHED_URL
    arm = image = None
    if arm_name:
        arm = load_arm(arm_name)  # unknown arm: BadInput naming --arm
    pins = (arm.document.get("inputs") or {}) if arm else {}
    if convert_checkpoint:
        checkpoint.check_conversion_request(arm.name, arm.document, arm.stack_document, platform)
    if model_dir is not None:
        prep.check_model_dir(model_dir)
    if not no_dataset:
        prep.check_dataset_source(source)
    progress = None if as_json else sys.stderr
    if model_dir is not None and (convert_checkpoint or "model_tree_sha256" in pins):
        ws = prep.Workspace(workspace)
        model_tree = tree_sha256(hash_tree(model_dir, ws.hash_cache, progress=progress))
        if model_tree != pins.get("model_tree_sha256", model_tree):
            raise CheckFailed(f"--model {model_dir}: tree sha256 {model_tree} is not the {pins['model_tree_sha256']} "
                              f"arm {arm.name} pins (inputs.model_tree_sha256); nothing was written")
    if convert_checkpoint:
        converted = ws.checkpoint_dir(arm.stack_sha256, model_tree)
        if not (converted.exists() and ws.checkpoint_provenance(converted).exists()):
            image = checkpoint.find_conversion_image(arm.name, arm.document, arm.stack_document, arm.stack_sha256,
                                               platform)

    workspace.mkdir(parents=True, exist_ok=True)
    done = []
    if not no_dataset:
        done.append(prep.prepare_dataset(workspace, source=source, accept_new_hash=accept_new_hash,
                                         progress=progress, pins=pins))
    if model_dir is not None:
        model = prep.prepare_model(workspace, model_dir, progress=progress)
        done.append(model)
        if convert_checkpoint:
            done.append(checkpoint.convert_checkpoint(
                workspace, arm_name=arm.name, arm_document=arm.document, stack_document=arm.stack_document,
                stack_sha256=arm.stack_sha256, model=model, platform=platform, progress=progress, image=image))
    for p in done:
        if p.kind == "dataset" and not prep.matches_published_output(p.document):
            why = ("accepted with --accept-new-hash, as its provenance records" if p.document["accepted_new_hash"]
                   else "its provenance records no --accept-new-hash; kit doctor will FAIL it")
            click.echo(f"kit: warning: {p.path} (sha256 {p.document['output_sha256']}) is NOT the published "
                       f"DAPO-Math-17k conversion ({prep.PUBLISHED_OUTPUT_SHA256}); {why}", err=True)
    if as_json:
        emit_json(prep.result_document(workspace, done))
        return
    for p in done:
        doc = p.document
        verb = "unchanged" if p.reused else "prepared"
        if p.kind == "dataset":
            note = (" (the published DAPO-Math-17k conversion)" if prep.matches_published_output(doc)
                    else " (NOT the published conversion; NEW HASH ACCEPTED)")
            click.echo(f"{verb} {p.path}: {doc['rows_written']} of {doc['rows_read']} rows "
                       f"({doc['duplicates_removed']} duplicates), sha256 {doc['output_sha256']}{note}")
        elif p.kind == "model":
            click.echo(f"{verb} model {p.path}: {doc['file_count']} files, tree sha256 {doc['tree_sha256']}")
        else:
            click.echo(f"{verb} checkpoint {p.path}: tree sha256 {doc['tree_sha256']}")
        click.echo(f"  provenance: {p.provenance_path}")
