"""Stack: one software identity — base image per platform, Python, exact packages, sources, build settings.

A stack document may ``extends`` another so that no pin is written twice; the resolved form is what
images are built from and what identities are computed over. Example::

    stack = catalog.stack("vime-g10")
    stack.sha256            # identity: sha256 of the canonical JSON of the resolved content
    stack.base_image("cuda")
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Callable

from kit.model.documents import schema_problems, sha256_of_document

DIGEST_RE = re.compile(r"@sha256:([0-9a-f]{64})$")
# Fields that name or describe a stack but are not part of the software it pins.
NON_IDENTITY_FIELDS = ("name", "description", "extends", "abstract")
PLATFORMS = ("cuda", "rocm", "cpu")


@dataclass(frozen=True)
class Stack:
    name: str
    document: dict          # resolved: no "extends"
    source_file: str = ""

    @property
    def identity(self) -> dict:
        return stack_identity(self.document)

    @property
    def sha256(self) -> str:
        return sha256_of_document(self.identity)

    @property
    def abstract(self) -> bool:
        return bool(self.document.get("abstract"))

    @property
    def python(self) -> str:
        return self.document["python"]

    @property
    def packages(self) -> dict[str, str]:
        return dict(self.document["packages"])

    @property
    def sources(self) -> list[dict]:
        return list(self.document["sources"])

    def packages_for(self, platform: str) -> dict[str, str]:
        return packages_for(self.document, platform)

    def source(self, name: str) -> dict | None:
        return next((s for s in self.sources if s["name"] == name), None)

    def platform(self, platform: str) -> dict | None:
        return self.document["platforms"].get(platform)

    def base_image(self, platform: str) -> str | None:
        entry = self.platform(platform)
        return entry["base_image"] if entry else None

    def unpinned_inputs(self) -> list[str]:
        """Inputs named by something other than a content hash (tags of unresolved bases)."""
        out = []
        for platform, entry in sorted(self.document["platforms"].items()):
            if entry.get("unresolved"):
                out.append(f"platforms.{platform}.base_image {entry['base_image']} is a tag, not a digest")
        return out


def packages_for(resolved: dict, platform: str) -> dict[str, str]:
    """The exact versions an image of ``platform`` holds: the stack's, with the platform's overrides.

    >>> packages_for({"packages": {"torch": "2.9.1"}, "platforms": {"rocm": {"packages": {"torch": "2.9.1+rocm6.3"}}}}, "rocm")
    {'torch': '2.9.1+rocm6.3'}
    """
    merged = dict(resolved.get("packages", {}))
    merged.update((resolved.get("platforms", {}).get(platform) or {}).get("packages", {}))
    return merged


def stack_identity(resolved: dict) -> dict:
    """The pinned content: names, descriptions and free-text notes are not part of the software."""
    return _without_notes({k: v for k, v in resolved.items() if k not in NON_IDENTITY_FIELDS})


def stack_parts(stack) -> tuple[dict, str, str]:
    """(resolved document, sha256, name) from a Stack or a resolved stack dict."""
    if isinstance(stack, dict):
        return stack, sha256_of_document(stack_identity(stack)), stack["name"]
    return stack.document, stack.sha256, stack.name


def _without_notes(value):
    if isinstance(value, dict):
        return {k: _without_notes(v) for k, v in value.items() if k != "note"}
    if isinstance(value, list):
        return [_without_notes(v) for v in value]
    return value


def merge_stack(parent: dict, child: dict) -> dict:
    """The child's fields over the parent's: platforms and packages per key, sources per name."""
    out = copy.deepcopy(parent)
    for key, value in child.items():
        if key == "extends":
            continue
        if key in ("platforms", "packages", "excludes"):
            merged = dict(out.get(key, {}))
            merged.update(copy.deepcopy(value))
            out[key] = merged
        elif key == "sources":
            by_name = {s["name"]: s for s in out.get("sources", [])}
            order = [s["name"] for s in out.get("sources", [])]
            for src in value:
                if src["name"] not in by_name:
                    order.append(src["name"])
                by_name[src["name"]] = copy.deepcopy(src)
            out["sources"] = [by_name[n] for n in order]
        else:
            out[key] = copy.deepcopy(value)
    out.pop("abstract", None)
    if child.get("abstract"):
        out["abstract"] = True
    out.pop("extends", None)
    return out


class StackResolutionError(Exception):
    def __init__(self, pointer: str, message: str):
        super().__init__(message)
        self.pointer = pointer


def resolve_stack_document(doc: dict, lookup: Callable[[str], dict | None], _seen: tuple = ()) -> dict:
    """Follow ``extends`` (one name or an ordered list of layers) through ``lookup(name) -> raw document``.

    Layers apply left to right, then the document itself: later values win.
    """
    name = doc.get("name")
    if name in _seen:
        raise StackResolutionError("/extends", f"stack inheritance loop through {name!r}")
    parents = doc.get("extends", [])
    if isinstance(parents, str):
        parents = [parents]
    # Checked before the schema: a number or a list of objects would reach a dict look-up and a traceback.
    if not isinstance(parents, list):
        raise StackResolutionError("/extends", f"{type(parents).__name__} is not accepted; expected a stack name "
                                   "or a list of stack names")
    for i, parent_name in enumerate(parents):
        if not isinstance(parent_name, str):
            raise StackResolutionError(f"/extends/{i}", f"{type(parent_name).__name__} is not accepted; "
                                       "expected a stack name (a string)")
    resolved: dict = {}
    for i, parent_name in enumerate(parents):
        parent = lookup(parent_name)
        if parent is None:
            pointer = "/extends" if isinstance(doc.get("extends"), str) else f"/extends/{i}"
            raise StackResolutionError(pointer, f"extends unknown stack {parent_name!r}")
        layer = resolve_stack_document(parent, lookup, _seen + (name,))
        layer.pop("abstract", None)
        resolved = merge_stack(resolved, layer) if resolved else layer
    own = {k: copy.deepcopy(v) for k, v in doc.items() if k != "extends"}
    resolved = merge_stack(resolved, own) if resolved else own
    resolved["name"] = doc["name"]
    resolved.pop("description", None)
    if "description" in doc:
        resolved["description"] = doc["description"]
    if not doc.get("abstract"):
        resolved.pop("abstract", None)
    return resolved


def stack_rule_problems(resolved: dict) -> list[tuple[str, str]]:
    """Semantic rules over a resolved stack, as (JSON pointer, message)."""
    problems = [(p, m) for p, m in schema_problems(resolved, "stack")]
    if problems or resolved.get("abstract"):
        return problems
    names = [s["name"] for s in resolved["sources"]]
    for i, name in enumerate(names):
        if names.index(name) != i:
            problems.append((f"/sources/{i}/name", f"source {name!r} is listed twice"))
    for platform, entry in resolved["platforms"].items():
        kind = platform.split("-", 1)[0]   # cuda-debian is a cuda platform
        if kind == "cuda" and "cuda_arch_list" not in entry:
            problems.append((f"/platforms/{platform}", "a cuda platform needs cuda_arch_list (for example [\"9.0\"] for H100/H200)"))
        if kind == "rocm" and "gfx_targets" not in entry:
            problems.append((f"/platforms/{platform}", "a rocm platform needs gfx_targets (for example [\"gfx942\"] for MI300X)"))
        if kind != "cuda" and "cuda_arch_list" in entry:
            problems.append((f"/platforms/{platform}/cuda_arch_list", "only a cuda platform takes cuda_arch_list"))
        if kind != "rocm" and "gfx_targets" in entry:
            problems.append((f"/platforms/{platform}/gfx_targets", "only a rocm platform takes gfx_targets"))
    return problems
