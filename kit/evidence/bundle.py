"""Evidence: run directories, the seal, verification and comparison of runs.

A run directory ``<workspace>/runs/<run-id>/`` is created exclusively and its id is recorded in
``<workspace>/runs/.ids``, so an id is never used twice anywhere in the workspace. Artifacts are
written once; ``seal.json`` is written last and atomically: sha256 of every artifact, a root hash
over the sorted ``sha256sum``-style list, the manifest's hash, optionally an ed25519 signature.
After sealing the files are made read-only and nothing writes there again. Example::

    run_dir = create_run_dir(Path(".workspace"), "smoke-r1")
    ...                                       # manifest.json, run.log, metrics.jsonl, ...
    seal_run_dir(run_dir)
    verify_run_dir(run_dir).status            # "ok"
"""

from __future__ import annotations

import base64
import datetime as _dt
import fcntl
import hashlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from kit.model.documents import (canonical_json, read_json_file, schema_id, schema_problems, write_new_document)
from kit.model.errors import BadInput, CheckFailed, KitError

SEAL = "seal.json"
MANIFEST = "manifest.json"
VALIDATION = "validation.json"
STATUS = "status.json"
RUN_LOG = "run.log"
METRICS = "metrics.jsonl"
ARM_FILE = "arm.json"
KIT_LOG = "kit.log"
RUNS_DIR = "runs"
ID_REGISTRY = ".ids"
SEAL_SCHEMA = schema_id("seal")
MANIFEST_SCHEMA = schema_id("run-manifest")
IN_TOTO_STATEMENT = "https://in-toto.io/Statement/v1"
IN_TOTO_PREDICATE = "https://rlk-kit.dev/attestation/run-seal/v1"
IN_TOTO_SCHEMA = "rlk-kit/in-toto-run-seal/v1"   # shipped schema of the statement (it has no 'schema' field)
HASH_WORKERS = 4


UTC_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime(UTC_FORMAT)


def parse_utc(text: str) -> _dt.datetime:
    """A time written by :func:`utc_now` (``2025-01-31T12:00:00.000000Z``), timezone-aware."""
    return _dt.datetime.strptime(text, UTC_FORMAT).replace(tzinfo=_dt.timezone.utc)


# --- run directories --------------------------------------------------------------------------------

