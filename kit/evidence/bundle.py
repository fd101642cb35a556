"""Evidence: run directories and their seal.

A run directory ``<workspace>/runs/<run-id>/`` is created exclusively and its id is recorded in
``<workspace>/runs/.ids``, so an id is never used twice anywhere in the workspace. Artifacts are
written once; then every file is made read-only and ``seal.json`` is written last and atomically:
sha256, size and mode of every artifact, a root hash over the sorted ``sha256sum``-style list, the
manifest's and the validation report's hashes, a hash over the whole seal, optionally an ed25519
signature (:mod:`kit.evidence.signing`). :mod:`kit.evidence.audit` verifies. Example::

    run_dir = create_run_dir(Path(".workspace"), "smoke-r1")
    ...                                       # manifest.json, run.log, validation.json, ...
    seal_run_dir(run_dir, run_id="smoke-r1", validation_passed=True, gate_set_version="rlk-kit-gates/2")
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from kit import __version__
from kit.evidence.attestation import SIGNATURE_FILES, write_run_attestations
from kit.evidence.files import hash_bounded, walk_run_dir
from kit.evidence.signing import ECDSA_P256, algorithm_of, load_private_key, sign_seal
from kit.model.documents import (dumps_pretty, read_json_file, replace_document, require_valid, schema_id,
                                 schema_problems, sha256_of_document, write_new_document)
from kit.model.errors import BadInput, CheckFailed, KitError
from kit.model.holds import hold

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
SEAL_SCHEMA = schema_id("seal", 3)
SEAL_SCHEMA_ECDSA = schema_id("seal", 4)       # seal v3 whose signature is ECDSA P-256
MANIFEST_SCHEMA = schema_id("run-manifest")
SEAL_TMP_PREFIX = f".{SEAL}.tmp-"        # where kit versions before seal v2 staged the seal, inside the run dir
READ_ONLY_MASK = ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) & 0o7777
HASH_WORKERS = 4
# A run id names a directory: no whitespace, control characters, path parts or look-alike trailing newline.
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str, flag: str = "--run-id") -> str:
    """``check_run_id("smoke-r1")`` returns it; ``"r1\\n"``, ``"../x"`` or ``"a b"`` is bad input (exit 2)."""
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        raise BadInput(f"{flag} {run_id!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit "
                       "(at most 128; no spaces, control characters or '/')")
    return run_id


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


def check_runs_writable(workspace: Path) -> None:
    """BadInput (exit 2) naming ``<workspace>/runs`` when a run dir could not be written there (read-only
    permissions or mount, a file in the way), before a run starts anything."""
    runs = Path(workspace) / RUNS_DIR
    probe = runs / f".writable-{os.getpid()}"
    try:
        runs.mkdir(parents=True, exist_ok=True)
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        raise BadInput(f"{runs}: cannot write a run dir there ({exc.strerror or exc}); nothing was started and "
                       "no run id used: give a writable --workspace") from None


def create_run_dir(workspace: Path, run_id: str) -> Path:
    """Register the id and create the run dir exclusively; a used id is bad input (exit 2)."""
    workspace = Path(workspace)
    check_run_id(run_id)
    runs = workspace / RUNS_DIR
    with _registry_lock(runs):
        clean_stale_seal_temps(runs)
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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    return path


def write_document(run_dir: Path, name: str, doc: dict) -> Path:
    _refuse_if_sealed(run_dir)
    try:
        return write_new_document(Path(run_dir) / name, doc)
    except OSError as exc:
        raise _unwritable(Path(run_dir) / name, exc) from None


def _unwritable(path: Path, exc: OSError) -> BadInput:
    """A full disk or a read-only run root: one line, and what was already written stays."""
    return BadInput(f"{path}: cannot write ({exc.strerror or exc}); what the run wrote before is kept in {path.parent}")


def replace_status(run_dir: Path, doc: dict) -> Path:
    """Replace a detached run's status.json with its final one, atomically (``kit run --attach``).

    The only artifact ever rewritten, and only while the status says ``detached``: a final status is
    written once, and a sealed run dir is never written again."""
    _refuse_if_sealed(run_dir)
    path = Path(run_dir) / STATUS
    current = status_of(Path(run_dir))
    if current != "detached":
        raise CheckFailed(f"{path}: status is {current}; only a detached run's status is replaced")
    return replace_document(path, doc)


# --- hashing -------------------------------------------------------------------------------------------

def artifact_paths(run_dir: Path) -> list[str]:
    """Every regular file under the run dir except the seal itself, as sorted POSIX paths (links never followed)."""
    return sorted(walk_run_dir(Path(run_dir), skip=(SEAL,)).files)


def _hash_one(path: Path) -> tuple[str, int]:
    digest, size, _ = hash_bounded(path.parent, path.name, limit=None)
    return digest, size


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


def seal_sha256(seal: dict) -> str:
    """sha256 of the canonical JSON of the seal without ``seal_sha256`` and ``signature``: covers every field."""
    return sha256_of_document({k: v for k, v in seal.items() if k not in ("seal_sha256", "signature")})


# --- the seal ----------------------------------------------------------------------------------------------

def manifest_lock_sha256(path: Path) -> str | None:
    """The lock sha256 a run manifest names (``lock.sha256``), None when it names none."""
    lock = read_json_file(path).get("lock")
    return lock.get("sha256") if isinstance(lock, dict) else None


def build_seal(run_dir: Path, *, run_id: str, validation_passed: bool, gate_set_version: str,
               hashed: dict[str, tuple[str, int]] | None = None) -> dict:
    """The v3 seal of a run dir as its files are now (modes as they will be once made read-only), with the
    lock sha256 its manifest names (run-manifest/v2 ``lock``; None for an older manifest or no lock).
    ``hashed``: ``{path: (sha256, size)}`` already computed for files made read-only since (not hashed again)."""
    run_dir = Path(run_dir)
    listing = walk_run_dir(run_dir, skip=(SEAL,))
    if listing.refused:
        rel, why = next(iter(sorted(listing.refused.items())))
        raise CheckFailed(f"{run_dir / rel}: {why}; only regular files are sealed")
    paths = sorted(p for p in listing.files if not p.startswith(SEAL_TMP_PREFIX))
    for required in (MANIFEST, VALIDATION):
        if required not in paths:
            raise CheckFailed(f"{run_dir}: no {required}; only a run with a manifest and a validation report is sealed")
    known = {p: v for p, v in (hashed or {}).items() if p in listing.files and listing.files[p].size == v[1]}
    hashed = {**known, **hash_artifacts(run_dir, [p for p in paths if p not in known])}
    artifacts = [{"path": p, "sha256": hashed[p][0], "size": hashed[p][1],
                  "mode": f"0{listing.files[p].mode & READ_ONLY_MASK:03o}"} for p in paths]
    seal = {
        "schema": SEAL_SCHEMA,
        "run_id": run_id,
        "sealed_at": utc_now(),
        "kit_version": __version__,
        "algorithm": "sha256",
        "artifacts": artifacts,
        "root_sha256": root_sha256(artifacts),
        "manifest_sha256": hashed[MANIFEST][0],
        "validation_sha256": hashed[VALIDATION][0],
        "validation_passed": validation_passed,
        "gate_set_version": gate_set_version,
        "lock_sha256": manifest_lock_sha256(run_dir / MANIFEST),
    }
    seal["seal_sha256"] = seal_sha256(seal)
    return seal


def seal_run_dir(run_dir: Path, *, run_id: str, validation_passed: bool, gate_set_version: str,
                 sign_key: Path | None = None, private_key=None) -> dict:
    """Make every file read-only, then write seal.json last and atomically.

    The seal's bytes go to a temporary file beside the run dir (never inside it) and are linked into
    place, so a crash leaves either no seal or a whole one, and never a stray file in the sealed tree.
    ``private_key`` (loaded with :func:`load_private_key` before the run started) or ``sign_key``
    (a path, loaded now) signs the seal; a signed run also seals its in-toto attestation and, for an
    ECDSA P-256 key, its model-signing signature (:mod:`kit.evidence.attestation`), written before the seal."""
    run_dir = Path(run_dir)
    _refuse_if_sealed(run_dir)
    if private_key is None and sign_key is not None:
        private_key = load_private_key(sign_key)
    try:
        for rel in artifact_paths(run_dir):
            path = run_dir / rel
            path.chmod(stat.S_IMODE(path.lstat().st_mode) & READ_ONLY_MASK)
        for name in SIGNATURE_FILES:      # reserved names: left by a sealing that was killed, made again below
            (run_dir / name).unlink(missing_ok=True)
        paths = [p for p in artifact_paths(run_dir) if not p.startswith(SEAL_TMP_PREFIX)]
        hashed = None
        if private_key is not None and MANIFEST in paths and VALIDATION in paths:
            hashed = hash_artifacts(run_dir, paths)      # the files are read-only now: the seal reuses these
            write_run_attestations(run_dir, {p: d for p, (d, _) in hashed.items()}, private_key, run_id=run_id,
                                   validation_passed=validation_passed, gate_set_version=gate_set_version)
        seal = build_seal(run_dir, run_id=run_id, validation_passed=validation_passed, gate_set_version=gate_set_version,
                          hashed=hashed)
        if private_key is not None:
            if algorithm_of(private_key) == ECDSA_P256:
                seal["schema"] = SEAL_SCHEMA_ECDSA
                seal["seal_sha256"] = seal_sha256(seal)
            seal["signature"] = sign_seal(seal, private_key)
        require_valid(seal, str(run_dir / SEAL), "seal")
        tmp = run_dir.parent / f".{run_dir.name}.{SEAL}.tmp-{os.getpid()}"
        with open(tmp, "xb") as fh:
            fh.write(dumps_pretty(seal).encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        hold("sealing")        # tests: the files are read-only, the seal is written but not yet in place
        try:
            tmp.chmod(0o444)
            os.link(tmp, run_dir / SEAL)
        except FileExistsError:
            raise CheckFailed(f"{run_dir / SEAL}: already exists; evidence is never overwritten") from None
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(run_dir)
    except OSError as exc:
        raise BadInput(f"{exc.filename or run_dir}: cannot seal ({exc.strerror or exc}); the run's files are kept "
                       f"unsealed in {run_dir}") from None
    return seal


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def clean_stale_seal_temps(runs: Path) -> list[Path]:
    """Remove temporary seal files a killed ``kit run`` left beside its run dir; returns what was removed."""
    removed = []
    for tmp in Path(runs).glob(f".*.{SEAL}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def status_of(run_dir: Path) -> str:
    try:
        return read_json_file(run_dir / STATUS).get("status", "unknown")
    except KitError:
        return "unknown: no status.json"


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
