#!/usr/bin/env python3
"""Check a DSSE-enveloped in-toto attestation with the in-toto project's own libraries, without rlk-kit.

Needs only `pip install securesystemslib in-toto-attestation` (or `in-toto`, which brings
securesystemslib; `model-signing` brings in-toto-attestation). It imports nothing of the kit, so a
third party can read these ~100 lines, run them, and trust no more than securesystemslib's DSSE check
and sha256:

1. the envelope's signature (DSSE v1, PAE over payloadType and payload) verifies under PUB.pem
   (ed25519 or ECDSA P-256) with securesystemslib's `Envelope.verify`; the signature's keyid must be
   the sha256 of the key's bytes (raw 32 bytes for ed25519, DER SubjectPublicKeyInfo for ECDSA), as
   the kit writes it, so a signature by any other key is not even considered;
2. the payload is an in-toto Statement v1 (`in_toto_attestation`'s protobuf model validates it) of
   the expected predicate type;
3. with --dir: every subject names a regular file under DIR whose sha256 is the subject's, and every
   regular file under DIR except the seal and the signature files is a subject (so a changed byte,
   a removed file and an added file are each refused).

    python3 scripts/verify-in-toto.py --key seal.pub --dir RUN_DIR RUN_DIR/attestation.dsse.json
    python3 scripts/verify-in-toto.py --key build.pub --predicate-type https://slsa.dev/provenance/v1 X.provenance.dsse.json

Exit 0 verified, 1 refused (one line saying why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

RUN_PREDICATES = ("https://rlk-kit.dev/attestation/run/v2", "https://rlk-kit.dev/attestation/run/v1")
NOT_SUBJECTS = ("seal.json", "attestation.dsse.json", "model.sig")


def refuse(why: str) -> None:
    print(f"REFUSED: {why}")
    sys.exit(1)


def key_for(pem: bytes):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from securesystemslib.signer import SSlibKey

    public = serialization.load_pem_public_key(pem)
    if isinstance(public, ed25519.Ed25519PublicKey):
        raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    else:
        raw = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return SSlibKey.from_crypto(public, keyid=hashlib.sha256(raw).hexdigest())


def statement_of(envelope_path: Path, pem: bytes) -> dict:
    from google.protobuf import json_format
    from in_toto_attestation.v1 import statement, statement_pb2
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    try:
        envelope = Envelope.from_dict(json.loads(envelope_path.read_bytes()))
    except (ValueError, KeyError, TypeError) as exc:
        refuse(f"{envelope_path}: not a DSSE envelope ({exc})")
    try:
        envelope.verify([key_for(pem)], 1)
    except VerificationError as exc:
        refuse(f"{envelope_path}: no signature by this key verifies ({exc})")
    if envelope.payload_type != "application/vnd.in-toto+json":
        refuse(f"payloadType {envelope.payload_type!r} is not application/vnd.in-toto+json")
    doc = json.loads(envelope.payload)
    try:
        statement.Statement.copy_from_pb(json_format.ParseDict(doc, statement_pb2.Statement())).validate()
    except (ValueError, json_format.ParseError) as exc:
        refuse(f"the payload is not an in-toto Statement v1 ({exc})")
    return doc


def check_dir(doc: dict, root: Path) -> int:
    subjects = {}
    for subject in doc["subject"]:
        name, want = subject["name"], subject["digest"].get("sha256")
        parts = Path(name).parts
        if Path(name).is_absolute() or ".." in parts:
            refuse(f"subject {name!r} is not a path inside {root}")
        subjects[name] = want
    found = {}
    for top, dirs, files in os.walk(root):
        for name in files:
            path = Path(top, name)
            rel = path.relative_to(root).as_posix()
            if rel in NOT_SUBJECTS:
                continue
            if path.is_symlink() or not path.is_file():
                refuse(f"{rel}: not a regular file")
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    for name in sorted(set(subjects) - set(found)):
        refuse(f"{name}: a subject, missing from {root}")
    for name in sorted(set(found) - set(subjects)):
        refuse(f"{name}: in {root}, not a subject of the attestation")
    for name, want in sorted(subjects.items()):
        if found[name] != want:
            refuse(f"{name}: sha256 {found[name]}, the attestation says {want}")
    return len(subjects)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("envelope", type=Path, help="the DSSE envelope (attestation.dsse.json, *.provenance.dsse.json)")
    parser.add_argument("--key", type=Path, required=True, help="PEM public key of the signer (ed25519 or ECDSA P-256)")
    parser.add_argument("--dir", type=Path, help="the directory whose files the subjects name (a run dir)")
    parser.add_argument("--predicate-type", default=None,
                        help=f"the predicate type required (default with --dir: one of {', '.join(RUN_PREDICATES)})")
    args = parser.parse_args()
    doc = statement_of(args.envelope, args.key.read_bytes())
    wanted = (args.predicate_type,) if args.predicate_type else (RUN_PREDICATES if args.dir else ())
    if wanted and doc.get("predicateType") not in wanted:
        refuse(f"predicateType {doc.get('predicateType')!r}, expected {' or '.join(wanted)}")
    count = check_dir(doc, args.dir) if args.dir else len(doc["subject"])
    print(f"VERIFIED: {args.envelope} signed by {args.key}; {count} subjects; predicate {doc['predicateType']}")


if __name__ == "__main__":
    main()
