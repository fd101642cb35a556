"""A signed run's attestations: what a third party checks with standard tools, without the kit.

A run sealed with a key also seals two signature files, written after its other files and before
``seal.json`` (so the seal, the kit's index, lists them as ordinary artifacts):

* ``attestation.dsse.json``: an in-toto Statement v1 in a DSSE envelope (payloadType
  ``application/vnd.in-toto+json``). Subjects: every other file of the run dir, path and sha256.
  Predicate (type ``https://rlk-kit.dev/attestation/run/v2``, schema ``rlk-kit/run-statement/v2``):
  the run id, gate set, each gate's status and the verdict, lock sha256, manifest and validation
  hashes, and whether the run ran its stack's pinned lock. Signed with the run's key (ed25519 or ECDSA P-256); any DSSE verifier
  (securesystemslib, in-toto) checks it, then each subject's sha256.
* ``model.sig`` (ECDSA P-256 keys only: model signing takes no ed25519): an OpenSSF model-signing
  bundle over every file but itself and the seal, so ``model_signing verify key RUN_DIR --signature
  RUN_DIR/model.sig --public_key KEY.pub`` checks the run dir (:mod:`kit.evidence.model_signature`).

``kit verify`` checks both against the seal: same signer, subjects equal to the sealed files, the
predicate equal to the seal's fields. Example::

    written = write_run_attestations(run_dir, digests, key, run_id="r1", validation_passed=True,
                                     gate_set_version="rlk-kit-gates/2")     # ["attestation.dsse.json", "model.sig"]
    problems, notes = run_attestation_problems(run_dir, seal)                # ([], ["in-toto attestation: ..."])
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from pathlib import Path

from kit import __version__
from kit.evidence import model_signature
from kit.evidence.pinning import run_identity
from kit.evidence.verdict import FileVerdict
from kit.evidence.signing import (ECDSA_P256, ED25519, algorithm_of, key_id, pae, public_key_from_bytes, public_raw,
                                  sign_bytes, verify_bytes)
from kit.model.documents import canonical_json, dumps_pretty, read_json_file, require_valid, schema_problems
from kit.model.errors import KitError

ATTESTATION = "attestation.dsse.json"
MODEL_SIGNATURE = "model.sig"
SIGNATURE_FILES = (ATTESTATION, MODEL_SIGNATURE)
SEAL_NAME = "seal.json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://rlk-kit.dev/attestation/run/v2"
STATEMENT_SCHEMA = "rlk-kit/run-statement/v2"
# what each predicate type's statement is validated against (v1: the same without the gates)
STATEMENT_SCHEMAS = {"https://rlk-kit.dev/attestation/run/v1": "rlk-kit/run-statement/v1",
                     PREDICATE_TYPE: STATEMENT_SCHEMA}
ENVELOPE_SCHEMA = "rlk-kit/dsse-envelope/v2"


def _root(digests: dict[str, str]) -> str:
    lines = "".join(f"{digests[p]}  {p}\n" for p in sorted(digests))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def run_statement(run_dir: Path, digests: dict[str, str], *, run_id: str, validation_passed: bool,
                  gate_set_version: str) -> dict:
    """The in-toto statement of a run dir whose files (seal and signature files excepted) have ``digests``."""
    manifest = read_json_file(Path(run_dir) / "manifest.json")
    report = read_json_file(Path(run_dir) / "validation.json")
    gates = [{"id": g["id"], "status": g["status"], "problems": list(g.get("problems", []))}
             for g in report.get("gates", []) if isinstance(g, dict)]
    lock = manifest.get("lock") if isinstance(manifest.get("lock"), dict) else {}
    stack = manifest.get("stack") if isinstance(manifest.get("stack"), dict) else {}
    identity = run_identity(manifest, run_id)
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": p, "digest": {"sha256": digests[p]}} for p in sorted(digests)],
        "predicateType": PREDICATE_TYPE,
        "predicate": {"run_id": run_id, "kit_version": __version__, "seal": SEAL_NAME,
                      "gate_set_version": gate_set_version, "validation_passed": validation_passed,
                      "lock_sha256": lock.get("sha256"), "manifest_sha256": digests["manifest.json"],
                      "validation_sha256": digests["validation.json"], "root_sha256": _root(digests),
                      "gates": gates,
                      "identity": {"stack": stack.get("name"), "stack_sha256": stack.get("sha256"),
                                   "pinned": identity["pinned"], "reasons": list(identity["reasons"])}}}
    return require_valid(statement, f"{run_dir}/{ATTESTATION}", as_schema=STATEMENT_SCHEMA)


def sign_envelope(statement: dict, private_key) -> dict:
    """A DSSE envelope of ``statement`` (payload: its canonical JSON), one signature by ``private_key``."""
    payload = canonical_json(statement)
    raw = public_raw(private_key)
    envelope = {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
                "signatures": [{"keyid": key_id(raw),
                                "sig": base64.b64encode(sign_bytes(private_key, pae(PAYLOAD_TYPE, payload))).decode(),
                                "public_key": base64.b64encode(raw).decode()}]}
    return require_valid(envelope, "DSSE envelope", as_schema=ENVELOPE_SCHEMA)


def _write_once(path: Path, data: bytes) -> None:
    with open(path, "xb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    path.chmod(0o444)


def write_run_attestations(run_dir: Path, digests: dict[str, str], private_key, *, run_id: str,
                           validation_passed: bool, gate_set_version: str) -> list[str]:
    """Write the signature files of a run dir about to be sealed; the names written.

    ``digests``: ``{path: sha256}`` of every file of the run dir (no seal yet)."""
    run_dir = Path(run_dir)
    statement = run_statement(run_dir, digests, run_id=run_id, validation_passed=validation_passed,
                              gate_set_version=gate_set_version)
    data = dumps_pretty(sign_envelope(statement, private_key)).encode("utf-8")
    _write_once(run_dir / ATTESTATION, data)
    written = [ATTESTATION]
    if algorithm_of(private_key) == ECDSA_P256:
        covered = {**digests, ATTESTATION: hashlib.sha256(data).hexdigest()}
        bundle = model_signature.sign_digests(run_dir.name, covered, [MODEL_SIGNATURE, SEAL_NAME], private_key)
        _write_once(run_dir / MODEL_SIGNATURE, json.dumps(bundle, indent=2).encode("utf-8"))
        written.append(MODEL_SIGNATURE)
    return written


def _embedded_key(raw: bytes):
    return public_key_from_bytes(ED25519 if len(raw) == 32 else ECDSA_P256, raw)


def envelope_statement(envelope: dict, public_key) -> tuple[dict | None, list[str]]:
    """``(statement, problems)``: the envelope checked as DSSE (an ed25519 or ECDSA P-256 signature over
    PAE by ``public_key``, or by the key its first signature embeds when None) and its payload parsed."""
    found = [f"{p or '/'}: {m}" for p, m in schema_problems(envelope, as_schema=ENVELOPE_SCHEMA)]
    if found:
        return None, found
    if envelope["payloadType"] != PAYLOAD_TYPE:
        return None, [f"payloadType {envelope['payloadType']!r}, expected {PAYLOAD_TYPE!r}"]
    try:
        payload = base64.b64decode(envelope["payload"], validate=True)
        entries = [(_embedded_key(base64.b64decode(e["public_key"], validate=True)),
                    base64.b64decode(e["sig"], validate=True)) for e in envelope["signatures"]]
    except (binascii.Error, ValueError) as exc:
        return None, [f"a signature entry is malformed: {exc}"]
    wanted = public_raw(public_key) if public_key is not None else public_raw(entries[0][0])
    signed = [key for key, sig in entries if public_raw(key) == wanted and verify_bytes(key, sig, pae(PAYLOAD_TYPE, payload))]
    if not signed:
        return None, [f"no signature by key {key_id(wanted)[:16]} matches the payload: edited, or signed by another key"]
    try:
        return json.loads(payload), []
    except ValueError as exc:
        return None, [f"the payload is not JSON: {exc}"]


def _seal_signer(seal: dict):
    sig = seal.get("signature") or {}
    try:
        return public_key_from_bytes(sig.get("algorithm", ED25519), base64.b64decode(sig["public_key"], validate=True))
    except (KeyError, TypeError, ValueError):
        return None


def run_attestation_problems(run_dir: Path, seal: dict, public_key=None) -> tuple[list[tuple[str, str]], list[str]]:
    """The sealed signature files of a run dir held to its seal (call once the seal itself verified):
    signed by the seal's signer (and ``public_key`` when given), subjects equal to the sealed files, the
    predicate equal to the seal's fields. A seal without them (older runs, unsigned runs) has none to check."""
    run_dir = Path(run_dir)
    listed = {a["path"]: a["sha256"] for a in seal.get("artifacts", [])}
    if ATTESTATION not in listed:
        return [], (["no in-toto attestation sealed with this run (sealed by a kit that wrote none)"]
                    if seal.get("signature") else [])
    signer = public_key if public_key is not None else _seal_signer(seal)
    if signer is None:
        return [(f"/{ATTESTATION}", "the run's files are attested but its seal is unsigned: the seal was replaced")], []
    where = f"/{ATTESTATION}"
    try:
        envelope = read_json_file(run_dir / ATTESTATION)
    except KitError as exc:
        return [(where, str(exc).split(": ", 1)[-1])], []
    statement, found = envelope_statement(envelope, signer)
    if statement is None:
        return [(where, m) for m in found], []
    schema = STATEMENT_SCHEMAS.get(statement.get("predicateType") if isinstance(statement, dict) else None,
                                   STATEMENT_SCHEMA)
    problems = [(f"{where}/payload{p}", m) for p, m in schema_problems(statement, as_schema=schema)]
    if problems:
        return problems, []
    expected = {p: d for p, d in listed.items() if p not in SIGNATURE_FILES}
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    for path, what in model_signature.digest_differences(expected, subjects):
        problems.append((f"{where}/payload/subject", f"{path}: {what.replace('directory', 'attestation')}"))
    predicate = statement["predicate"]
    for field in ("run_id", "gate_set_version", "validation_passed", "lock_sha256", "manifest_sha256",
                  "validation_sha256"):
        if field in seal and predicate[field] != seal[field]:
            problems.append((f"{where}/payload/predicate/{field}", f"{predicate[field]!r}, the seal says {seal[field]!r}"))
    if "gates" in predicate:
        try:
            report = read_json_file(run_dir / "validation.json")
            stated = [{"id": g["id"], "status": g["status"], "problems": list(g.get("problems", []))}
                      for g in report.get("gates", []) if isinstance(g, dict)]
        except (KitError, KeyError, TypeError, AttributeError) as exc:
            stated = f"unreadable ({exc})"
        if predicate["gates"] != stated:
            problems.append((f"{where}/payload/predicate/gates", "differ from validation.json's gates"))
    notes = [f"in-toto attestation ({statement['predicateType']}): {len(subjects)} subjects signed by key {key_id(public_raw(signer))[:16]}"]
    if MODEL_SIGNATURE in listed:
        bundle_problems, bundle_notes = _model_signature_problems(run_dir, listed, signer)
        problems += bundle_problems
        notes += bundle_notes
    return problems, notes


