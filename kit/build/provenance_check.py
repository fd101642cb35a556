"""Checks of build provenance: a statement by itself (schema, and the label of the image it names
when that image is on the engine), and an image against the statement its label points to.

Example::

    problems, notes = statement_problems(doc)             # [] for a valid, untouched statement
    problems, notes = image_provenance_problems(client, "rlk-kit/smoke:cpu-…", workspace)
"""

from __future__ import annotations

from pathlib import Path

from kit.adapters.docker import engine
from kit.build.provenance import LABEL, PREDICATE_TYPE, SCHEMA, subject_layers
from kit.build.repro_build import find_provenance
from kit.model.documents import read_json_file, schema_problems, sha256_of_document


def is_statement(doc) -> bool:
    return isinstance(doc, dict) and doc.get("predicateType") == PREDICATE_TYPE


def statement_problems(doc: dict, *, client=None) -> tuple[list[tuple[str, str]], list[str]]:
    """Schema problems; then, when the image the subject names is on the engine, whether its
    provenance label is this statement's sha256 (any changed field changes that sha256)."""

    problems = schema_problems(doc, as_schema=SCHEMA)
    if problems:
        return problems, []
    name = doc["subject"][0]["name"].split("@", 1)[0]
    image = _image(client, name)
    if image is None:
        return [], [f"image {name} is not on this engine: only the schema was checked"]
    label = (image.labels or {}).get(LABEL)
    found = sha256_of_document(doc)
    if label != found:
        return [("/", f"the image {name} carries {LABEL}={label}, this statement's sha256 is {found}: "
                      "the statement was changed or belongs to another build")], []
    if subject_layers(doc) != image.attrs.get("RootFS", {}).get("Layers", []):
        return [("/subject", f"the layers named differ from image {name}'s layers")], []
    return [], [f"matches image {name} ({image.id})"]


def image_provenance_problems(client, image_ref: str, workspace: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """An image against the statement its label names (found among ``workspace``'s build records)."""

    image = client.images.get(image_ref)
    label = (image.labels or {}).get(LABEL)
    if not label:
        return [], [f"no {LABEL} label: built before the kit wrote reproducible images; nothing to check it against"]
    path = find_provenance(workspace, label)
    if path is None:
        return [], [f"provenance {label[:16]}… is not among {workspace / 'builds'}; rebuild to check it "
                    "(the same inputs give the same statement)"]
    doc = read_json_file(path)
    problems, _ = statement_problems(doc, client=client)
    layers = image.attrs.get("RootFS", {}).get("Layers", [])
    if subject_layers(doc) != layers:
        problems.append(("provenance subject", f"{path} names other layers than the image holds"))
    return problems, [f"provenance {path} (sha256 {label[:16]}…)"]


def _image(client, name: str):
    try:
        if client is None:

            client = engine()
        return client.images.get(name)
    except Exception:   # no engine, no such image: the statement alone is checked
        return None
