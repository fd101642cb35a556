"""Verifying a sealed run dir: every file, every seal field, and who vouches for it.

The seal is checked against the directory (regular files only, nothing followed, each read bounded
by its sealed size), against itself (root hash, whole-seal hash, signature) and against the
documents it seals (run id, kit version, gate-set version and verdict of validation.json, the
manifest and status.json). Every verdict states a trust level (:mod:`kit.evidence.signing`).
Example::

    verdict = verify_run_dir(Path("ws/runs/r1"), require_signature=True)
    verdict.status, verdict.trust, verdict.problems     # ('fail', 'unsigned', [('/seal.json/signature', ...)])
"""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kit.evidence.attestation import (ATTESTATION, STATEMENT_SCHEMA, STATEMENT_SCHEMAS, run_attestation_problems,
                                      sealed_statement)
from kit.evidence.bundle import (
    HASH_WORKERS,
    ID_REGISTRY,
    MANIFEST,
    SEAL,
    SEAL_TMP_PREFIX,
    STATUS,
    VALIDATION,
    root_sha256,
    seal_sha256,
    status_of,
)
from kit.evidence.files import hash_bounded, walk_run_dir
from kit.evidence.pinning import PINNED, pinned_reasons
from kit.evidence.signing import UNSIGNED, dsse_envelope, load_public_key, policy_problems, seal_trust
from kit.evidence.verdict import FileVerdict
from kit.model.documents import (
    MAX_DOCUMENT_BYTES,
    dumps_pretty,
    parse_json_bytes,
    read_json_file,
    schema_problems,
    write_new_document,
)
from kit.model.errors import BadInput, KitError

IN_TOTO_STATEMENT = "https://in-toto.io/Statement/v1"
IN_TOTO_PREDICATE = "https://rlk-kit.dev/attestation/run-seal/v1"
IN_TOTO_SCHEMAS = {"rlk-kit/seal/v1": "rlk-kit/in-toto-run-seal/v1", "rlk-kit/seal/v2": "rlk-kit/in-toto-run-seal/v2",
                   "rlk-kit/seal/v3": "rlk-kit/in-toto-run-seal/v3"}
# Bits whose change alters what a file is (executable, set-id, sticky); write bits only say it was made writable again.
MEANINGFUL_MODE_BITS = 0o7111
WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def verify_run_dir(path: Path, public_key: Path | None = None, in_toto_out: Path | None = None, *,
                   require_signature: bool = False) -> FileVerdict:
    """Re-hash every artifact against the seal and cross-check the seal; name every problem found."""
    run_dir = Path(path)
    verdict = FileVerdict(str(run_dir), kind="run")
    verdict.trust = UNSIGNED
    key = load_public_key(public_key) if public_key is not None else None
    registered = (run_dir.parent / ID_REGISTRY).is_file()   # made by create_run_dir, even if it stopped at once
    if not registered and not any((run_dir / name).exists() for name in (SEAL, STATUS, MANIFEST)):
        # Not a run dir at all (a folder of locks, say): unusable input, not a failed check.
        verdict.status, verdict.kind = "unreadable", "unknown"
        verdict.problems.append(("", f"not a run directory (no {SEAL}, {STATUS} or {MANIFEST}); give a run dir "
                                     f"<workspace>/runs/<run-id> or lock files such as {run_dir}/*.json"))
        return verdict
    seal, problems = _read_seal(run_dir)
    if seal is None:
        verdict.status, verdict.problems = "fail", problems
        return verdict
    problems += _file_problems(run_dir, seal, verdict.notes)
    problems += _seal_field_problems(run_dir, seal)
    if not problems:   # the sealed documents are the sealed bytes: their fields can be held to the seal's
        problems += _cross_check(run_dir, seal)
    if seal["validation_passed"] is not True:
        problems.append((f"/{SEAL}/validation_passed", "false: the run's gates failed (see validation.json)"))
    verdict.trust, words, sig_problems = seal_trust(seal, key)
    problems += [(f"/{SEAL}/signature", m) for m in sig_problems]
    problems += [(f"/{SEAL}/signature", m) for m in policy_problems(verdict.trust, require_signature=require_signature)]
    verdict.notes.insert(0, f"trust: {words}")
    verdict.notes.append(f"{len(seal['artifacts'])} artifacts, root sha256 {seal['root_sha256']}, "
                         f"gate set {seal['gate_set_version']}, seal {seal['schema']}")
    if not problems:
        verdict.notes.append(_identity_note(run_dir))
    if in_toto_out is not None and not problems:
        write_in_toto(seal, Path(in_toto_out), run_dir)
        verdict.notes.append(f"in-toto statement written to {in_toto_out}")
    verdict.problems = problems
    verdict.status = "fail" if problems else "ok"
    return verdict


