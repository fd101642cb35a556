"""A reproducible `kit build`: the kit writes the image's bytes, its provenance, and can prove it.

:func:`write_reproducible` turns the engine's image into the kit's (layers and config normalized,
the provenance's sha256 in a label) and writes the provenance next to the build records.
:func:`check_reproducible` builds a second time in a scratch workspace (no cache, another umask
and time zone) and compares the two images layer by layer, naming the first differing layer and
its first differing files. Example::

    normalized, record_part = write_reproducible(client, plan, engine_id, workspace=ws, tag=plan.tag)
    report = check_reproducible(lambda ws: plan_build(stack, "cpu", workspace=ws), workspace=ws)
    report["same"], report["difference"]
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from kit.build.image_config import epoch_of
from kit.build.plan import CONTEXT_MTIME, BuildPlan
from kit.build.provenance import LABEL, image_provenance, parse_package_list
from kit.build.reproduce import NormalizedImage, _save_normalized, base_layers, layer_differences, normalize_image

# Written into the base's root by docker/make-base-image.sh: name, version, .deb sha256 per package.
BASE_PACKAGES_PATH = "/etc/rlk-kit/base-packages.tsv"
CHECK_UMASK, CHECK_TZ = 0o027, "Pacific/Chatham"   # far from any default, so a dependence shows


def build_epoch(plan: BuildPlan) -> int:
    """SOURCE_DATE_EPOCH of the image: the newest source commit's time (the created label), else a fixed one."""
    return epoch_of(plan.labels.get("org.opencontainers.image.created"), CONTEXT_MTIME)


def base_packages(client, base_ref: str) -> list[dict]:
    from kit.build.image_checks import read_image_file

    data = read_image_file(client, base_ref, BASE_PACKAGES_PATH)
    if data:
        return parse_package_list(data.decode())
    # A base made before the list was written: names and versions from dpkg, without .deb hashes.
    status = read_image_file(client, base_ref, "/var/lib/dpkg/status") or b""
    rows, name = [], None
    for line in status.decode(errors="replace").splitlines():
        if line.startswith("Package: "):
            name = line[9:].strip()
        elif line.startswith("Version: ") and name:
            rows.append(f"{name}\t{line[9:].strip()}")
            name = None
    return parse_package_list("\n".join(sorted(rows)))


def write_reproducible(client, plan: BuildPlan, engine_id: str, *, workspace: Path, tag: str, arm: str | None = None,
                       keep: bool = False, progress=None) -> tuple[NormalizedImage, dict]:
    """(the normalized image, the build record's ``reproducible`` and ``provenance`` parts)."""
    from kit import __version__
    from kit.model.documents import dumps_pretty, sha256_of_document

    packages = base_packages(client, plan.base_image)
    holder: dict = {}

    def labels_for(config_digest: str, layers: list[dict]) -> dict:
        holder["statement"] = image_provenance(plan, config_digest=config_digest, layers=layers,
                                               base_packages=packages, kit_version=__version__, arm=arm)
        holder["sha256"] = sha256_of_document(holder["statement"])
        return {LABEL: holder["sha256"]}

    safe = tag.replace("/", "_").replace(":", "_")
    normalized = normalize_image(client, engine_id, tag=tag, epoch=build_epoch(plan),
                                 base_diff_ids=base_layers(client, plan.base_image),
                                 workdir=workspace / "tmp" / f"layers-{safe}", labels_for=labels_for, keep=keep,
                                 progress=progress)
    directory = workspace / "builds"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{safe}.provenance.json"
    _write_provenance(path, holder["statement"], dumps_pretty)
    part = {
        "reproducible": {"epoch": build_epoch(plan), "engine_image_id": engine_id,
                         "config_digest": normalized.config_digest,
                         "layers": [{k: v for k, v in layer.items() if k != "file"} for layer in normalized.layers],
                         "dropped_files": normalized.dropped[:200]},
        "provenance": {"path": str(path), "sha256": holder["sha256"]},
    }
    return normalized, part


def _write_provenance(path: Path, statement: dict, dumps_pretty) -> None:
    """Equal inputs give an equal statement: an existing file with other contents is evidence, kept
    under a new name rather than overwritten."""
    from kit.model.documents import require_valid

    require_valid(statement, str(path), as_schema="rlk-kit/slsa-provenance/v1")
    data = dumps_pretty(statement).encode()
    if path.exists():
        if path.read_bytes() == data:
            return
        path.rename(path.with_name(f"{path.stem}.replaced-{time.strftime('%Y%m%dT%H%M%S')}.json"))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def find_provenance(workspace: Path, sha256: str) -> Path | None:
    """The provenance file in ``workspace/builds`` whose document sha256 is ``sha256``."""
    from kit.model.documents import read_json_file, sha256_of_document

    for path in sorted((workspace / "builds").glob("*.provenance*.json")):
        try:
            if sha256_of_document(read_json_file(path)) == sha256:
                return path
        except Exception:   # unreadable files are not the one asked for
            continue
    return None


def check_reproducible(make_plan, first, *, workspace: Path, client, nocache: bool = True, progress=None) -> dict:
    """Build again from ``make_plan(scratch_workspace)`` and compare with ``first`` (a BuildResult).

    The scratch workspace is fresh (sources re-exported; wheels hard-linked from ``workspace``, they
    are checked by sha256), the process runs with another umask and TZ, and the engine's cache is
    not used (``nocache``). Returns ``{"same", "second_image_id", "umask", "tz", "difference"}``.
    """
    from kit.build.images import build_image

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
        second = build_image(plan, workspace=scratch, client=client, nocache=nocache, progress=progress,
                             load_tag=check_tag, keep_layers=True, write_record=False)
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
            report["difference"] = layer_differences(mine, second.normalized)
        return report
    finally:
        client.images.remove(check_tag, noprune=True)
        shutil.rmtree(scratch, ignore_errors=True)
        if first.normalized is not None:   # the first build's kept layer tars: compared, no longer needed
            shutil.rmtree(first.normalized.directory, ignore_errors=True)


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
