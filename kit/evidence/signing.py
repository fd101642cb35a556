"""Who vouches for a seal: ed25519 or ECDSA P-256 keys, DSSE signatures over the whole seal, trust levels.

A v2 seal is signed the way a DSSE envelope is (https://github.com/secure-systems-lab/dsse): the
signature covers ``PAE(payloadType, payload)`` where the payload is the canonical JSON of the seal
without its ``signature`` field, so every field the seal states is covered and the seal exports as
a standard envelope (:func:`dsse_envelope`). Two key types are taken: ed25519 (the kit's own since
seal v2) and ECDSA P-256 with SHA-256 (DER signatures), which OpenSSF model signing's ``key`` mode
requires (it takes only NIST curves). Three trust levels are stated in every verdict:

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
    import os
    import stat

    try:      # a key is a few hundred bytes of a regular file: never block on a FIFO or read a device whole
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise BadInput(f"{flag} {path}: not a regular file (a FIFO, device or directory); give the {what} file")
            with os.fdopen(os.dup(fd), "rb") as fh:
                raw = fh.read(64 * 1024 + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise BadInput(f"{flag} {path}: cannot read the {what} ({exc.strerror or exc})") from None
    if len(raw) > 64 * 1024:
        raise BadInput(f"{flag} {path}: over 64 KiB, not a {what}")
    return raw


ED25519, ECDSA_P256 = "ed25519", "ecdsa-p256-sha256"
KEY_TYPES = (ED25519, ECDSA_P256)
ACCEPTED_PRIVATE = "PEM PKCS#8 (unencrypted) of an ed25519 or ECDSA P-256 key, or 32 raw ed25519 bytes"
ACCEPTED_PUBLIC = "PEM SubjectPublicKeyInfo of an ed25519 or ECDSA P-256 key, or an ed25519 key as 32 raw bytes, hex or base64"


def algorithm_of(key) -> str | None:
    """``"ed25519"`` or ``"ecdsa-p256-sha256"`` for a private or public key of those kinds, else None."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    if isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        return ED25519
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and key.curve.name == "secp256r1":
        return ECDSA_P256
    return None


def _load_key(path: Path, flag: str, what: str, accepted: str, parse):
    """Read ``path`` bounded, parse it with ``parse(raw)``; BadInput naming ``flag`` and what is accepted."""
    from cryptography.exceptions import UnsupportedAlgorithm

    raw = _read_key_bytes(path, what, flag)
    try:
        key = parse(raw)
    except (ValueError, TypeError, UnicodeDecodeError, UnsupportedAlgorithm) as exc:
        raise BadInput(f"{flag} {path}: not an {what} ({accepted}): {exc}") from None
    if algorithm_of(key) is None:
        curve = getattr(getattr(key, "curve", None), "name", None)
        kind = f"{type(key).__name__}{f' on {curve}' if curve else ''}"
        raise BadInput(f"{flag} {path}: is a {kind}, expected an ed25519 or ECDSA P-256 key (kit keys new makes one)")
    return key