def _identity_note(run_dir: Path) -> str:
    """Whether the sealed run ran its stack's pinned lock: a verified seal vouches for the files, not for that."""
    try:
        manifest = read_json_file(run_dir / MANIFEST)
    except KitError as exc:
        return f"identity: unknown ({exc})"
    reasons = pinned_reasons(manifest) if isinstance(manifest, dict) else ("the manifest is not a JSON object",)
    stack = ((manifest.get("stack") or {}).get("name") if isinstance(manifest, dict) else None) or "?"
    if not reasons:
        return f"identity: {PINNED} (ran the lock of stack {stack}: image built from it, probe equal to it)"
    return (f"identity: not pinned, evidence about this run on its host, not about stack {stack} "
            f"({'; '.join(reasons)})")


def _read_seal(run_dir: Path) -> tuple[dict | None, list]:
    seal_path = run_dir / SEAL
    try:
        info = seal_path.lstat()
    except FileNotFoundError:
        temps = sorted(p.name for p in run_dir.glob(f"{SEAL_TMP_PREFIX}*")) + \
            sorted(p.name for p in run_dir.parent.glob(f".{run_dir.name}.{SEAL}.tmp-*"))
        why = f"missing: the run was not sealed (status {status_of(run_dir)})"
        if temps:
            why += f"; sealing was interrupted (temporary seal {temps[0]} left behind; the run is unsealed evidence)"
        return None, [(f"/{SEAL}", why)]
    except OSError as exc:
        return None, [(f"/{SEAL}", f"cannot stat ({exc.strerror or exc})")]
    if not stat.S_ISREG(info.st_mode):
        return None, [(f"/{SEAL}", "not a regular file (a link, FIFO or device); a seal is never followed")]
    if info.st_size > MAX_DOCUMENT_BYTES:
        return None, [(f"/{SEAL}", f"{info.st_size} bytes, over the {MAX_DOCUMENT_BYTES >> 20} MiB a seal may have")]
    try:
        raw = _bounded_bytes(seal_path, MAX_DOCUMENT_BYTES + 1) or b""
        seal = parse_json_bytes(raw, str(seal_path))
    except KitError as exc:
        return None, [(f"/{SEAL}", str(exc).split(": ", 1)[-1])]
    problems = [(f"/{SEAL}{p}", m) for p, m in schema_problems(seal, "seal")]
    if problems:
        return None, problems
    if info.st_nlink > 1:
        problems.append((f"/{SEAL}", f"has {info.st_nlink} hard links; a seal is one file of this tree"))
    if seal["schema"] != "rlk-kit/seal/v1" and raw != dumps_pretty(seal).encode("utf-8"):
        problems.append((f"/{SEAL}", "its bytes are not the form the kit writes (whitespace or key order changed): edited"))
    return seal, problems


def _file_problems(run_dir: Path, seal: dict, notes: list[str]) -> list[tuple[str, str]]:
    problems = []
    listing = walk_run_dir(run_dir, skip=(SEAL,))
    for rel, why in sorted(listing.refused.items()):
        problems.append((f"/{rel}", why))
    listed = {a["path"]: a for a in seal["artifacts"]}
    hashed = _hash_present(run_dir, listed, listing.files)
    for rel, art in sorted(listed.items()):
        entry = listing.files.get(rel)
        if entry is None:
            if rel not in listing.refused:
                problems.append((f"/{rel}", "missing: listed in the seal, not in the run dir"))
            continue
        if entry.size != art["size"]:
            problems.append((f"/{rel}", f"changed: {entry.size} bytes, sealed {art['size']}"))
            continue
        if isinstance(hashed[rel], OSError):
            problems.append((f"/{rel}", f"cannot read as a regular file ({hashed[rel].strerror or hashed[rel]})"))
            continue
        digest, size, over = hashed[rel]
        if over or size != art["size"]:
            problems.append((f"/{rel}", f"changed while verified: {size}{'+' if over else ''} bytes, sealed {art['size']}"))
        elif digest != art["sha256"]:
            problems.append((f"/{rel}", f"changed: sha256 {digest}, sealed {art['sha256']}"))
        if entry.links > 1:
            problems.append((f"/{rel}", f"has {entry.links} hard links; a sealed artifact is one file of this tree"))
        if "mode" in art:
            sealed_mode = int(art["mode"], 8)
            if (entry.mode ^ sealed_mode) & MEANINGFUL_MODE_BITS:
                problems.append((f"/{rel}", f"mode {entry.mode:04o}, sealed {art['mode']}: executable or set-id bits changed"))
            elif (entry.mode ^ sealed_mode) & WRITE_BITS:
                notes.append(f"{rel}: writable again (mode {entry.mode:04o}, sealed {art['mode']}); its bytes still match")
    seal_bytes = None
    for rel in sorted(set(listing.files) - set(listed)):
        if rel.startswith(SEAL_TMP_PREFIX):   # a kit before seal v2 killed between linking the seal and removing its temp
            seal_bytes = seal_bytes if seal_bytes is not None else _bounded_bytes(run_dir / SEAL)
            if seal_bytes is not None and _bounded_bytes(run_dir / rel) == seal_bytes:
                notes.append(f"{rel}: a leftover copy of seal.json from an interrupted sealing; harmless, may be removed")
                continue
        problems.append((f"/{rel}", "extra: not in the seal (added after sealing)"))
    needed_dirs = {str(Path(p).parent) for p in listed}
    needed_dirs |= {str(parent) for p in needed_dirs for parent in Path(p).parents}
    for rel in listing.dirs:
        if rel not in needed_dirs:
            problems.append((f"/{rel}", "extra directory: holds no sealed file (added after sealing)"))
    return problems


