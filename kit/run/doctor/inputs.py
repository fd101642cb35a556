"""Doctor's workspace-input rules: the prompt data, the converted checkpoint and the model an arm reads,
judged against what ``kit prepare`` recorded and what the arm pins. Example::

    check_prompt_data(Context(arm=load_arm("G10"), workspace=Path("ws"))).line()   # 'PASS inputs.prompt_data: …'
"""


from __future__ import annotations

from pathlib import Path

from kit.model.engine_traits import traits
from kit.model.errors import BadInput
from kit.inputs.files import HashCache, hash_file_cached, hash_tree, tree_sha256
from kit.inputs.checkpoint import select_checkpoint as select
from kit.inputs.prepare import PUBLISHED_OUTPUT_SHA256, Workspace, read_provenance
from kit.run.doctor.context import FAIL, PASS, SKIP, ArmSpec, Check, Context




# --- workspace inputs -----------------------------------------------------------------------------

def _workspace_input_guard(ctx: Context, name: str, needed: str, builtin: str) -> Check | None:
    """SKIP without an arm or on the smoke engine (built-in inputs), FAIL without a workspace.

    ``_workspace_input_guard(ctx, "inputs.checkpoint", "a checkpoint is", "model")``
    """
    if ctx.arm is None:
        return Check(name, SKIP, f"no --arm: whether {needed} needed depends on the arm")
    if not traits(ctx.arm.engine).uses_input_files:
        return Check(name, SKIP, f"arm {ctx.arm.name} uses the {ctx.arm.engine} engine's built-in {builtin}")
    if ctx.workspace is None:
        return Check(name, FAIL, "no workspace: pass --workspace or set KIT_WORKSPACE")
    return None


def arm_input_pin(arm: ArmSpec | None, field: str) -> str | None:
    """The hash the arm's lock pins for one input (its ``inputs`` object), None when it pins none."""
    return ((arm.document.get("inputs") or {}).get(field)) if arm is not None else None


def check_prompt_data(ctx: Context) -> Check:
    name = "inputs.prompt_data"
    skipped = _workspace_input_guard(ctx, name, "prompt data are", "prompts")
    if skipped:
        return skipped

    ws = Workspace(ctx.workspace)
    if not ws.data_provenance.exists() or not ws.data.exists():
        return Check(name, FAIL, f"{ws.data} or its provenance is missing; run kit prepare --workspace {ws.root}")
    try:
        doc = read_provenance(ws.data_provenance, "dataset")
        cache = HashCache(ws.hash_cache)
        actual = hash_file_cached(ws.data, cache)
        cache.save()
    except BadInput as exc:
        return Check(name, FAIL, str(exc))
    details = {"path": str(ws.data), "sha256": actual, "provenance": str(ws.data_provenance)}
    if actual != doc["output_sha256"]:
        return Check(name, FAIL, f"{ws.data} has sha256 {actual}, its provenance says {doc['output_sha256']}: "
                     "changed after kit prepare", details)
    source_pin = arm_input_pin(ctx.arm, "dataset_sha256")
    if source_pin is not None and doc["source_sha256"] != source_pin:
        return Check(name, FAIL, f"{ws.data.name} was converted from {doc['source']} of sha256 {doc['source_sha256']} "
                     f"({ws.data_provenance.name}), not the parquet {source_pin} arm {ctx.arm.name} pins "
                     "(inputs.dataset_sha256); prepare the data from the pinned parquet", details)
    pin = arm_input_pin(ctx.arm, "prompt_data_sha256")
    if pin is not None:   # the lock decides, whatever kit prepare accepted
        if actual == pin:
            return Check(name, PASS, f"{ws.data.name} sha256 {actual[:12]}... as arm {ctx.arm.name} pins "
                         "(inputs.prompt_data_sha256)", details)
        return Check(name, FAIL, f"{ws.data.name} sha256 {actual} is not the {pin} arm {ctx.arm.name} pins "
                     f"(inputs.prompt_data_sha256); prepare the data from the published source", details)
    if actual == PUBLISHED_OUTPUT_SHA256:
        return Check(name, PASS, f"{ws.data.name} sha256 {actual[:12]}... equals the published DAPO-Math-17k "
                     "conversion", details)
    if doc.get("accepted_new_hash"):
        return Check(name, PASS, f"{ws.data.name} sha256 {actual[:12]}... is NOT the published "
                     f"{PUBLISHED_OUTPUT_SHA256[:12]}...; accepted with --accept-new-hash at prepare time "
                     "(recorded in its provenance)", details)
    return Check(name, FAIL, f"{ws.data.name} sha256 {actual} from {doc['source']} differs from the published "
                 f"{PUBLISHED_OUTPUT_SHA256} that vime arms expect; prepare from the published source or pass "
                 "--accept-new-hash to kit prepare", details)


def _input_workspace(ctx: Context, name: str, needed: str, builtin: str) -> Check | Workspace:
    """The workspace an input check reads, or the SKIP/FAIL that says why it cannot (see the guard)."""
    return _workspace_input_guard(ctx, name, needed, builtin) or Workspace(ctx.workspace)


