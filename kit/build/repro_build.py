"""A reproducible `kit build`: the kit writes the image's bytes, its provenance, and can prove it.

:func:`write_reproducible` turns the engine's image into the kit's (layers and config normalized,
the provenance's sha256 in a label) and writes the provenance next to the build records.
kit.build.recheck builds a second time and compares. Example::

    normalized, record_part = write_reproducible(client, plan, engine_id, workspace=ws, tag=plan.tag)
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from kit import __version__
from kit.adapters import docker as dockerdoor
from kit.adapters.docker_storage import stored_image
from kit.build.image_checks import read_image_file
from kit.build.image_config import config_bytes, epoch_of
from kit.build.layout import step_cache_ref
from kit.build.plan import CONTEXT_MTIME, BuildPlan
from kit.build.provenance import LABEL, image_provenance, parse_package_list
from kit.build.reproduce import NormalizedImage, base_layers, normalize_image
from kit.model.documents import dumps_pretty, read_json_file, require_valid, sha256_of_document

# Written into the base's root by docker/make-base-image.sh: name, version, .deb sha256 per package.
BASE_PACKAGES_PATH = "/etc/rlk-kit/base-packages.tsv"


def build_epoch(plan: BuildPlan) -> int:
    """SOURCE_DATE_EPOCH of the image: the newest source commit's time (the created label), else a fixed one."""
    return epoch_of(plan.labels.get("org.opencontainers.image.created"), CONTEXT_MTIME)


def base_packages(client, base_ref: str) -> list[dict]:
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
    packages = base_packages(client, plan.base_image)
    holder: dict = {}

    def labels_for(config_digest: str, layers: list[dict]) -> dict:
        holder["statement"] = image_provenance(plan, config_digest=config_digest, layers=layers,
                                               base_packages=packages, kit_version=__version__, arm=arm)
        holder["sha256"] = sha256_of_document(holder["statement"])
        return {LABEL: holder["sha256"]}

    safe = _safe(tag)
    normalized = normalize_image(client, engine_id, tag=tag, epoch=build_epoch(plan),
                                 base_diff_ids=base_layers(client, plan.base_image),
                                 workdir=workspace / "tmp" / f"layers-{safe}", labels_for=labels_for, keep=keep,
                                 progress=progress)
    # The engine's own image stays as the step cache of the next build of this stack and platform
    # (changing the kit must not rebuild the layers below it); one per stack and platform, not one per build.
    if engine_id != normalized.image_id:
        dockerdoor.retag(client, engine_id, step_cache_ref(plan.tag, plan.platform))
    path = _provenance_path(workspace, tag)
    _write_provenance(path, holder["statement"], dumps_pretty)
    part = {
        "reproducible": {"epoch": build_epoch(plan), "engine_image_id": engine_id,
                         "config_digest": normalized.config_digest,
                         "layers": [{k: v for k, v in layer.items() if k != "file"} for layer in normalized.layers],
                         "dropped_files": normalized.dropped[:200], "layers_read_from": normalized.read_from},
        "provenance": {"path": str(path), "sha256": holder["sha256"]},
    }
    return normalized, part


def recover_provenance(client, plan: BuildPlan, image, *, workspace: Path, arm: str | None = None) -> Path | None:
    """The provenance of an image the tag already holds (built in another workspace on this engine),
    written into ``workspace``: made again from the plan and the image's own config and layers, and
    kept only when its sha256 equals the image's label, so it is the statement that build wrote.
    None when the engine's store cannot be read here or the statements differ (another arm)."""
    label = (image.labels or {}).get(LABEL)
    stored = stored_image(client, image.id) if label else None
    if stored is None:
        return None
    config = json.loads(stored.config)
    inner = config.get("config") or {}
    inner["Labels"] = {k: v for k, v in (inner.get("Labels") or {}).items() if k != LABEL}
    config_digest = "sha256:" + hashlib.sha256(config_bytes(config)).hexdigest()   # before the label, as built
    statement = image_provenance(plan, config_digest=config_digest,
                                 layers=[{"diff_id": d} for d in stored.diff_ids],
                                 base_packages=base_packages(client, plan.base_image), kit_version=__version__, arm=arm)
    if sha256_of_document(statement) != label:
        return None
    path = _provenance_path(workspace, plan.tag)
    _write_provenance(path, statement, dumps_pretty)
    return path


def _safe(tag: str) -> str:
    return tag.replace("/", "_").replace(":", "_")


def _provenance_path(workspace: Path, tag: str) -> Path:
    directory = workspace / "builds"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{_safe(tag)}.provenance.json"


def _write_provenance(path: Path, statement: dict, dumps_pretty) -> None:
    """Equal inputs give an equal statement: an existing file with other contents is evidence, kept
    under a new name rather than overwritten."""
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
    for path in sorted((workspace / "builds").glob("*.provenance*.json")):
        try:
            if sha256_of_document(read_json_file(path)) == sha256:
                return path
        except Exception:   # unreadable files are not the one asked for
            continue
    return None
