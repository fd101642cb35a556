"""Verification of lock files: schema validation plus the semantic rules of stacks, arms and matrices.

Pure over files: no engine. Run directories and images are verified by ``kit.evidence`` and
``kit.images``; ``kit verify`` dispatches. Example::

    verdict = verify_document_file(Path("manifests/G10.json"))
    verdict.status      # "ok" | "fail" | "unreadable"
"""

from __future__ import annotations

from pathlib import Path

from kit.build.provenance_check import is_statement, statement_problems
from kit.evidence.attestation import signature_file_redirect
from kit.evidence.compare import compare_arms
from kit.evidence.claims import claim_verification
from kit.evidence.provenance_signature import is_envelope, provenance_signature_problems
from kit.evidence.signing import load_public_key
from kit.evidence.verdict import FileVerdict
from kit.model.arm import arm_rule_problems, matrix_arm_documents
from kit.model.catalog import Catalog
from kit.model.documents import read_json_file, schema_problems, sha256_of_file
from kit.model.errors import KitError
from kit.model.lock import lock_rule_problems
from kit.model.buildability import buildability_findings
from kit.model.stack import Stack, StackResolutionError, resolve_stack_document, stack_rule_problems


def _catalog_for(path: Path):
    return Catalog.load(path.resolve().parent)


def verify_document_file(path: Path, *, public_key: Path | None = None, require_signature: bool = False) -> FileVerdict:
    """``public_key``/``require_signature``: what a signed build provenance must hold (kit verify --key)."""
    verdict = FileVerdict(str(path))
    try:
        doc = read_json_file(path)
    except KitError as exc:
        verdict.status, verdict.problems = "unreadable", [("", str(exc).split(": ", 1)[-1])]
        return verdict
    redirect = signature_file_redirect(doc)
    if redirect:                                # a run's signature file is checked with its run dir
        verdict.status, verdict.problems = "unreadable", [("", redirect)]
        return verdict
    if is_statement(doc) or is_envelope(doc):   # an in-toto statement (or its DSSE envelope) has no 'schema' field
        return _provenance_verdict(path, doc, verdict, public_key, require_signature)
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(schema, str) or not schema.startswith("rlk-kit/"):
        verdict.status = "fail"
        verdict.problems = [("/schema" if isinstance(doc, dict) else "", "not a kit document (no \"schema\": "
                             "\"rlk-kit/<name>/v<N>\"); kit verify checks stacks, arms, matrices and run dirs")]
        return verdict
    problems = schema_problems(doc)
    if isinstance(doc, dict) and "extends" in doc and str(doc.get("schema")).startswith("rlk-kit/arm/"):
        # a layered arm may hold partial objects: it is validated in its resolved form (_arm_rules)
        problems = [(p, m) for p, m in problems if p in ("", "/schema", "/name", "/extends")]
    verdict.kind = schema.split("/")[1] if isinstance(schema, str) and schema.count("/") == 2 else "unknown"
    if not problems:
        if verdict.kind == "stack":
            problems, notes = _stack_rules(path, doc)
            verdict.notes += notes
        elif verdict.kind == "arm":
            problems, notes = _arm_rules(path, doc)
            verdict.notes += notes
        elif verdict.kind == "arm-matrix":
            problems = _matrix_rules(path, doc)
        elif verdict.kind == "lock":
            problems = _lock_rules(path, doc)
        elif verdict.kind in ("claim", "claim-verdict"):     # a sealed claim, and the verdict of evaluating one
            problems, notes = claim_verification(path, doc)
            verdict.notes += notes
    if not problems and verdict.kind in ("stack", "arm", "arm-matrix"):
        clash = _catalog_for(path).name_clash(doc, str(path))
        if clash:
            problems = [("/name", clash)]
    verdict.problems = problems
    verdict.status = "fail" if problems else "ok"
    return verdict


def _provenance_verdict(path: Path, doc: dict, verdict: FileVerdict, public_key, require_signature) -> FileVerdict:
    """The statement by schema and image label, and its signature (the sibling .dsse.json) when there is one."""
    verdict.kind = "slsa-provenance"
    key = load_public_key(public_key) if public_key is not None else None
    try:
        signed, signed_notes, trust, statement = provenance_signature_problems(
            path, doc, public_key=key, require_signature=require_signature)
    except KitError as exc:
        verdict.status, verdict.problems = "unreadable", [("", str(exc).split(": ", 1)[-1])]
        return verdict
    problems, notes = statement_problems(statement)
    verdict.problems, verdict.notes = problems + signed, notes + [f"trust {trust}: {n}" for n in signed_notes]
    verdict.status = "fail" if verdict.problems else "ok"
    return verdict


def _lock_rules(path: Path, doc: dict) -> list[tuple[str, str]]:
    """The CUDA/ROCm rules, and that the lock still locks its stack's pins (kit/model/lock.py)."""
    catalog = _catalog_for(path)
    if doc["stack"] not in catalog.stack_docs:
        return [("/stack", f"names stack {doc['stack']!r}, which {catalog.directory} does not hold")]
    try:
        stack_doc = catalog.stack(doc["stack"]).document
    except KitError as exc:
        return [("/stack", f"stack {doc['stack']!r} does not resolve: {exc}")]
    return lock_rule_problems(doc, stack_doc)