def _hash_present(run_dir: Path, listed: dict, files: dict) -> dict:
    """``{path: (sha256, size, over) | OSError}`` for listed files of the sealed size, hashed in parallel
    (hashlib releases the GIL), each read bounded by its sealed size."""
    todo = [rel for rel, art in listed.items() if rel in files and files[rel].size == art["size"]]

    def one(rel):
        try:
            return hash_bounded(run_dir, rel, limit=listed[rel]["size"], expect=files[rel])
        except OSError as exc:
            return exc
    with ThreadPoolExecutor(max_workers=min(HASH_WORKERS, max(1, len(todo)))) as pool:
        return dict(zip(todo, pool.map(one, todo)))


def _bounded_bytes(path: Path, limit: int = 16 << 20) -> bytes | None:
    try:
        listing_ok = stat.S_ISREG(path.lstat().st_mode)
        if not listing_ok:
            return None
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _seal_field_problems(run_dir: Path, seal: dict) -> list[tuple[str, str]]:
    problems = []
    listed = {a["path"]: a for a in seal["artifacts"]}
    for i, art in enumerate(seal["artifacts"]):
        parts = art["path"].split("/")
        if art["path"].startswith("/") or any(part in ("", ".", "..") for part in parts):
            problems.append((f"/{SEAL}/artifacts/{i}/path", f"{art['path']!r} is not a plain path inside the run dir"))
    if len(listed) != len(seal["artifacts"]):
        problems.append((f"/{SEAL}/artifacts", "lists a path twice"))
    if root_sha256(seal["artifacts"]) != seal["root_sha256"]:
        problems.append((f"/{SEAL}/root_sha256", "does not match the listed artifacts: the seal was edited"))
    if listed.get(MANIFEST, {}).get("sha256") != seal["manifest_sha256"]:
        problems.append((f"/{SEAL}/manifest_sha256", "does not match the sealed manifest.json"))
    if "seal_sha256" in seal:
        if seal_sha256(seal) != seal["seal_sha256"]:
            problems.append((f"/{SEAL}/seal_sha256", "does not match the seal's fields: the seal was edited"))
        if listed.get(VALIDATION, {}).get("sha256") != seal["validation_sha256"]:
            problems.append((f"/{SEAL}/validation_sha256", "does not match the sealed validation.json"))
    if seal["run_id"] != run_dir.resolve().name:
        problems.append((f"/{SEAL}/run_id", f"{seal['run_id']!r} is not the run dir's name {run_dir.resolve().name!r}"))
    return problems