def load_private_key(path: Path, flag: str = "--sign-key"):
    """An ed25519 or ECDSA P-256 private key: PEM (PKCS#8, unencrypted), or the raw 32 bytes of an ed25519 key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    def parse(raw: bytes):
        if raw.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_private_key(raw, password=None)
        if len(raw) == 32:
            return Ed25519PrivateKey.from_private_bytes(raw)
        raise ValueError("neither PEM nor 32 raw bytes")

    return _load_key(path, flag, "unencrypted private key", ACCEPTED_PRIVATE, parse)


def load_public_key(path: Path, flag: str = "--key"):
    """An ed25519 or ECDSA P-256 public key: PEM (SubjectPublicKeyInfo); an ed25519 key also as 32 raw bytes,
    or 64 hex / base64 text."""
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

    return _load_key(path, flag, "public key", ACCEPTED_PUBLIC, parse)


def public_raw(key) -> bytes:
    """The public key's bytes as a signature names them: the raw 32 bytes of an ed25519 key, the DER
    SubjectPublicKeyInfo of an ECDSA key (``key`` may be the private or the public key)."""
    from cryptography.hazmat.primitives import serialization

    public = key.public_key() if hasattr(key, "public_key") else key
    if algorithm_of(public) == ED25519:
        return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def public_pem(key) -> bytes:
    """PEM SubjectPublicKeyInfo of a private or public key (what ``kit keys new`` writes to ``.pub``)."""
    from cryptography.hazmat.primitives import serialization

    public = key.public_key() if hasattr(key, "public_key") else key
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def public_key_from_bytes(algorithm: str, raw: bytes):
    """The public key a signature embeds (:func:`public_raw`'s form); ValueError when it is not one."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if algorithm == ED25519:
        return Ed25519PublicKey.from_public_bytes(raw)
    if algorithm == ECDSA_P256:
        key = serialization.load_der_public_key(raw)
        if algorithm_of(key) != ECDSA_P256:
            raise ValueError("not an ECDSA P-256 public key")
        return key
    raise ValueError(f"algorithm {algorithm!r} is not one of {', '.join(KEY_TYPES)}")


def sign_bytes(private_key, data: bytes) -> bytes:
    """ed25519 (64 bytes) or ECDSA P-256 over SHA-256 (DER), as DSSE and the standard verifiers expect."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    if algorithm_of(private_key) == ECDSA_P256:
        return private_key.sign(data, ec.ECDSA(hashes.SHA256()))
    return private_key.sign(data)


def verify_bytes(public_key, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        if algorithm_of(public_key) == ECDSA_P256:
            public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        else:
            public_key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def sign_seal(seal: dict, private_key, payload_type: str = PAYLOAD_TYPE) -> dict:
    """The ``signature`` field of a v2+ seal: ed25519 or ECDSA P-256 over the DSSE PAE of the seal's
    canonical JSON. (``payload_type``: build provenance is signed the same way as an in-toto statement.)"""
    raw = public_raw(private_key)
    return {"algorithm": algorithm_of(private_key), "scheme": "dsse-v1", "payload_type": payload_type,
            "keyid": key_id(raw), "public_key": base64.b64encode(raw).decode(),
            "value": base64.b64encode(sign_bytes(private_key, pae(payload_type, seal_payload(seal)))).decode()}


def sign_document(doc: dict, private_key) -> dict:
    """A v1 seal's signature: ed25519 over the canonical JSON of the document without ``signature``."""
    return {"algorithm": "ed25519", "public_key": base64.b64encode(public_raw(private_key)).decode(),
            "value": base64.b64encode(private_key.sign(seal_payload(doc))).decode(),
            "signed_bytes": "canonical JSON of this document without the 'signature' field"}


def _signed_bytes(seal: dict) -> bytes:
    sig = seal["signature"]
    return pae(sig["payload_type"], seal_payload(seal)) if sig.get("scheme") == "dsse-v1" else seal_payload(seal)


def seal_trust(seal: dict, public_key=None) -> tuple[str, str, list[str]]:
    """``(level, words, problems)``: the trust level a seal earns and what is wrong with its signature.

    A bad signature is a problem whatever the level; ``public_key`` (from --key) makes any other
    signer a problem too."""
    sig = seal.get("signature")
    if not sig:
        problems = ["the seal is not signed; --key needs a seal signed with that key"] if public_key is not None else []
        return UNSIGNED, TRUST_WORDS[UNSIGNED], problems
    try:
        algorithm = sig.get("algorithm", ED25519)
        embedded = base64.b64decode(sig["public_key"], validate=True)
        value = base64.b64decode(sig["value"], validate=True)
        key = public_key_from_bytes(algorithm, embedded)
    except (ValueError, KeyError, TypeError) as exc:
        return UNSIGNED, TRUST_WORDS[UNSIGNED], [f"signature is malformed: {exc}"]
    words = f"signed by {'ed25519' if algorithm == ED25519 else 'ECDSA P-256'} key {key_id(embedded)[:16]}"
    if sig.get("keyid") not in (None, key_id(embedded)):
        return UNSIGNED, TRUST_WORDS[UNSIGNED], ["signature keyid does not name its public_key"]
    if not verify_bytes(key, value, _signed_bytes(seal)):
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


KEY_TYPE_CHOICES = {"ecdsa-p256": ECDSA_P256, "ed25519": ED25519}


def generate_private_key(kind: str):
    """A new private key: ``"ecdsa-p256"`` (every standard verifier takes it) or ``"ed25519"``."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    if KEY_TYPE_CHOICES.get(kind) == ECDSA_P256:
        return ec.generate_private_key(ec.SECP256R1())
    if KEY_TYPE_CHOICES.get(kind) == ED25519:
        return ed25519.Ed25519PrivateKey.generate()
    raise BadInput(f"--type {kind!r}: use one of {', '.join(KEY_TYPE_CHOICES)}")


def write_key_pair(base: Path, kind: str, *, force: bool = False) -> tuple[Path, Path, str]:
    """Write ``<base>.pem`` (PKCS#8 PEM, unencrypted, mode 0600) and ``<base>.pub`` (PEM SubjectPublicKeyInfo);
    ``(private path, public path, key id)``. Existing files are kept unless ``force``: a key may sign evidence."""
    import os

    from cryptography.hazmat.primitives import serialization

    text = str(base)
    base = Path(base)
    if not text or text.endswith("/") or base.name in ("", ".", "..") or "\n" in text or "\0" in text:
        raise BadInput(f"NAME {text!r}: give a file name without suffix, such as keys/seal")
    if base.suffix in (".pem", ".pub", ".key") and base.stem not in ("", ".", ".."):
        base = base.with_suffix("")
    private, public = base.with_name(base.name + ".pem"), base.with_name(base.name + ".pub")
    for path in (private, public):
        if path.is_dir():
            raise BadInput(f"NAME {base}: {path} is a directory; give another NAME")
        if (path.exists() or path.is_symlink()) and not force:
            raise BadInput(f"NAME {base}: {path} exists; give another NAME, or --force to replace the pair")
    key = generate_private_key(kind)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    try:
        private.parent.mkdir(parents=True, exist_ok=True)
        for path in (private, public):
            if force:
                path.unlink(missing_ok=True)
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        with open(public, "xb") as fh:
            fh.write(public_pem(key))
    except OSError as exc:
        raise BadInput(f"NAME {base}: cannot write {exc.filename or base} ({exc.strerror or exc}); give a writable "
                       "place") from None
    return private, public, key_id(public_raw(key))