def _model_signature_problems(run_dir: Path, listed: dict[str, str], signer) -> tuple[list, list[str]]:
    where = f"/{MODEL_SIGNATURE}"
    try:
        bundle = model_signature.read_bundle(run_dir / MODEL_SIGNATURE)
    except KitError as exc:
        return [(where, str(exc).split(": ", 1)[-1])], []
    signed, ignore, found = model_signature.bundle_digests(bundle, signer)
    if found:
        return [(where, m) for m in found], []
    expected = {p: d for p, d in listed.items() if p != MODEL_SIGNATURE}
    problems = [(f"{where}/resources", f"{p}: {what.replace('directory', 'seal')}")
                for p, what in model_signature.digest_differences(expected, signed)]
    if sorted(ignore) != sorted([MODEL_SIGNATURE, SEAL_NAME]):
        problems.append((f"{where}/serialization/ignore_paths", f"{ignore}: a run's model signature leaves out only "
                                                                f"{MODEL_SIGNATURE} and {SEAL_NAME}"))
    return problems, [f"model signature (model_signing, key mode): {len(signed)} files"]


def sealed_statement(run_dir: Path) -> dict | None:
    """The statement of a run dir's sealed attestation, unchecked (for ``kit verify --in-toto`` once verified)."""
    try:
        envelope = read_json_file(Path(run_dir) / ATTESTATION)
        return json.loads(base64.b64decode(envelope["payload"], validate=True))
    except (KitError, KeyError, TypeError, ValueError):
        return None