def _stack_rules(path: Path, doc: dict) -> tuple[list, list]:
    catalog = _catalog_for(path)
    try:
        resolved = resolve_stack_document(doc, catalog.raw_stack)
    except StackResolutionError as exc:
        return [(exc.pointer, str(exc))], []
    problems = stack_rule_problems(resolved)
    if problems:
        return [(p, f"(resolved through extends) {m}" if "extends" in doc else m) for p, m in problems], []
    if resolved.get("abstract"):
        return [], ["abstract layer: other stacks extend it; arms cannot reference it"]
    stack = Stack(doc["name"], resolved, str(path))
    notes = [f"unpinned input: {u}" for u in stack.unpinned_inputs()]
    # A stack may record software that ran but cannot be built again: a warning here, a problem in a build plan.
    notes += [f"warning: {f.text()}" for f in buildability_findings(resolved)]
    for source in resolved["sources"]:
        for i, patch in enumerate(source.get("patches", [])):
            patch_path = path.resolve().parent / patch["path"]
            if not patch_path.is_file():
                notes.append(f"patch {patch['path']} of source {source['name']} is not in this checkout; "
                             f"kit build needs it (sha256 {patch['sha256']})")
            elif sha256_of_file(patch_path) != patch["sha256"]:
                return [(f"/sources/{source['name']}/patches/{i}/sha256",
                         f"{patch['path']} has sha256 {sha256_of_file(patch_path)}, the lock says {patch['sha256']}")], notes
    if not stack.abstract:
        notes.append(f"stack sha256 {stack.sha256}")
    return [], notes


def _arm_rules(path: Path, doc: dict) -> tuple[list, list]:
    catalog = _catalog_for(path)
    try:
        doc = catalog.resolve_arm(doc, str(path))
    except KitError as exc:
        return [("/extends", str(exc).split(": ", 1)[-1])], []
    resolved_problems = schema_problems(doc, "arm")
    if resolved_problems:
        return [(p, f"(resolved through extends) {m}") for p, m in resolved_problems], []
    try:
        stack = catalog.stack(doc["stack"]["name"])
    except KitError as exc:
        return [("/stack/name", str(exc))], []
    problems = arm_rule_problems(doc, stack)
    comparison = doc.get("comparison")
    notes = [f"unpinned input (stack {stack.name}): {u}" for u in stack.unpinned_inputs()]
    if comparison:
        comparison_problems = _comparison_rules(catalog, doc, comparison)
        problems += comparison_problems
        if not comparison_problems and not problems:
            notes += _comparison_notes(catalog, doc)
    return problems, notes


COMPARABLE_ROOTS = ("engine", "operators", "production", "use_rollout_logprobs", "attention_backend", "graph", "model", "topology",
                    "workload", "evidence_level", "stack")


def _comparison_rules(catalog, doc: dict, comparison: dict) -> list[tuple[str, str]]:
    out = []
    other_name = comparison["with"]
    if other_name == doc["name"]:
        return [("/comparison/with", "an arm cannot be compared with itself")]
    others = catalog.all_arm_documents()
    if other_name not in others:
        return [("/comparison/with", f"names unknown arm {other_name!r}; known: {', '.join(sorted(others))}")]
    for i, factor in enumerate(comparison["factors"]):
        if factor.split(".")[0] not in COMPARABLE_ROOTS:
            out.append((f"/comparison/factors/{i}", f"{factor!r} is not a comparable field; roots: {', '.join(COMPARABLE_ROOTS)}"))
    other_doc = others[other_name][0]
    back = other_doc.get("comparison")
    if back and back["with"] == doc["name"] and sorted(back["factors"]) != sorted(comparison["factors"]):
        out.append(("/comparison/factors", f"declares {sorted(comparison['factors'])} but {other_name} declares "
                                           f"{sorted(back['factors'])} for the same comparison"))
    return out


def _comparison_notes(catalog, doc: dict) -> list[str]:
    """Whether a declared comparison holds is reported, not failed: a faithful lock of an uncontrolled
    historical pair (G10/G11) is still a valid lock. ``kit compare`` is the check that exits 1."""
    other_name = doc["comparison"]["with"]
    try:
        a, b = catalog.arm_from_document(doc, "this arm", check_rules=False), catalog.arm(other_name)
    except KitError:
        return []
    result = compare_arms(a, b)
    if result.controlled:
        return [f"declared comparison with {other_name} is controlled"]
    paths = ", ".join(d.path for d in result.uncontrolled)
    return [f"declared comparison with {other_name} is NOT controlled: {paths} differ outside the declared factors "
            f"(kit compare {doc['name']} {other_name})"]


def _matrix_rules(path: Path, doc: dict) -> list[tuple[str, str]]:
    catalog = _catalog_for(path)
    out = []
    bases = {n: d for n, (d, _) in catalog.arm_docs.items()}
    for i, base in enumerate(doc["bases"]):
        if base["arm"] not in bases:
            out.append((f"/bases/{i}/arm", f"unknown base arm {base['arm']!r}; known: {', '.join(sorted(bases))}"))
    for generated in matrix_arm_documents(doc, bases):
        if generated["name"] in catalog.arm_docs:
            out.append(("/bases", f"generated arm {generated['name']} collides with a written arm of that name"))
        for pointer, message in schema_problems(generated, "arm"):
            out.append(("/bases", f"generated arm {generated['name']}: {pointer}: {message}"))
        try:
            stack = catalog.stack(generated["stack"]["name"])
        except KitError as exc:
            out.append(("/bases", f"generated arm {generated['name']}: {exc}"))
            continue
        for pointer, message in arm_rule_problems(generated, stack):
            out.append(("/bases", f"generated arm {generated['name']}: {pointer}: {message}"))
    return out
