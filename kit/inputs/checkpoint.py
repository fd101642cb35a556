"""The checkpoint step of ``kit prepare``: the Hugging Face model converted to Megatron torch_dist inside
the arm's image, recorded with its command and output tree hash, and the choice of a converted
checkpoint for a stack (kit run's default, doctor's check). Example::

    convert_checkpoint(ws, arm_name="G10", arm_document=doc, stack_document=stack, stack_sha256=sha, model=model)
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import TextIO

from kit import __version__
from kit.adapters import docker as dockerdoor
from kit.build import layout as image_layout
from kit.build.lookup import find_stack_image
from kit.inputs.files import hash_tree, list_tree, tree_sha256
from kit.inputs.parquet import _first_line
from kit.inputs.prepare import PROVENANCE_SCHEMA, Prepared, _now, read_provenance
from kit.model.documents import write_new_document
from kit.model.engine_traits import TRAITS
from kit.model.errors import BadInput, CheckFailed
from kit.model.workspace import Workspace

# --- the checkpoint step ---------------------------------------------------------------------------

MODEL_ARGS_SCRIPT = "scripts/models/qwen3-8B.sh"
CONVERTER = "tools/convert_hf_to_torch_dist.py"


def stack_source_names(stack_document: dict) -> tuple[str, str]:
    """The names of the stack's VIME and Megatron sources, whose checkouts the converter runs from."""
    names = [s["name"] for s in stack_document.get("sources", [])]
    vime = next((n for n in names if n == "vime"), None)
    megatron = next((n for n in names if n.startswith("megatron")), None)
    if not vime or not megatron:
        raise BadInput(f"stack {stack_document.get('name')}: the checkpoint converter needs a 'vime' and a "
                       f"'megatron*' source; it has {', '.join(names) or 'none'}")
    return vime, megatron


def conversion_command(stack_document: dict, output_dir: str) -> list[str]:
    """The in-image HF -> torch_dist command (reference §8.3 prepare step 4) with in-image paths.

    ``output_dir`` is a path inside the container (under ``/workspace``); the model is read-only at
    ``/inputs/model``. Example result::

        ["bash", "-lc", "set -euo pipefail; source /opt/rlk/src/vime/scripts/models/qwen3-8B.sh; "
         "PYTHONPATH=/opt/rlk/src/megatron /opt/rlk/venv/bin/python "
         "/opt/rlk/src/vime/tools/convert_hf_to_torch_dist.py \\"${MODEL_ARGS[@]}\\" "
         "--hf-checkpoint /inputs/model --save /workspace/checkpoints/.torch_dist-...partial"]
    """
    vime, megatron = stack_source_names(stack_document)
    vime_dir = image_layout.source_dir(vime)
    script = (
        "set -euo pipefail; "
        f"source {shlex.quote(f'{vime_dir}/{MODEL_ARGS_SCRIPT}')}; "
        f"PYTHONPATH={shlex.quote(image_layout.source_dir(megatron))} {shlex.quote(image_layout.PYTHON)} "
        f"{shlex.quote(f'{vime_dir}/{CONVERTER}')} \"${{MODEL_ARGS[@]}}\" "
        f"--hf-checkpoint {shlex.quote(image_layout.MODEL_DIR)} --save {shlex.quote(output_dir)}"
    )
    return ["bash", "-lc", script]


def check_conversion_request(arm_name: str, arm_document: dict, stack_document: dict, platform: str) -> None:
    """BadInput naming the flag when the arm is not a vime arm, the platform is not a GPU one or the
    stack lacks the converter's sources. Reads nothing."""
    engine = TRAITS.get(arm_document.get("engine"))
    if engine is None or not engine.uses_input_files:
        raise BadInput(f"--arm {arm_name}: engine {arm_document.get('engine')!r} uses no Megatron checkpoint; "
                       "--convert-checkpoint needs a vime arm")
    if platform not in ("cuda", "rocm"):
        raise BadInput(f"--platform {platform}: the converter runs on cuda or rocm")
    stack_source_names(stack_document)


def find_conversion_image(arm_name: str, arm_document: dict, stack_document: dict, stack_sha256: str,
                          platform: str = "cuda"):
    """The arm's image for the in-image conversion, after every read-only check of the request.

    BadInput (exit 2) naming the flag when the request is unusable (:func:`check_conversion_request`),
    no Docker engine answers (naming --convert-checkpoint, dockerd and DOCKER_HOST), or the image is
    not built (naming the ``kit build`` command that makes it).
    """
    check_conversion_request(arm_name, arm_document, stack_document, platform)
    stack_name = stack_document.get("name", arm_document["stack"]["name"])

    try:
        client = dockerdoor.engine()
    except BadInput as exc:  # names dockerd and DOCKER_HOST
        raise BadInput(f"--convert-checkpoint: {exc}; the conversion runs inside the arm's image") from None
    try:
        image = find_stack_image(stack_name, stack_sha256, platform, client)
    except dockerdoor.EngineError as exc:
        raise BadInput(f"--convert-checkpoint: the Docker engine cannot list images ({_first_line(exc)[:200]})") from None
    if image is None:
        raise BadInput(f"image not built: no rlk-kit/{stack_name}:{platform}-* image for stack {stack_name} "
                       f"(sha256 {stack_sha256}) on the Docker engine; run kit build {platform} --arm {arm_name}")
    return image