def _cross_check(run_dir: Path, seal: dict) -> list[tuple[str, str]]:
    """The sealed documents agree with the seal: run id, kit version, the gates' verdict and version."""
    problems = []
    docs = {}
    for name, schema in ((MANIFEST, "run-manifest"), (VALIDATION, "validation-report"), (STATUS, "run-status")):
        if name not in {a["path"] for a in seal["artifacts"]}:
            if name != MANIFEST and seal["schema"] == "rlk-kit/seal/v1":
                continue      # v1 seals of runs from before validation reports may lack them
            problems.append((f"/{name}", "missing from the seal: a sealed run holds it"))
            continue
        try:
            doc = read_json_file(run_dir / name)
        except KitError as exc:
            problems.append((f"/{name}", str(exc).split(": ", 1)[-1]))
            continue
        found = schema_problems(doc, schema)
        problems += [(f"/{name}{p}", m) for p, m in found]
        if not found:
            docs[name] = doc
    for name, doc in docs.items():
        if doc.get("run_id") != seal["run_id"]:
            problems.append((f"/{name}/run_id", f"{doc.get('run_id')!r}, the seal says {seal['run_id']!r}"))
    if MANIFEST in docs and "lock_sha256" in seal:   # seal/v3: the lock is sealed as its own field
        lock = docs[MANIFEST].get("lock")
        named = lock.get("sha256") if isinstance(lock, dict) else None
        if named != seal["lock_sha256"]:
            problems.append((f"/{SEAL}/lock_sha256", f"{seal['lock_sha256']!r}, the manifest's lock.sha256 is {named!r}"))
    if MANIFEST in docs and docs[MANIFEST].get("kit_version") != seal["kit_version"]:
        problems.append((f"/{SEAL}/kit_version", f"{seal['kit_version']!r}, the manifest says {docs[MANIFEST].get('kit_version')!r}"))
    if VALIDATION in docs:
        report = docs[VALIDATION]
        if report["passed"] is not seal["validation_passed"]:
            problems.append((f"/{SEAL}/validation_passed", f"{seal['validation_passed']}, validation.json says {report['passed']}"))
        if report["gate_set_version"] != seal["gate_set_version"]:
            problems.append((f"/{SEAL}/gate_set_version", f"{seal['gate_set_version']!r}, validation.json says "
                                                          f"{report['gate_set_version']!r}"))
    if STATUS in docs and docs[STATUS]["status"] != "succeeded":
        problems.append((f"/{STATUS}/status", f"{docs[STATUS]['status']!r}: only a run that succeeded is sealed"))
    return problems


def in_toto_statement(seal: dict) -> dict:
    """The seal as an in-toto v1 Statement: the artifacts are the subjects; a signed v2 seal rides as a DSSE envelope."""
    keys = ["run_id", "sealed_at", "kit_version", "root_sha256", "manifest_sha256", "validation_passed", "gate_set_version"]
    predicate = {k: seal[k] for k in keys}
    if seal["schema"] != "rlk-kit/seal/v1":
        predicate |= {"seal_sha256": seal["seal_sha256"], "validation_sha256": seal["validation_sha256"]}
        if "lock_sha256" in seal:   # seal/v3
            predicate["lock_sha256"] = seal["lock_sha256"]
        if seal.get("signature"):
            predicate["seal_envelope"] = dsse_envelope(seal)
    elif seal.get("signature"):
        predicate["signature"] = seal["signature"]
    return {"_type": IN_TOTO_STATEMENT,
            "subject": [{"name": a["path"], "digest": {"sha256": a["sha256"]}} for a in seal["artifacts"]],
            "predicateType": IN_TOTO_PREDICATE, "predicate": predicate}


def write_in_toto(seal: dict, out: Path, run_dir: Path | None = None) -> Path:
    """The in-toto statement of a verified run (``kit verify --in-toto``): for seal v1–v3 the seal as a
    statement (:func:`in_toto_statement`); for a newer seal (v4, ECDSA P-256) the run's own sealed, signed
    attestation (``attestation.dsse.json``'s statement), which needs ``run_dir`` and must hold to the seal."""
    if out.exists():
        raise BadInput(f"--in-toto {out}: already exists; choose a new file")
    if seal["schema"] in IN_TOTO_SCHEMAS:
        statement, schema = in_toto_statement(seal), IN_TOTO_SCHEMAS[seal["schema"]]
    else:
        statement = _sealed_attestation(seal, out, run_dir)
        schema = STATEMENT_SCHEMAS.get(statement.get("predicateType"), STATEMENT_SCHEMA)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_new_document(out, statement, schema=schema)


def _sealed_attestation(seal: dict, out: Path, run_dir: Path | None) -> dict:
    """The statement of ``run_dir``'s sealed attestation, held to ``seal`` (signer, subjects, predicate)."""
    if run_dir is None:
        raise BadInput(f"--in-toto {out}: a {seal['schema']} run's statement is its sealed attestation ({ATTESTATION}): "
                       "give the run dir")
    problems, _ = run_attestation_problems(Path(run_dir), seal)
    statement = sealed_statement(Path(run_dir)) if not problems else None
    if statement is None:
        why = "; ".join(f"{p}: {m}" for p, m in problems) or f"no {ATTESTATION} sealed with it"
        raise BadInput(f"--in-toto {out}: {run_dir}: the run's attestation does not hold to its {seal['schema']} seal ({why})")
    return statement