@contextmanager
def _registry_lock(runs: Path):
    try:
        runs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--workspace {runs.parent}: cannot create {runs}: {exc.strerror or exc}; "
                       "give a writable directory") from None
    with open(runs / f"{ID_REGISTRY}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def registered_run_ids(workspace: Path) -> set[str]:
    path = Path(workspace) / RUNS_DIR / ID_REGISTRY
    if not path.is_file():
        return set()
    return {line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}


def run_id_in_use(workspace: Path, run_id: str) -> str | None:
    """Where the id is already used (the registry or any directory of that name in the workspace)."""
    workspace = Path(workspace)
    if run_id in registered_run_ids(workspace):
        return f"{workspace / RUNS_DIR / ID_REGISTRY}"
    # suites keep their runs one or two levels down; ids are global across all of them
    for pattern in (f"{RUNS_DIR}/{run_id}", f"*/{run_id}", f"*/*/{run_id}", f"*/*/{RUNS_DIR}/{run_id}"):
        for hit in workspace.glob(pattern):
            if hit.is_dir():
                return str(hit)
    return None


def create_run_dir(workspace: Path, run_id: str) -> Path:
    """Register the id and create the run dir exclusively; a used id is bad input (exit 2)."""
    workspace = Path(workspace)
    runs = workspace / RUNS_DIR
    with _registry_lock(runs):
        used = run_id_in_use(workspace, run_id)
        if used:
            raise BadInput(f"--run-id {run_id}: already used in this workspace ({used}); run ids are never reused, "
                           "pick a new one")
        with open(runs / ID_REGISTRY, "a", encoding="utf-8") as fh:
            fh.write(run_id + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        run_dir = runs / run_id
        run_dir.mkdir(exist_ok=False)
    return run_dir


def is_sealed(run_dir: Path) -> bool:
    return (Path(run_dir) / SEAL).exists()


def _refuse_if_sealed(run_dir: Path) -> None:
    if is_sealed(run_dir):
        raise CheckFailed(f"{run_dir}: sealed; a sealed run dir is never written again")


def write_new_text(run_dir: Path, name: str, text: str) -> Path:
    """Write one artifact exclusively (never replacing anything) into an unsealed run dir."""
    _refuse_if_sealed(run_dir)
    path = Path(run_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "x", encoding="utf-8") as fh:
        fh.write(text)
    return path


def write_document(run_dir: Path, name: str, doc: dict) -> Path:
    _refuse_if_sealed(run_dir)
    return write_new_document(Path(run_dir) / name, doc)


def replace_status(run_dir: Path, doc: dict) -> Path:
    """Replace a detached run's status.json with its final one, atomically (``kit run --attach``).

    The only artifact ever rewritten, and only while the status says ``detached``: a final status is
    written once, and a sealed run dir is never written again."""
    from kit.model.documents import replace_document

    _refuse_if_sealed(run_dir)
    path = Path(run_dir) / STATUS
    current = status_of(Path(run_dir))
    if current != "detached":
        raise CheckFailed(f"{path}: status is {current}; only a detached run's status is replaced")
    return replace_document(path, doc)


# --- hashing -------------------------------------------------------------------------------------------

def artifact_paths(run_dir: Path) -> list[str]:
    """Every file under the run dir except the seal itself, as sorted POSIX paths."""
    run_dir = Path(run_dir)
    out = []
    for dirpath, dirnames, filenames in os.walk(run_dir):
        dirnames.sort()
        for name in filenames:
            rel = Path(dirpath, name).relative_to(run_dir).as_posix()
            if rel != SEAL:
                out.append(rel)
    return sorted(out)


def _hash_one(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while True:
            block = fh.read(1 << 22)
            if not block:
                break
            size += len(block)
            h.update(block)
    return h.hexdigest(), size


def hash_artifacts(run_dir: Path, paths: list[str]) -> dict[str, tuple[str, int]]:
    """``{path: (sha256, size)}``; files are hashed in parallel (hashlib releases the GIL)."""
    run_dir = Path(run_dir)
    with ThreadPoolExecutor(max_workers=min(HASH_WORKERS, max(1, len(paths)))) as pool:
        results = pool.map(lambda rel: _hash_one(run_dir / rel), paths)
        return dict(zip(paths, results))


def root_sha256(artifacts: list[dict]) -> str:
    """sha256 over ``<sha256>  <path>\\n`` lines sorted by path (``sha256sum -c`` reads the same lines)."""
    lines = "".join(f"{a['sha256']}  {a['path']}\n" for a in sorted(artifacts, key=lambda a: a["path"]))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


# --- the seal ----------------------------------------------------------------------------------------------

def build_seal(run_dir: Path, *, run_id: str, validation_passed: bool, gate_set_version: str) -> dict:
    from kit import __version__

    run_dir = Path(run_dir)
    paths = artifact_paths(run_dir)
    if MANIFEST not in paths:
        raise CheckFailed(f"{run_dir}: no {MANIFEST}; only a run with a manifest can be sealed")
    hashed = hash_artifacts(run_dir, paths)
    artifacts = [{"path": p, "sha256": hashed[p][0], "size": hashed[p][1]} for p in paths]
    return {
        "schema": SEAL_SCHEMA,
        "run_id": run_id,
        "sealed_at": utc_now(),
        "kit_version": __version__,
        "algorithm": "sha256",
        "artifacts": artifacts,
        "root_sha256": root_sha256(artifacts),
        "manifest_sha256": hashed[MANIFEST][0],
        "validation_passed": validation_passed,
        "gate_set_version": gate_set_version,
    }


def seal_run_dir(run_dir: Path, *, run_id: str, validation_passed: bool, gate_set_version: str,
                 sign_key: Path | None = None, private_key=None) -> dict:
    """Write seal.json last and atomically, then make every file read-only.

    ``private_key`` (loaded with :func:`load_private_key` before the run started) or ``sign_key``
    (a path, loaded now) signs the seal."""
    run_dir = Path(run_dir)
    _refuse_if_sealed(run_dir)
    if private_key is None and sign_key is not None:
        private_key = load_private_key(sign_key)
    seal = build_seal(run_dir, run_id=run_id, validation_passed=validation_passed, gate_set_version=gate_set_version)
    if private_key is not None:
        seal["signature"] = sign_document(seal, private_key)
    write_new_document(run_dir / SEAL, seal)
    for rel in [*artifact_paths(run_dir), SEAL]:
        path = run_dir / rel
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    return seal


# --- signing -----------------------------------------------------------------------------------------------

def _read_key_bytes(path: Path, what: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise BadInput(f"{flag} {path}: cannot read the {what} ({exc.strerror or exc})") from None


def load_private_key(path: Path):
    """An ed25519 private key: PEM (PKCS#8, unencrypted) or the raw 32 bytes."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    raw = _read_key_bytes(path, "ed25519 private key", "--sign-key")
    try:
        if raw.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_private_key(raw, password=None)
        elif len(raw) == 32:
            key = Ed25519PrivateKey.from_private_bytes(raw)
        else:
            raise ValueError("neither PEM nor 32 raw bytes")
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise BadInput(f"--sign-key {path}: not an unencrypted ed25519 private key (PEM PKCS#8 or 32 raw bytes): {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BadInput(f"--sign-key {path}: is a {type(key).__name__}, expected an ed25519 key")
    return key


def load_public_key(path: Path):
    """An ed25519 public key: PEM (SubjectPublicKeyInfo), 32 raw bytes, or 64 hex / base64 text."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    raw = _read_key_bytes(path, "ed25519 public key", "--key")
    try:
        if raw.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(raw)
        elif len(raw) == 32:
            key = Ed25519PublicKey.from_public_bytes(raw)
        else:
            text = raw.decode("ascii").strip()
            data = bytes.fromhex(text) if len(text) == 64 else base64.b64decode(text, validate=True)
            key = Ed25519PublicKey.from_public_bytes(data)
    except (ValueError, TypeError, UnicodeDecodeError, UnsupportedAlgorithm) as exc:
        raise BadInput(f"--key {path}: not an ed25519 public key (PEM, 32 raw bytes, hex or base64): {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BadInput(f"--key {path}: is a {type(key).__name__}, expected an ed25519 key")
    return key


def _public_raw(key) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def sign_document(doc: dict, private_key) -> dict:
    """ed25519 over the canonical JSON of the document without its ``signature`` field."""
    payload = canonical_json({k: v for k, v in doc.items() if k != "signature"})
    return {"algorithm": "ed25519", "public_key": base64.b64encode(_public_raw(private_key.public_key())).decode(),
            "value": base64.b64encode(private_key.sign(payload)).decode(),
            "signed_bytes": "canonical JSON of this document without the 'signature' field"}


def signature_problems(doc: dict, public_key) -> list[str]:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    sig = doc.get("signature")
    if not sig:
        return ["the seal is not signed"]
    try:
        embedded = base64.b64decode(sig["public_key"], validate=True)
        value = base64.b64decode(sig["value"], validate=True)
    except (ValueError, KeyError) as exc:
        return [f"signature is malformed: {exc}"]
    key = public_key or Ed25519PublicKey.from_public_bytes(embedded)
    if public_key is not None and _public_raw(public_key) != embedded:
        return ["signed with a different key than --key"]
    try:
        key.verify(value, canonical_json({k: v for k, v in doc.items() if k != "signature"}))
    except InvalidSignature:
        return ["signature does not match the seal's content"]
    return []


# --- verification --------------------------------------------------------------------------------------------

def verify_run_dir(path: Path, public_key: Path | None = None, in_toto_out: Path | None = None):
    """Re-hash every artifact against the seal; name every missing, changed or extra file."""
    from kit.evidence.verify import FileVerdict

    run_dir = Path(path)
    verdict = FileVerdict(str(run_dir), kind="run")
    seal_path = run_dir / SEAL
    registered = (run_dir.parent / ID_REGISTRY).is_file()   # made by create_run_dir, even if it stopped at once
    if not registered and not any((run_dir / name).is_file() for name in (SEAL, STATUS, MANIFEST)):
        # Not a run dir at all (a folder of locks, say): unusable input, not a failed check.
        verdict.status, verdict.kind = "unreadable", "unknown"
        verdict.problems.append(("", f"not a run directory (no {SEAL}, {STATUS} or {MANIFEST}); give a run dir "
                                     f"<workspace>/runs/<run-id> or lock files such as {run_dir}/*.json"))
        return verdict
    if not seal_path.is_file():
        status = status_of(run_dir)
        verdict.status = "fail"
        verdict.problems.append((f"/{SEAL}", f"missing: the run was not sealed (status {status})"))
        return verdict
    try:
        seal = read_json_file(seal_path)
    except KitError as exc:
        verdict.status = "fail"
        verdict.problems.append((f"/{SEAL}", str(exc).split(": ", 1)[-1]))
        return verdict
    problems = [(f"/{SEAL}{p}", m) for p, m in schema_problems(seal, "seal")]
    if problems:
        verdict.status, verdict.problems = "fail", problems
        return verdict
    listed = {a["path"]: a for a in seal["artifacts"]}
    on_disk = set(artifact_paths(run_dir))
    present = sorted(set(listed) & on_disk)
    hashed = hash_artifacts(run_dir, present)
    for rel in sorted(listed):
        if rel not in on_disk:
            problems.append((f"/{rel}", "missing: listed in the seal, not in the run dir"))
        elif hashed[rel][0] != listed[rel]["sha256"]:
            problems.append((f"/{rel}", f"changed: sha256 {hashed[rel][0]}, sealed {listed[rel]['sha256']}"))
    for rel in sorted(on_disk - set(listed)):
        problems.append((f"/{rel}", "extra: not in the seal (added after sealing)"))
    if root_sha256(seal["artifacts"]) != seal["root_sha256"]:
        problems.append((f"/{SEAL}/root_sha256", "does not match the listed artifacts: the seal was edited"))
    if listed.get(MANIFEST, {}).get("sha256") != seal["manifest_sha256"]:
        problems.append((f"/{SEAL}/manifest_sha256", "does not match the sealed manifest.json"))
    if (run_dir / MANIFEST).is_file() and MANIFEST in present and hashed[MANIFEST][0] == listed[MANIFEST]["sha256"]:
        try:
            for p, m in schema_problems(read_json_file(run_dir / MANIFEST), "run-manifest"):
                problems.append((f"/{MANIFEST}{p}", m))
        except KitError as exc:
            problems.append((f"/{MANIFEST}", str(exc)))
    if not seal["validation_passed"]:
        problems.append((f"/{SEAL}/validation_passed", "false: the run's gates failed (see validation.json)"))
    if public_key is not None:
        key = load_public_key(public_key)
        problems += [(f"/{SEAL}/signature", m) for m in signature_problems(seal, key)]
    elif seal.get("signature"):
        sig_problems = signature_problems(seal, None)
        problems += [(f"/{SEAL}/signature", m) for m in sig_problems]
        if not sig_problems:
            verdict.notes.append(f"signed (ed25519 key {seal['signature']['public_key']}); pass --key PUB to check the signer")
    verdict.notes.append(f"{len(listed)} artifacts, root sha256 {seal['root_sha256']}, gate set {seal['gate_set_version']}")
    if in_toto_out is not None:
        write_in_toto(seal, Path(in_toto_out))
        verdict.notes.append(f"in-toto statement written to {in_toto_out}")
    verdict.problems = problems
    verdict.status = "fail" if problems else "ok"
    return verdict


def status_of(run_dir: Path) -> str:
    try:
        return read_json_file(run_dir / STATUS).get("status", "unknown")
    except KitError:
        return "unknown: no status.json"


def in_toto_statement(seal: dict) -> dict:
    """The seal as an in-toto v1 Statement: the artifacts are the subjects."""
    return {
        "_type": IN_TOTO_STATEMENT,
        "subject": [{"name": a["path"], "digest": {"sha256": a["sha256"]}} for a in seal["artifacts"]],
        "predicateType": IN_TOTO_PREDICATE,
        "predicate": {k: seal[k] for k in ("run_id", "sealed_at", "kit_version", "root_sha256", "manifest_sha256",
                                           "validation_passed", "gate_set_version")}
                     | ({"signature": seal["signature"]} if seal.get("signature") else {}),
    }


def write_in_toto(seal: dict, out: Path) -> Path:
    from kit.model.documents import write_new_document

    if out.exists():
        raise BadInput(f"--in-toto {out}: already exists; choose a new file")
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_new_document(out, in_toto_statement(seal), schema=IN_TOTO_SCHEMA)


# --- run manifests ----------------------------------------------------------------------------------------------

def read_manifest(run_dir: Path) -> dict:
    path = Path(run_dir) / MANIFEST
    if not Path(run_dir).is_dir():
        raise BadInput(f"{run_dir}: not a run directory")
    doc = read_json_file(path)
    problems = schema_problems(doc, "run-manifest")
    if problems:
        pointer, message = problems[0]
        raise BadInput(f"{path}: {pointer or '/'}: {message}")
    return doc