def add_attestation_verdict(verdict: FileVerdict, public_key=None) -> FileVerdict:
    """A run dir's verdict (from :func:`kit.evidence.audit.verify_run_dir`, ok) with its sealed attestations checked."""
    if verdict.kind != "run" or verdict.status != "ok":
        return verdict
    run_dir = Path(verdict.path)
    problems, notes = run_attestation_problems(run_dir, read_json_file(run_dir / SEAL_NAME), public_key)
    verdict.problems += problems
    verdict.notes += notes
    verdict.status = "fail" if verdict.problems else "ok"
    return verdict


def model_signature_verdict(directory: Path, signature: Path, public_key) -> FileVerdict:
    """``kit verify --model-signature SIG --key PUB DIR``: DIR's files against a model-signing bundle, whoever
    wrote it (``model_signing sign key`` or a kit run's model.sig)."""
    verdict = FileVerdict(f"{directory} (model signature {signature})", kind="model-signed dir")
    problems, notes = model_signature.directory_problems(Path(directory), Path(signature), public_key)
    verdict.problems, verdict.notes = problems, notes
    verdict.trust = "trusted" if not problems else "unsigned"
    verdict.status = "fail" if problems else "ok"
    return verdict


def signature_file_redirect(doc) -> str | None:
    """What to do instead, when ``kit verify FILE`` is given a run's attestation or a model-signing bundle
    (each is checked with the directory it signs); None for any other document."""
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("dsseEnvelope"), dict) and "mediaType" in doc:
        return ("a model-signing signature: check the directory it signs with kit verify --model-signature FILE "
                "--key PUB DIR (or model_signing verify key DIR --signature FILE --public_key PUB)")
    if doc.get("payloadType") == PAYLOAD_TYPE and isinstance(doc.get("payload"), str):
        try:
            predicate_type = json.loads(base64.b64decode(doc["payload"], validate=True)).get("predicateType")
        except (ValueError, AttributeError, binascii.Error):
            return None
        if predicate_type in STATEMENT_SCHEMAS:
            return ("a run's in-toto attestation: give the run dir it lies in (kit verify DIR checks it against the "
                    "seal and every file)")
    return None
