"""OpenSSF model signing's format, written and checked without its library: a directory's files as one signature.

``model_signing sign key DIR --private_key K --signature SIG`` (PyPI ``model-signing``, the ML field's
standard for "these files, these hashes, this signer") writes a Sigstore bundle (media type
``application/vnd.dev.sigstore.bundle.v0.3+json``) holding a DSSE envelope whose payload is an in-toto
Statement v1: one subject (the directory's name, and a sha256 over every file's digest in order),
predicate type ``https://model_signing/signature/v1.0``, the files and their sha256 in
``predicate.resources``, how they were listed in ``predicate.serialization`` (``method: files``, the
ignored paths). Key mode signs with an elliptic-curve key: ECDSA over ``PAE(payloadType, payload)``;
the bundle names the key only by a hint, the sha256 of its PEM SubjectPublicKeyInfo.

The kit writes that format for a signed run (``model.sig``, sealed with the run) and reads it back for
``kit verify --model-signature SIG --key PUB DIR``, over any directory, whoever signed it. Only the
``files`` method with sha256 and no links is read (what ``model_signing sign key`` does by default).
Example::

    bundle = sign_digests("r1", {"run.log": "ab…", "manifest.json": "cd…"}, ["model.sig", "seal.json"], key)
    digests, ignored = bundle_digests(bundle, public_key)     # ({"manifest.json": "cd…", ...}, [...])
    problems = directory_problems(Path("ws/runs/r1"), digests, ignored + ["model.sig"])
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from pathlib import Path, PurePosixPath

from kit.evidence.files import hash_bounded, walk_run_dir
from kit.evidence.signing import ECDSA_P256, algorithm_of, pae, public_pem, sign_bytes, verify_bytes
from kit.model.documents import read_json_file, require_valid
from kit.model.errors import BadInput

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
# model_signing ignores these in every directory unless told --no-ignore-git-paths
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")
MAX_BUNDLE_BYTES = 16 << 20
BUNDLE_SCHEMA = "rlk-kit/model-signing-bundle/v1"     # what the kit writes; it reads any key-mode bundle


def key_hint(public_key) -> str:
    """What a key-mode bundle names its key by: sha256 of the PEM SubjectPublicKeyInfo, hex."""
    return hashlib.sha256(public_pem(public_key)).hexdigest()


def _sort_key(path: str):
    return PurePosixPath(path).parts


def model_statement(name: str, digests: dict[str, str], ignore_paths: list[str]) -> dict:
    """The in-toto statement model signing signs for a directory named ``name`` holding ``digests``."""
    resources = [{"name": p, "algorithm": "sha256", "digest": digests[p]} for p in sorted(digests, key=_sort_key)]
    root = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in resources)).hexdigest()
    return {"_type": STATEMENT_TYPE, "subject": [{"name": name, "digest": {"sha256": root}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {"serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                                            "ignore_paths": sorted(ignore_paths)},
                          "resources": resources}}


def sign_digests(name: str, digests: dict[str, str], ignore_paths: list[str], private_key) -> dict:
    """A key-mode model-signing bundle over ``digests`` (an ECDSA P-256 key: model signing takes no ed25519)."""
    if algorithm_of(private_key) != ECDSA_P256:
        raise BadInput("a model-signing signature needs an ECDSA P-256 key (kit keys new --type ecdsa-p256)")
    payload = json.dumps(model_statement(name, digests, ignore_paths), sort_keys=True).encode()
    signature = sign_bytes(private_key, pae(IN_TOTO_PAYLOAD_TYPE, payload))
    bundle = {"mediaType": BUNDLE_MEDIA_TYPE,
              "verificationMaterial": {"publicKey": {"hint": key_hint(private_key.public_key())}, "tlogEntries": []},
              "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": IN_TOTO_PAYLOAD_TYPE,
                               "signatures": [{"sig": base64.b64encode(signature).decode(), "keyid": ""}]}}
    return require_valid(bundle, "model signature", as_schema=BUNDLE_SCHEMA)


def read_bundle(path: Path, flag: str = "--model-signature") -> dict:
    """A bundle file, read bounded; BadInput naming ``flag`` when it is not one."""
    doc = read_json_file(path, limit=MAX_BUNDLE_BYTES)
    if not isinstance(doc, dict) or not isinstance(doc.get("dsseEnvelope"), dict):
        raise BadInput(f"{flag} {path}: not a model-signing signature (a Sigstore bundle with a dsseEnvelope, as "
                       "model_signing sign key writes)")
    return doc


def bundle_digests(bundle: dict, public_key) -> tuple[dict[str, str], list[str], list[str]]:
    """``(digests, ignore_paths, problems)`` of a key-mode bundle checked with ``public_key``: the signature
    over the DSSE PAE, the statement's type, predicate and root digest. Digests are empty when a problem
    means its list cannot be trusted; a bundle of any other shape is a problem, never an exception."""
    try:
        return _bundle_digests(bundle, public_key)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, binascii.Error) as exc:
        return {}, [], [f"not a model-signing bundle of the expected shape ({type(exc).__name__}: {exc})"]


def _bundle_digests(bundle: dict, public_key) -> tuple[dict[str, str], list[str], list[str]]:
    if algorithm_of(public_key) != ECDSA_P256:
        return {}, [], ["model signing's key mode signs with ECDSA keys; --key must be an ECDSA P-256 public key "
                        "(kit keys new --type ecdsa-p256)"]
    problems = []
    if bundle.get("mediaType") != BUNDLE_MEDIA_TYPE:
        problems.append(f"mediaType {bundle.get('mediaType')!r}, a model-signing bundle has {BUNDLE_MEDIA_TYPE!r}")
    envelope = bundle["dsseEnvelope"]
    material = bundle.get("verificationMaterial") or {}
    if any(k in material for k in ("certificate", "x509CertificateChain")):
        return {}, [], ["a keyless (Sigstore certificate) bundle: check it with model_signing verify sigstore "
                        "--identity ... --identity_provider ...; kit verify reads key-mode bundles (docs/evidence.md)"]
    hint = (material.get("publicKey") or {}).get("hint")
    if hint and hint != key_hint(public_key):
        problems.append(f"signed by key {str(hint)[:16]}, not by the --key {key_hint(public_key)[:16]} "
                        "(key hints: sha256 of the PEM public key)")
    try:
        payload = base64.b64decode(envelope["payload"], validate=True)
        sigs = envelope["signatures"]
        sig = base64.b64decode(sigs[0]["sig"], validate=True)
        payload_type = envelope["payloadType"]
    except (KeyError, IndexError, TypeError, binascii.Error, ValueError) as exc:
        return {}, [], problems + [f"the envelope is malformed ({type(exc).__name__}: {exc})"]
    if payload_type != IN_TOTO_PAYLOAD_TYPE:
        problems.append(f"payloadType {payload_type!r}, expected {IN_TOTO_PAYLOAD_TYPE!r}")
    if not verify_bytes(public_key, sig, pae(payload_type, payload)):
        return {}, [], problems + ["the signature does not match its payload under this key: edited, or another "
                                   "key signed it"]
    if problems:
        return {}, [], problems
    try:
        statement = json.loads(payload)
        subject = statement["subject"]
        predicate = statement["predicate"]
        serialization = predicate["serialization"]
        resources = {r["name"]: r["digest"] for r in predicate["resources"]}
        order = [r["digest"] for r in predicate["resources"]]
    except (ValueError, KeyError, TypeError) as exc:
        return {}, [], [f"the signed statement is not a model-signing statement ({type(exc).__name__}: {exc})"]
    if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
        return {}, [], [f"the signed statement is {statement.get('_type')!r} / {statement.get('predicateType')!r}, "
                        f"expected {STATEMENT_TYPE} / {PREDICATE_TYPE}"]
    if serialization.get("method") != "files" or serialization.get("hash_type") != "sha256":
        return {}, [], [f"serialization {serialization.get('method')!r} with {serialization.get('hash_type')!r}: kit "
                        "verify reads the 'files' method with sha256 (model_signing sign key's default)"]
    try:
        root = hashlib.sha256(b"".join(bytes.fromhex(d) for d in order)).hexdigest()
    except (ValueError, TypeError):
        return {}, [], ["a resource digest is not hex"]
    if len(subject) != 1 or (subject[0].get("digest") or {}).get("sha256") != root:
        return {}, [], ["the subject's digest is not the sha256 over the resources' digests: the statement is inconsistent"]
    if len(resources) != len(order):
        return {}, [], ["a resource is listed twice"]
    if not all(isinstance(n, str) and isinstance(d, str) for n, d in resources.items()):
        return {}, [], ["a resource's name or digest is not a string"]
    return resources, [str(p) for p in serialization.get("ignore_paths") or []], []


def _ignored(rel: str, ignore: list[str]) -> bool:
    return any(rel == p or rel.startswith(p + "/") for p in (i.strip("/") for i in ignore) if p)


def directory_digests(directory: Path, ignore: list[str]) -> tuple[dict[str, str], list[str]]:
    """``({path: sha256}, problems)`` of every regular file under ``directory`` not ignored (links refused, as
    model signing refuses them without --allow_symlinks)."""
    listing = walk_run_dir(Path(directory))
    problems = [f"{rel}: {why}" for rel, why in sorted(listing.refused.items()) if not _ignored(rel, ignore)]
    digests = {}
    for rel in sorted(listing.files):
        if _ignored(rel, ignore):
            continue
        try:
            digests[rel] = hash_bounded(Path(directory), rel, limit=None)[0]
        except OSError as exc:
            problems.append(f"{rel}: cannot read as a regular file ({exc.strerror or exc})")
    return digests, problems


def digest_differences(signed: dict[str, str], found: dict[str, str]) -> list[tuple[str, str]]:
    """``(path, what)`` for each file missing, extra or changed against the signed list."""
    out = [(p, "missing: signed, not in the directory") for p in sorted(set(signed) - set(found))]
    out += [(p, "extra: in the directory, not signed") for p in sorted(set(found) - set(signed))]
    out += [(p, f"changed: sha256 {found[p]}, signed {signed[p]}") for p in sorted(set(signed) & set(found))
            if signed[p] != found[p]]
    return out


def directory_problems(directory: Path, signature: Path, public_key) -> tuple[list[tuple[str, str]], list[str]]:
    """``(problems, notes)``: ``directory`` checked against the model-signing ``signature`` as
    ``model_signing verify key`` checks it (the signature file itself, git paths and the signed ignore list left out)."""
    bundle = read_bundle(signature)
    signed, ignore, found = bundle_digests(bundle, public_key)
    if found:
        return [("/", m) for m in found], []
    ignore = [*ignore, *GIT_PATHS]
    try:
        ignore.append(Path(signature).resolve().relative_to(Path(directory).resolve()).as_posix())
    except ValueError:
        pass     # the signature lies outside the directory
    digests, problems = directory_digests(directory, ignore)
    out = [("/", m) for m in problems] + [(f"/{p}", m) for p, m in digest_differences(signed, digests)]
    return out, [f"model signature {signature}: {len(signed)} files, ECDSA P-256 key {key_hint(public_key)[:16]}"]
