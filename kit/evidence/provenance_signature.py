"""Signed build provenance: the SLSA statement in a DSSE envelope, signed the way a seal is.

The statement itself stays unsigned and byte-stable (its sha256 is the image's
``dev.rlk-kit.provenance.sha256`` label, so a signature inside it would change the image id with
the key). The signature goes next to it, ``<tag>.provenance.dsse.json``: a standard DSSE envelope
(payloadType ``application/vnd.in-toto+json``, payload = the statement's canonical JSON), which
is how in-toto attestations travel (cosign, in-toto verifiers read it). Each signature entry also
carries its ``public_key`` so the kit can state the trust level without ``--key``. The
signature and its check are :mod:`kit.evidence.signing`'s (DSSE PAE, ed25519 or ECDSA P-256); nothing is
re-implemented here. Example::

    envelope_path = sign_provenance(Path("builds/rlk-kit_smoke_cpu-….provenance.json"), key)
    problems, notes, trust = provenance_signature_problems(Path("builds/….provenance.json"))
    # ([], ["signed by ed25519 key 3f2a…, …"], "signed"); a changed field: [("/signatures/0", "…edited")]
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path

from kit.evidence.signing import ECDSA_P256, ED25519, UNSIGNED, dsse_envelope, seal_trust, sign_seal
from kit.model.documents import canonical_json, dumps_pretty, read_json_file, require_valid, schema_problems
from kit.model.errors import BadInput

PAYLOAD_TYPE = "application/vnd.in-toto+json"     # the in-toto attestation framework's DSSE type
ENVELOPE_SCHEMA = "rlk-kit/dsse-envelope/v2"     # v1 envelopes (ed25519 only) are v2 envelopes
SUFFIX = ".dsse.json"


def envelope_path(statement_path: Path) -> Path:
    """``x.provenance.json`` → ``x.provenance.dsse.json`` (the signature lives next to the statement)."""
    return statement_path.with_name(statement_path.name.removesuffix(".json") + SUFFIX)


def is_envelope(doc) -> bool:
    return isinstance(doc, dict) and "payloadType" in doc and "signatures" in doc and "payload" in doc


def sign_statement(statement: dict, private_key) -> dict:
    """The DSSE envelope of ``statement`` signed with ``private_key`` (ed25519 or ECDSA P-256)."""
    signature = sign_seal(statement, private_key, payload_type=PAYLOAD_TYPE)
    envelope = dsse_envelope({**statement, "signature": signature})
    envelope["signatures"][0]["public_key"] = signature["public_key"]
    return require_valid(envelope, "provenance envelope", as_schema=ENVELOPE_SCHEMA)


def sign_provenance(statement_path: Path, private_key) -> Path:
    """Sign the statement file and write its envelope next to it; the envelope's path.

    An existing envelope with other contents (another key, an older statement) is kept under a new
    name rather than overwritten: it may be someone's evidence."""
    envelope = sign_statement(read_json_file(statement_path), private_key)
    path = envelope_path(statement_path)
    data = dumps_pretty(envelope).encode()
    if path.exists() and path.read_bytes() != data:
        stamp = 1
        while path.with_name(f"{path.name.removesuffix(SUFFIX)}.replaced-{stamp}{SUFFIX}").exists():
            stamp += 1
        path.rename(path.with_name(f"{path.name.removesuffix(SUFFIX)}.replaced-{stamp}{SUFFIX}"))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def envelope_statement(envelope: dict) -> dict:
    """The statement an envelope carries (BadInput when the payload is not base64 JSON)."""
    try:
        return json.loads(base64.b64decode(envelope["payload"], validate=True))
    except (binascii.Error, ValueError, TypeError) as exc:
        raise BadInput(f"the envelope's payload is not base64 of a JSON statement: {exc}") from None


def envelope_problems(envelope: dict, statement: dict, *, public_key=None) -> tuple[list[tuple[str, str]], str, str]:
    """``(problems, trust, words)``: every signature of ``envelope`` must be an ed25519 or ECDSA P-256 DSSE signature
    over ``statement``'s canonical JSON (so any changed field is a problem), and by ``public_key`` when given."""
    problems = [(p or "/", m) for p, m in schema_problems(envelope, as_schema=ENVELOPE_SCHEMA)]
    if problems:
        return problems, UNSIGNED, "the envelope is malformed"
    if envelope["payloadType"] != PAYLOAD_TYPE:
        return [("/payloadType", f"is {envelope['payloadType']!r}, a provenance envelope has {PAYLOAD_TYPE!r}")], \
            UNSIGNED, "not a provenance envelope"
    if base64.b64decode(envelope["payload"]) != canonical_json(statement):
        problems.append(("/payload", "is not this statement: the statement or the envelope was changed"))
    levels = []
    for index, entry in enumerate(envelope["signatures"]):
        algorithm = ED25519 if len(base64.b64decode(entry["public_key"])) == 32 else ECDSA_P256
        signature = {"algorithm": algorithm, "scheme": "dsse-v1", "payload_type": envelope["payloadType"],
                     "keyid": entry.get("keyid") or None, "public_key": entry["public_key"], "value": entry["sig"]}
        level, words, found = seal_trust({**statement, "signature": signature}, public_key)
        levels.append((level, words))
        problems += [(f"/signatures/{index}", m.replace("the seal", "the provenance")) for m in found]
    best = max(levels, key=lambda lw: ("unsigned", "signed", "trusted").index(lw[0]))
    return problems, best[0], best[1]


def provenance_signature_problems(path: Path, doc: dict, *, public_key=None, require_signature: bool = False
                                  ) -> tuple[list[tuple[str, str]], list[str], str, dict]:
    """For ``kit verify PATH``: ``(problems, notes, trust, statement)`` of a statement file (its envelope
    is the sibling ``.dsse.json``, when there is one) or of an envelope file."""
    if is_envelope(doc):
        envelope, statement = doc, envelope_statement(doc)
    else:
        statement, sibling = doc, envelope_path(path)
        envelope = read_json_file(sibling) if sibling.is_file() else None
    if envelope is None:
        problems = []
        if require_signature or public_key is not None:
            problems = [("/", f"the provenance is unsigned (no {envelope_path(path).name} next to it); "
                              "sign it with kit build --sign-key")]
        return problems, ["unsigned: no .dsse.json next to it, integrity only"], UNSIGNED, statement
    problems, trust, words = envelope_problems(envelope, statement, public_key=public_key)
    return problems, [words], trust, statement
