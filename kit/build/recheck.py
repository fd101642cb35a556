"""`kit build --check-reproducible`: build the same inputs a second time, elsewhere, and compare.

The second build runs in a scratch workspace (no cache, another umask and time zone) and the two
images are compared layer by layer; a difference names the first differing layer and its first
differing files. Example::

    first = build_image(plan_build(stack, "cpu", workspace=ws), workspace=ws)
    report = check_reproducible(lambda w: plan_build(stack, "cpu", workspace=w), first, workspace=ws, client=engine())
    report["same"], report["difference"]
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from kit.build.images import build_image
from kit.build.plan import CONTEXT_MTIME
from kit.build.reproduce import NormalizedImage, _save_normalized, base_layers, layer_differences

CHECK_UMASK, CHECK_TZ = 0o027, "Pacific/Chatham"   # far from any default, so a dependence shows


def check_reproducible(make_plan, first, *, workspace: Path, client, nocache: bool = True, progress=None) -> dict:
    """Build again from ``make_plan(scratch_workspace)`` and compare with ``first`` (a BuildResult).

    The scratch workspace is fresh (sources re-exported; wheels hard-linked from ``workspace``, they
    are checked by sha256), the process runs with another umask and TZ, and the engine's cache is
    not used (``nocache``). Returns ``{"same", "second_image_id", "umask", "tz", "difference"}``.
    """
    scratch = Path(tempfile.mkdtemp(prefix="repro-", dir=_mkdir(workspace / "tmp")))
    if (workspace / "wheelhouse").is_dir():
        shutil.copytree(workspace / "wheelhouse", scratch / "wheelhouse", copy_function=os.link)
    old_umask, old_tz = os.umask(CHECK_UMASK), os.environ.get("TZ")
    os.environ["TZ"] = CHECK_TZ
    time.tzset()
    check_tag = first.tag + "-check"
    second = None
    try:
        plan = make_plan(scratch)
        # The arm is a parameter of the provenance (its label is in the config): the same as the first's.
        second = build_image(plan, workspace=scratch, client=client, nocache=nocache, progress=progress,
                             arm=first.record.get("arm"), load_tag=check_tag, keep_layers=True, write_record=False)
    finally:
        os.umask(old_umask)
        os.environ.pop("TZ") if old_tz is None else os.environ.__setitem__("TZ", old_tz)
        time.tzset()
    try:
        report = {"same": second.image_id == first.image_id, "second_image_id": second.image_id,
                  "umask": f"{CHECK_UMASK:04o}", "tz": CHECK_TZ, "difference": None}
        if not report["same"]:
            mine = first.normalized
            if mine is None or not all(layer.get("file") or layer["from_base"] for layer in mine.layers):
                mine = _saved_layers(client, first, scratch / "first")
            report["difference"] = layer_differences(mine, second.normalized) or _label_differences(
                client.images.get(first.image_id).labels or {}, client.images.get(check_tag).labels or {})
        return report
    finally:
        client.images.remove(check_tag, noprune=True)
        shutil.rmtree(scratch, ignore_errors=True)
        if first.normalized is not None:   # the first build's kept layer tars: compared, no longer needed
            shutil.rmtree(first.normalized.directory, ignore_errors=True)


def _label_differences(first: dict, second: dict) -> dict:
    """Every layer equal, other ids: the configs differ; name the labels that do (the provenance
    label differs whenever the two statements do)."""
    keys = sorted(k for k in set(first) | set(second) if first.get(k) != second.get(k))
    return {"layer": None, "first": None, "second": None, "files": [],
            "note": "every layer is equal; the image configs differ" + (f", in labels {', '.join(keys)}" if keys else "")}


def _saved_layers(client, result, directory: Path) -> NormalizedImage:
    """The layer tars of an image already written by the kit (saving it again gives its bytes back)."""
    directory.mkdir(parents=True, exist_ok=True)
    base = client.images.get(result.image_id).attrs["RootFS"]["Layers"]
    record = result.record.get("reproducible", {})
    base_ids = [layer["diff_id"] for layer in record.get("layers", []) if layer.get("from_base")]
    if not base_ids and result.record.get("base_image", {}).get("ref"):   # a reused build's record
        base_ids = base_layers(client, result.record["base_image"]["ref"])
    manifest, _, saved = _save_normalized(client, result.image_id, directory, set(base_ids),
                                          record.get("epoch", CONTEXT_MTIME), lambda text: None)
    layers = []
    for name, diff_id in zip(manifest["Layers"], base):
        _, res, out = saved[name]
        layers.append({"diff_id": diff_id, "from_base": res is None, "file": str(out) if out else None})
    return NormalizedImage(result.image_id, "", layers, directory)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
