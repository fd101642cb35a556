"""Who vouches for a seal: ed25519 keys, DSSE signatures over the whole seal, and trust levels.

A v2 seal is signed the way a DSSE envelope is (https://github.com/secure-systems-lab/dsse): the
signature covers ``PAE(payloadType, payload)`` where the payload is the canonical JSON of the seal
without its ``signature`` field, so every field the seal states is covered and the seal exports as
a standard envelope (:func:`dsse_envelope`). Three trust levels are stated in every verdict:

* ``unsigned``   integrity only: the files match the seal, but anyone could have written it;
* ``signed``     signed by the key the seal embeds (its id is named), which nobody vouched for;
* ``trusted``    signed by the key the user named with ``--key``.

Example::

    key = load_private_key(Path("seal.key"))
    seal["signature"] = sign_seal(seal, key)
    seal_trust(seal, public_key=None)          # ('signed', 'signed by ed25519 key 3f2a…', [])
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from kit.model.documents import canonical_json
from kit.model.errors import BadInput

PAYLOAD_TYPE = "application/vnd.rlk-kit.seal+json"
UNSIGNED, SIGNED, TRUSTED = "unsigned", "signed", "trusted"
TRUST_WORDS = {UNSIGNED: "unsigned: integrity only, anyone could have made this seal",
               SIGNED: "signed by a key nobody named (pass --key PUB to hold it to yours)",
               TRUSTED: "signed by the key given with --key"}


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: ``DSSEv1 <len> <type> <len> <body>``."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def seal_payload(seal: dict) -> bytes:
    return canonical_json({k: v for k, v in seal.items() if k != "signature"})


def key_id(raw_public: bytes) -> str:
    return hashlib.sha256(raw_public).hexdigest()


def _read_key_bytes(path: Path, what: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(64 * 1024 + 1)          # a key is a few hundred bytes; never read a device whole
    except OSError as exc:
        raise BadInput(f"{flag} {path}: cannot read the {what} ({exc.strerror or exc})") from None
    if len(raw) > 64 * 1024:
        raise BadInput(f"{flag} {path}: over 64 KiB, not a {what}")
    return raw


def _load_key(path: Path, flag: str, what: str, accepted: str, expected_type, parse):
    """Read ``path`` bounded, parse it with ``parse(raw)``; BadInput naming ``flag`` and what is accepted."""
    from cryptography.exceptions import UnsupportedAlgorithm

    raw = _read_key_bytes(path, what, flag)
    try:
        key = parse(raw)
    except (ValueError, TypeError, UnicodeDecodeError, UnsupportedAlgorithm) as exc:
        raise BadInput(f"{flag} {path}: not an {what} ({accepted}): {exc}") from None
    if not isinstance(key, expected_type):
        raise BadInput(f"{flag} {path}: is a {type(key).__name__}, expected an ed25519 key")
    return key


def load_private_key(path: Path):
    """An ed25519 private key: PEM (PKCS#8, unencrypted) or the raw 32 bytes."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    def parse(raw: bytes):
        if raw.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_private_key(raw, password=None)
        if len(raw) == 32:
            return Ed25519PrivateKey.from_private_bytes(raw)
        raise ValueError("neither PEM nor 32 raw bytes")

    return _load_key(path, "--sign-key", "unencrypted ed25519 private key", "PEM PKCS#8 or 32 raw bytes",
                     Ed25519PrivateKey, parse)


def load_public_key(path: Path):
    """An ed25519 public key: PEM (SubjectPublicKeyInfo), 32 raw bytes, or 64 hex / base64 text."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    def parse(raw: bytes):
        if raw.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_public_key(raw)
        if len(raw) == 32:
            return Ed25519PublicKey.from_public_bytes(raw)
        text = raw.decode("ascii").strip()
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text) if len(text) == 64
                                                  else base64.b64decode(text, validate=True))

    return _load_key(path, "--key", "ed25519 public key", "PEM, 32 raw bytes, hex or base64", Ed25519PublicKey, parse)


def public_raw(key) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def sign_seal(seal: dict, private_key, payload_type: str = PAYLOAD_TYPE) -> dict:
    """The ``signature`` field of a v2 seal: ed25519 over the DSSE PAE of the seal's canonical JSON.
    (``payload_type``: build provenance is signed the same way as an in-toto statement.)"""
    raw = public_raw(private_key.public_key())
    return {"algorithm": "ed25519", "scheme": "dsse-v1", "payload_type": payload_type, "keyid": key_id(raw),
            "public_key": base64.b64encode(raw).decode(),
            "value": base64.b64encode(private_key.sign(pae(payload_type, seal_payload(seal)))).decode()}


def sign_document(doc: dict, private_key) -> dict:
    """A v1 seal's signature: ed25519 over the canonical JSON of the document without ``signature``."""
    return {"algorithm": "ed25519", "public_key": base64.b64encode(public_raw(private_key.public_key())).decode(),
            "value": base64.b64encode(private_key.sign(seal_payload(doc))).decode(),
            "signed_bytes": "canonical JSON of this document without the 'signature' field"}


def _signed_bytes(seal: dict) -> bytes:
    sig = seal["signature"]
    return pae(sig["payload_type"], seal_payload(seal)) if sig.get("scheme") == "dsse-v1" else seal_payload(seal)


def seal_trust(seal: dict, public_key=None) -> tuple[str, str, list[str]]:
    """``(level, words, problems)``: the trust level a seal earns and what is wrong with its signature.

    A bad signature is a problem whatever the level; ``public_key`` (from --key) makes any other
    signer a problem too."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    sig = seal.get("signature")
    if not sig:
        problems = ["the seal is not signed; --key needs a seal signed with that key"] if public_key is not None else []
        return UNSIGNED, TRUST_WORDS[UNSIGNED], problems
    try:
        embedded = base64.b64decode(sig["public_key"], validate=True)
        value = base64.b64decode(sig["value"], validate=True)
        key = Ed25519PublicKey.from_public_bytes(embedded)
    except (ValueError, KeyError, TypeError) as exc:
        return UNSIGNED, TRUST_WORDS[UNSIGNED], [f"signature is malformed: {exc}"]
    words = f"signed by ed25519 key {key_id(embedded)[:16]}"
    if sig.get("keyid") not in (None, key_id(embedded)):
        return UNSIGNED, TRUST_WORDS[UNSIGNED], ["signature keyid does not name its public_key"]
    try:
        key.verify(value, _signed_bytes(seal))
    except InvalidSignature:
        return UNSIGNED, TRUST_WORDS[UNSIGNED], ["signature does not match the seal's content: the seal was edited"]
    if public_key is not None and public_raw(public_key) != embedded:
        return SIGNED, words, [f"signed by key {key_id(embedded)[:16]}, not by the --key {key_id(public_raw(public_key))[:16]}"]
    if public_key is not None:
        return TRUSTED, f"{words}, the key given with --key", []
    return SIGNED, f"{words}, which nobody named (pass --key PUB to hold it to yours)", []


def policy_problems(level: str, *, require_signature: bool) -> list[str]:
    """What ``--require-signature`` refuses: an unsigned seal."""
    if require_signature and level == UNSIGNED:
        return ["--require-signature: the seal is unsigned (integrity only); sign runs with kit run --sign-key"]
    return []


def dsse_envelope(seal: dict) -> dict:
    """The signed seal as a standard DSSE envelope (payload base64, one signature)."""
    sig = seal["signature"]
    return {"payloadType": sig.get("payload_type", PAYLOAD_TYPE),
            "payload": base64.b64encode(seal_payload(seal)).decode(),
            "signatures": [{"keyid": sig.get("keyid", ""), "sig": sig["value"]}]}