def convert_checkpoint(
    workspace: Path,
    *,
    arm_name: str,
    arm_document: dict,
    stack_document: dict,
    stack_sha256: str,
    model: Prepared,
    platform: str = "cuda",
    progress: TextIO | None = None,
    image=None,
) -> Prepared:
    """Run the converter inside the arm's image (docker-py) and record command and output tree hash.

    ``image`` is the one :func:`find_conversion_image` found; without it the lookup happens here.
    Refuses with BadInput (exit 2) when no engine answers or the arm's image is not on the engine,
    naming the expected image and the ``kit build`` command that makes it.
    """
    stack_name = stack_document.get("name", arm_document["stack"]["name"])
    ws = Workspace(Path(workspace))
    final = ws.checkpoint_dir(stack_sha256, model.document["tree_sha256"])
    record = ws.checkpoint_provenance(final)
    if final.exists() and record.exists():
        return Prepared("checkpoint", final, record, read_provenance(record, "checkpoint"), reused=True)
    if final.exists():
        raise BadInput(f"{final}: exists without its provenance; remove it and run again")
    if image is None:
        image = find_conversion_image(arm_name, arm_document, stack_document, stack_sha256, platform)

    partial = final.with_name(f".{final.name}.partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.parent.mkdir(parents=True, exist_ok=True)
    in_image = f"{image_layout.WORKSPACE}/{partial.relative_to(ws.root).as_posix()}"
    command = conversion_command(stack_document, in_image)
    try:
        _run_in_image(image, command, ws.root, Path(model.document["path"]), platform, progress)
        if not partial.is_dir() or not list_tree(partial):
            raise CheckFailed(f"checkpoint conversion in {image.tags[0] if image.tags else image.id} wrote "
                              f"nothing to {partial}")
        os.rename(partial, final)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
    files = hash_tree(final, ws.hash_cache)
    doc = {
        "schema": PROVENANCE_SCHEMA,
        "kind": "checkpoint",
        "created_at": _now(),
        "kit_version": __version__,
        "arm": arm_name,
        "stack": {"name": stack_name, "sha256": stack_sha256},
        "image": {"ref": image.tags[0] if image.tags else None, "id": image.id},
        "platform": platform,
        "model_tree_sha256": model.document["tree_sha256"],
        "command": command,
        "output": final.relative_to(ws.root).as_posix(),
        "files": files,
        "tree_sha256": tree_sha256(files),
    }
    write_new_document(record, doc)
    return Prepared("checkpoint", final, record, doc, reused=False)


def _run_in_image(image, command: list[str], workspace: Path, model_dir: Path, platform: str, progress) -> None:
    # the same container options as a run's container (GPUs, the host's IPC namespace, ulimits)
    container = dockerdoor.client().containers.run(
        image.id, command, detach=True, working_dir=image_layout.WORKSPACE,
        volumes={str(model_dir.resolve()): {"bind": image_layout.MODEL_DIR, "mode": "ro"},
                 str(workspace.resolve()): {"bind": image_layout.WORKSPACE, "mode": "rw"}},
        **dockerdoor.container_options(platform))
    tail: list[str] = []
    try:
        for chunk in container.logs(stream=True, follow=True):
            text = chunk.decode("utf-8", "replace")
            tail = (tail + text.splitlines())[-20:]
            if progress is not None:
                progress.write(text)
        status = container.wait().get("StatusCode", 1)
    finally:
        container.remove(force=True)
    if status != 0:
        raise CheckFailed(f"checkpoint conversion exited with {status}; last lines:\n" + "\n".join(tail))


def select_checkpoint(ws, stack_name: str, stack_sha256: str,
                      platform: str | None = None) -> tuple[Path | None, dict | None, str]:
    """The converted checkpoint an arm of this stack uses (kit run's default, doctor's check):
    ``(provenance path, document, how it was chosen)``.

    Only checkpoints whose provenance names the arm's full stack sha256 qualify (the directory name
    holds only 12 hex digits of it). Among several (other models, other platforms), the one of the
    host's platform is preferred, then the most recently converted; the note says so. A provenance
    that does not read is skipped here; ``(None, None, note)`` when none qualifies.
    """
    candidates = []
    for path in sorted((ws.root / "checkpoints").glob("*.provenance.json")):
        try:
            doc = read_provenance(path, "checkpoint")
        except BadInput:
            continue
        if doc["stack"]["sha256"] == stack_sha256:
            candidates.append((path, doc))
    if not candidates:
        return None, None, "none converted with this stack"
    if platform is not None and any(d["platform"] == platform for _, d in candidates):
        candidates = [(p, d) for p, d in candidates if d["platform"] == platform]
    candidates.sort(key=lambda pd: (pd[1]["created_at"], pd[0].name))
    path, doc = candidates[-1]
    note = "" if len(candidates) == 1 else (f"; the newest of {len(candidates)} checkpoints of stack "
                                            f"{stack_name} for {doc['platform']}")
    return path, doc, note
