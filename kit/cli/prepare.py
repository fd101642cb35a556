"""`kit prepare`: the prompt data, the hashed model and the torch_dist checkpoint, each with provenance."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kit.errors import BadInput


@click.command(name="prepare")
@click.option("--workspace", type=click.Path(file_okay=False, path_type=Path), envvar="KIT_WORKSPACE",
              help="Workspace directory (default: env KIT_WORKSPACE).")
@click.option("--dataset-source", metavar="PATH|URL", default=None,
              help="DAPO-Math-17k parquet: a local path or an http(s) URL (default: the published URL).")
@click.option("--no-dataset", is_flag=True, help="Skip the prompt data (only hash/convert the model).")
@click.option("--accept-new-hash", is_flag=True,
              help="Accept converted data whose sha256 differs from the published one; recorded in provenance.")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), metavar="PATH",
              help="Hugging Face checkpoint directory to hash file by file.")
@click.option("--convert-checkpoint", is_flag=True,
              help="Convert --model to torch_dist inside --arm's image with that stack's Megatron.")
@click.option("--arm", "arm_name", metavar="A", help="Arm whose image runs the conversion.")
@click.option("--platform", type=click.Choice(["cuda", "rocm"]), default="cuda", show_default=True,
              help="Image platform for --convert-checkpoint.")
@click.option("--json", "as_json", is_flag=True, help="Print the provenance documents as JSON; no progress bar.")
def command(workspace, dataset_source, no_dataset, accept_new_hash, model_dir, convert_checkpoint, arm_name,
            platform, as_json):
    """Convert DAPO-Math-17k to VIME prompt JSONL, hash the model, convert the checkpoint.

    The published source must convert to sha256 73e21665...509d; another hash is refused (exit 1)
    unless --accept-new-hash. Downloads resume from a .partial file and are checksum-verified.

    \b
    Examples:
      kit prepare --workspace /data/ws
      kit prepare --workspace /data/ws --dataset-source ./train-00000-of-00001.parquet
      kit prepare --workspace /data/ws --no-dataset --model /models/Qwen3-8B --convert-checkpoint --arm G10
    """
    from kit import prepare as prep

    if workspace is None:
        raise BadInput("--workspace: required (or set KIT_WORKSPACE)")
    if convert_checkpoint and not (model_dir and arm_name):
        raise BadInput("--convert-checkpoint: needs --model PATH (the Hugging Face checkpoint) and --arm A")
    if arm_name and not convert_checkpoint:
        raise BadInput("--arm: only used with --convert-checkpoint")
    if no_dataset and (dataset_source or accept_new_hash):
        raise BadInput("--no-dataset: cannot be combined with --dataset-source or --accept-new-hash")
    arm = None
    if convert_checkpoint:
        from kit.doctor import load_arm

        arm = load_arm(arm_name)  # unknown arm: BadInput before any work
    workspace.mkdir(parents=True, exist_ok=True)
    progress = None if as_json else sys.stderr
    done = []
    if not no_dataset:
        done.append(prep.prepare_dataset(workspace, source=dataset_source or prep.PUBLISHED_URL,
                                         accept_new_hash=accept_new_hash, progress=progress))
    if model_dir is not None:
        model = prep.prepare_model(workspace, model_dir)
        done.append(model)
        if convert_checkpoint:
            done.append(prep.convert_checkpoint(
                workspace, arm_name=arm.name, arm_document=arm.document, stack_document=arm.stack_document,
                stack_sha256=arm.stack_sha256, model=model, platform=platform, progress=progress))
    if as_json:
        click.echo(json.dumps({p.kind: {"path": str(p.path), "provenance": str(p.provenance_path),
                                        "reused": p.reused, "document": p.document} for p in done},
                              indent=2, sort_keys=True, ensure_ascii=False))
        return
    for p in done:
        doc = p.document
        verb = "unchanged" if p.reused else "prepared"
        if p.kind == "dataset":
            note = " (NEW HASH ACCEPTED)" if doc["accepted_new_hash"] else ""
            click.echo(f"{verb} {p.path}: {doc['rows_written']} of {doc['rows_read']} rows "
                       f"({doc['duplicates_removed']} duplicates), sha256 {doc['output_sha256']}{note}")
        elif p.kind == "model":
            click.echo(f"{verb} model {p.path}: {doc['file_count']} files, tree sha256 {doc['tree_sha256']}")
        else:
            click.echo(f"{verb} checkpoint {p.path}: tree sha256 {doc['tree_sha256']}")
        click.echo(f"  provenance: {p.provenance_path}")