def select_checkpoint(ws, arm: ArmSpec, platform: str | None = None) -> tuple[Path | None, dict | None, str]:
    """The converted checkpoint this arm would use (:func:`kit.prepare.select_checkpoint`)."""

    return select(ws, arm.stack_name, arm.stack_sha256, platform)


def check_checkpoint(ctx: Context) -> Check:
    name, arm = "inputs.checkpoint", ctx.arm
    ws = _input_workspace(ctx, name, "a checkpoint is", "model")
    if isinstance(ws, Check):
        return ws
    where, doc, note = select_checkpoint(ws, arm, ctx.platform)
    if doc is None:
        return Check(name, FAIL, f"no torch_dist checkpoint converted with stack {arm.stack_name} "
                     f"({arm.stack_sha256[:12]}) in {ws.root / 'checkpoints'}; run kit prepare --workspace "
                     f"{ws.root} --model PATH --convert-checkpoint --arm {arm.name}")
    try:
        actual = tree_sha256(hash_tree(ws.root / doc["output"], ws.hash_cache, progress=ctx.progress))
    except BadInput as exc:
        return Check(name, FAIL, str(exc), {"provenance": str(where)})
    if actual != doc["tree_sha256"]:
        return Check(name, FAIL, f"{doc['output']} tree sha256 {actual} differs from its provenance "
                     f"{doc['tree_sha256']}", {"provenance": str(where)})
    return Check(name, PASS, f"{doc['output']} tree sha256 {actual[:12]}... as converted "
                 f"(model {doc['model_tree_sha256'][:12]}...){note}", {"provenance": str(where)})


def select_model(ws, arm: ArmSpec, platform: str | None = None) -> tuple[list[tuple[Path, dict]], str]:
    """The model provenance(s) the arm's inputs name, and how they were chosen.

    The model is the one the arm's checkpoint (:func:`select_checkpoint`) was converted from; without
    such a checkpoint, every model provenance of the workspace (usually one) is checked.
    """

    _, checkpoint, _ = select_checkpoint(ws, arm, platform)
    if checkpoint is not None:
        path = ws.model_provenance(checkpoint["model_tree_sha256"])
        return [(path, read_provenance(path, "model"))] if path.exists() else [], (
            f"the model of checkpoint {checkpoint['output']}")
    found = []
    for path in sorted(ws.provenance_dir.glob("model-*.json")):
        found.append((path, read_provenance(path, "model")))
    return found, "no checkpoint of this stack names one; every hashed model of the workspace"


def compare_model_files(recorded: dict[str, str], observed: dict[str, str]) -> list[str]:
    """Per-file differences between a model provenance and a re-hash, one line each, sorted."""
    out = [f"{n}: missing" for n in sorted(set(recorded) - set(observed))]
    out += [f"{n}: not in the provenance" for n in sorted(set(observed) - set(recorded))]
    out += [f"{n}: sha256 {observed[n][:12]}... differs from {recorded[n][:12]}..."
            for n in sorted(set(recorded) & set(observed)) if recorded[n] != observed[n]]
    return sorted(out)


def check_model(ctx: Context) -> Check:
    """Re-hash the Hugging Face model the workspace's provenance names (per file, cached) and compare."""
    name, arm = "inputs.model", ctx.arm
    ws = _input_workspace(ctx, name, "a Hugging Face model is", "model")
    if isinstance(ws, Check):
        return ws
    try:
        models, chosen = select_model(ws, arm, ctx.platform)
    except BadInput as exc:
        return Check(name, FAIL, str(exc))
    if not models:
        return Check(name, FAIL, f"no hashed Hugging Face model in {ws.provenance_dir} ({chosen}); run kit prepare "
                     f"--workspace {ws.root} --no-dataset --model PATH")
    passed = []
    for where, doc in models:
        model_dir = Path(doc["path"])
        details = {"provenance": str(where), "path": str(model_dir)}
        if not model_dir.is_dir():
            return Check(name, FAIL, f"{model_dir} (hashed in {where.name}) is gone", details)
        try:
            observed = hash_tree(model_dir, ws.hash_cache, progress=ctx.progress)
        except BadInput as exc:
            return Check(name, FAIL, str(exc), details)
        differences = compare_model_files(doc["files"], observed)
        if differences:
            shown = "; ".join(differences[:4]) + (f" and {len(differences) - 4} more" if len(differences) > 4 else "")
            return Check(name, FAIL, f"{model_dir} changed since kit prepare hashed it ({where.name}): {shown}",
                         {**details, "differences": differences})
        passed.append((model_dir, tree_sha256(observed)))
    pin = arm_input_pin(arm, "model_tree_sha256")
    if pin is not None and all(tree != pin for _, tree in passed):
        shown = ", ".join(f"{d} tree sha256 {t}" for d, t in passed)
        return Check(name, FAIL, f"{shown}: not the {pin} arm {arm.name} pins (inputs.model_tree_sha256)",
                     {"provenance": [str(w) for w, _ in models]})
    shown = ", ".join(f"{d} tree sha256 {t[:12]}..." for d, t in passed)
    return Check(name, PASS, f"{shown}: every file hashes as recorded ({chosen})",
                 {"provenance": [str(w) for w, _ in models]})


