"""The workload's inputs: DAPO-Math-17k as VIME prompt JSONL, the hashed model, the torch_dist checkpoint.

Every product is written beside a provenance document (``rlk-kit/provenance/v1``) that says where it
came from and what its bytes hash to. Nothing is ever half-written at a final path: data go to a
temporary file, are hashed and checked, and are then linked into place. Example::

    result = prepare_dataset(Path("ws"), source=PUBLISHED_URL, progress=sys.stderr)
    result.document["output_sha256"]          # '73e2166517fd...' for the published parquet

**Which output hash is expected.** The reference study pinned the converted JSONL's sha256 (§11.6) but
not the parquet's, so a local copy or a mirror cannot be recognised as the published file by its own
hash. The rule is therefore about the output: every source that converts at all has the five columns
of the DAPO-Math-17k parquet, and the kit's VIME arms consume the result *as* DAPO-Math-17k, so every
source is expected to convert to the published JSONL hash ``PUBLISHED_OUTPUT_SHA256``. A different
hash is refused (CheckFailed, exit 1; the output is kept only as ``*.rejected-<sha12>``) unless the
caller passes ``accept_new_hash`` (``--accept-new-hash``), which the provenance records as
``accepted_new_hash: true`` beside ``expected_output_sha256`` and ``output_sha256``; whether the data
match the published conversion is ``output_sha256 == expected_output_sha256``
(:func:`matches_published_output`).

**Inputs are checked before anything is written.** :func:`check_dataset_source`, :func:`check_model_dir`
and :func:`find_conversion_image` read only; ``kit prepare`` calls them for every requested product
before it creates the workspace. The only files a failed run can leave are caches, by design: the
per-file hash cache ``cache/hashes.json`` and a ``downloads/*.partial`` that the next run resumes.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, TextIO
from urllib.parse import urlparse

from kit import __version__

from kit.model.documents import read_json_file, require_valid, schema_id, write_new_document
from kit.model.errors import BadInput, CheckFailed
from kit.model.workspace import DATASET_NAME, PUBLISHED_URL, Workspace, _short
from kit.inputs.files import HashCache, hash_file_cached, hash_tree, list_tree, tree_sha256
from kit.inputs.download import download, read_record, record_path
from kit.inputs.parquet import COLUMNS, RECORD_FIELDS, convert_rows, open_parquet, read_rows

PROVENANCE_SCHEMA = schema_id("provenance")

PUBLISHED_OUTPUT_SHA256 = "73e2166517fd635e1157aff17202f86a5cced44ca1669e6f49d2d63a59bf509d"
# sha256 of parquet files known to be the published train split. Neither the reference study nor any
# other source consulted states it; add the hub's LFS sha256 (a published download's provenance records
# it as source_sha256, checked against the hub's ETag) once observed. Only informative: the expected
# output hash does not depend on it (see the module docstring).
PUBLISHED_PARQUET_SHA256: frozenset[str] = frozenset()

WEIGHT_SUFFIXES = (".safetensors", ".bin")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_url(source: str) -> bool:
    return urlparse(source).scheme in ("http", "https")


def expected_output_sha256(source: str, source_sha256: str,
                           expectations: dict[str, str] | None = None) -> str:
    """The output hash a source must convert to: the published JSONL's, for every DAPO-shaped source.

    ``expectations`` (source -> sha256) overrides it for named sources; tests use it.

    >>> expected_output_sha256("/data/mirror.parquet", "ab" * 32) == PUBLISHED_OUTPUT_SHA256
    True
    """
    if expectations and source in expectations:
        return expectations[source]
    return PUBLISHED_OUTPUT_SHA256


def matches_published_output(document: dict) -> bool:
    """Whether a dataset provenance's data are byte for byte the published DAPO-Math-17k conversion."""
    return document.get("output_sha256") == PUBLISHED_OUTPUT_SHA256


def is_known_published_parquet(location: str, source_sha256: str) -> bool:
    """The published URL, or a file whose sha256 is a known published parquet hash."""
    return location == PUBLISHED_URL or source_sha256 in PUBLISHED_PARQUET_SHA256


# --- the dataset step ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prepared:
    """One product of ``kit prepare``: its provenance document and where it lies."""

    kind: str
    path: Path
    provenance_path: Path
    document: dict
    reused: bool


RESULT_SCHEMA = schema_id("prepare-result")


def result_document(workspace: Path, done: Iterable[Prepared]) -> dict:
    """What ``kit prepare --json`` prints (``rlk-kit/prepare-result/v1``): one entry per product, its
    provenance document checked against the provenance schema first.

    ``result_document(ws, [prepare_dataset(ws)])["dataset"]["matches_published_output"]``
    """
    out: dict = {"schema": RESULT_SCHEMA, "workspace": str(Path(workspace).resolve())}
    for p in done:
        entry = {"path": str(p.path), "provenance": str(p.provenance_path), "reused": p.reused,
                 "document": require_valid(p.document, str(p.provenance_path), PROVENANCE_SCHEMA)}
        if p.kind == "dataset":
            entry["matches_published_output"] = matches_published_output(p.document)
        out[p.kind] = entry
    return require_valid(out, "kit prepare result", RESULT_SCHEMA)


def prepare_dataset(
    workspace: Path,
    *,
    source: str = PUBLISHED_URL,
    accept_new_hash: bool = False,
    progress: TextIO | None = None,
    expectations: dict[str, str] | None = None,
    pins: dict[str, str] | None = None,
) -> Prepared:
    """Convert ``source`` (URL or path) into ``<ws>/data/dapo-math-17k.jsonl`` with provenance.

    Raises CheckFailed when a published source converts to another hash (the output is kept only as
    ``*.rejected-<sha12>``) unless ``accept_new_hash``; BadInput for unusable sources. ``pins`` (an arm's
    ``inputs``) are stricter: a parquet other than ``dataset_sha256`` is refused before anything is
    written, data other than ``prompt_data_sha256`` are kept only as rejected, whatever ``accept_new_hash``.
    """
    pins = pins or {}
    ws = Workspace(Path(workspace))
    cache = HashCache(ws.hash_cache)
    try:
        existing = _existing_dataset(ws, source, cache)
        if existing is not None:
            _check_pins(pins, existing.document["source"], existing.document["source_sha256"],
                        existing.document["output_sha256"], f"{ws.data} (prepared earlier)")
            return existing
        location, source_file, checksum_source = _fetch_source(ws, source, progress, cache)
        source_sha256 = hash_file_cached(source_file, cache)
        _check_pins(pins, location, source_sha256, None, str(source_file))   # before anything is written
        if "prompt_data_sha256" in pins:   # the arm's pin is the expectation, with no --accept-new-hash way out
            expectations, accept_new_hash = {location: pins["prompt_data_sha256"]}, False
            whose, way_out = "the arm's pin (inputs.prompt_data_sha256)", ""
        else:
            whose = "the published DAPO-Math-17k conversion"
            way_out = "; pass --accept-new-hash to use it anyway (recorded in the provenance)"

        ws.data.parent.mkdir(parents=True, exist_ok=True)
        tmp = ws.data.with_name(f".{ws.data.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "w", encoding="utf-8", newline="\n") as out:
                counts = convert_rows(read_rows(source_file), out)
            if counts.rows_written == 0:
                raise BadInput(f"{source_file}: no rows; the DAPO-Math-17k parquet has about 17k")
            output_sha256 = hash_file_cached(tmp)
            expected = expected_output_sha256(location, source_sha256, expectations)
            accepted = False
            if output_sha256 != expected:
                if not accept_new_hash:
                    rejected = ws.data.with_name(f"{ws.data.name}.rejected-{_short(output_sha256)}")
                    os.replace(tmp, rejected)
                    raise CheckFailed(
                        f"--dataset-source {location}: converted data have sha256 {output_sha256}, not "
                        f"{whose} {expected}; kept for inspection as {rejected}{way_out}")
                accepted = True
            try:
                os.link(tmp, ws.data)  # exclusive: never replaces data someone else just wrote
            except FileExistsError:
                raise BadInput(f"{ws.data}: appeared while converting; remove it and run again") from None
        finally:
            tmp.unlink(missing_ok=True)

        doc = {
            "schema": PROVENANCE_SCHEMA,
            "kind": "dataset",
            "name": DATASET_NAME,
            "created_at": _now(),
            "kit_version": __version__,
            "source": location,
            "source_sha256": source_sha256,
            "source_checksum": checksum_source,
            "output": ws.data.relative_to(ws.root).as_posix(),
            "output_sha256": output_sha256,
            "expected_output_sha256": expected,
            "accepted_new_hash": accepted,
            "rows_read": counts.rows_read,
            "rows_written": counts.rows_written,
            "duplicates_removed": counts.duplicates_removed,
            "converter": {"columns": list(COLUMNS), "dedup_key": "extra_info.index",
                          "record_fields": list(RECORD_FIELDS), "json": "compact separators, ensure_ascii=false"},
        }
        try:
            write_new_document(ws.data_provenance, doc)
        except BaseException:
            ws.data.unlink(missing_ok=True)  # data without provenance would look prepared to the next call
            raise
        cache.store(str(ws.data.resolve()), ws.data.stat().st_size, ws.data.stat().st_mtime_ns, output_sha256)
        return Prepared("dataset", ws.data, ws.data_provenance, doc, reused=False)
    finally:
        cache.save()


def _check_pins(pins: dict[str, str], location: str, source_sha256: str, output_sha256: str | None, what: str) -> None:
    """CheckFailed naming the file, the arm's pin and what was found, for the first pin not met."""
    found = {"dataset_sha256": (source_sha256, f"the parquet {location}"),
             "prompt_data_sha256": (output_sha256, "its converted prompt data")}
    for field, (actual, which) in found.items():
        if field in pins and actual is not None and actual != pins[field]:
            raise CheckFailed(f"{what}: {which} has sha256 {actual}, not the {pins[field]} the arm pins "
                              f"(inputs.{field}); prepare the data from the source the arm pins")


def _existing_dataset(ws: Workspace, source: str, cache: HashCache) -> Prepared | None:
    """A finished earlier preparation is reused when its data still hash to what its provenance says."""
    have_data, have_doc = ws.data.exists(), ws.data_provenance.exists()
    if not have_data and not have_doc:
        return None
    if have_data and not have_doc:
        raise BadInput(f"{ws.data}: exists without its provenance {ws.data_provenance.name}; "
                       "remove it and run kit prepare again")
    doc = read_provenance(ws.data_provenance, "dataset")
    if not have_data:
        raise BadInput(f"{ws.data_provenance}: describes {ws.data.name}, which is missing; "
                       "remove the provenance and run kit prepare again")
    actual = hash_file_cached(ws.data, cache)
    if actual != doc["output_sha256"]:
        raise CheckFailed(f"{ws.data}: sha256 {actual} differs from {doc['output_sha256']} in "
                          f"{ws.data_provenance.name}; the data were changed after preparation")
    wanted = source if is_url(source) else str(Path(source).resolve())
    if doc["source"] != wanted:
        raise BadInput(f"{ws.data}: already prepared from {doc['source']}; remove {ws.data} and "
                       f"{ws.data_provenance.name} to prepare it from {wanted}")
    return Prepared("dataset", ws.data, ws.data_provenance, doc, reused=True)


def _fetch_source(ws: Workspace, source: str, progress, cache) -> tuple[str, Path, str | None]:
    """``(location recorded, local file, how its checksum was verified)``."""
    if is_url(source):

        dest = ws.download_path(source)
        if dest.is_file():  # only ever renamed into place after a complete, checked transfer
            return source, dest, _reused_download_check(source, dest, cache)
        try:
            got = download(source, dest, progress=progress)
        except BadInput as exc:
            raise BadInput(f"--dataset-source {exc}") from None
        return source, got.path, got.checksum_source
    path = local_source_path(source)
    if not path.exists():
        raise BadInput(f"--dataset-source {path}: no such file (expected the DAPO-Math-17k parquet)")
    return str(path.resolve()), path, None


def _reused_download_check(url: str, dest: Path, cache: HashCache) -> str | None:
    """What an earlier download in downloads/ was checked against when it arrived, as its record says:
    ``caller``, ``server`` or None (size only, or no record: unknown). Its bytes must still hash as
    recorded; a file changed since is refused rather than trusted."""

    record = read_record(dest)
    if record is None or record["url"] != url or record["file"] != dest.name:
        return None
    actual = hash_file_cached(dest, cache)
    if actual != record["sha256"]:
        raise CheckFailed(f"--dataset-source {url}: {dest} has sha256 {actual}, but {record_path(dest).name} "
                          f"recorded {record['sha256']} when it was downloaded; remove both files to download again")
    return record["checksum_source"]


def local_source_path(source: str) -> Path:
    """The path of a local ``--dataset-source`` (plain or ``file:``); BadInput for other schemes."""
    if urlparse(source).scheme not in ("", "file"):
        raise BadInput(f"--dataset-source {source}: unsupported scheme; give an http(s) URL or a local path")
    return Path(urlparse(source).path if source.startswith("file:") else source)


def check_dataset_source(source: str) -> None:
    """Read-only check of ``--dataset-source`` before anything is written.

    A local file must be a readable parquet with the five DAPO columns; a URL must be http(s) (its
    bytes are checked when downloaded). BadInput names the flag.
    """
    if is_url(source):
        return
    path = local_source_path(source)
    try:
        open_parquet(path)
    except BadInput as exc:
        raise BadInput(f"--dataset-source {exc}") from None


def read_provenance(path: Path, kind: str) -> dict:
    doc = require_valid(read_json_file(path), str(path), PROVENANCE_SCHEMA)
    if doc["kind"] != kind:
        raise BadInput(f"{path}: /kind is {doc['kind']!r}, expected {kind!r}")
    return doc


# --- the model step --------------------------------------------------------------------------------

def check_model_dir(model_dir: Path) -> list[str]:
    """The weight files of a Hugging Face checkpoint directory; BadInput naming --model otherwise."""
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise BadInput(f"--model {model_dir}: no such directory (expected a Hugging Face checkpoint)")
    if not model_dir.is_dir():
        raise BadInput(f"--model {model_dir}: not a directory (expected a Hugging Face checkpoint)")
    names = list_tree(model_dir)
    weights = [n for n in names if n.endswith(WEIGHT_SUFFIXES)]
    if not weights:
        raise BadInput(f"--model {model_dir}: no weights (*.safetensors or *.bin) among {len(names)} file(s)")
    unreadable = [n for n in names if not os.access(model_dir / n, os.R_OK)]
    if unreadable:
        raise BadInput(f"--model {model_dir}: {len(unreadable)} file(s) not readable, e.g. {unreadable[0]}")
    return weights


def prepare_model(workspace: Path, model_dir: Path, progress: TextIO | None = None) -> Prepared:
    """Hash a Hugging Face checkpoint file by file and record it; needs at least one weight file.

    ``progress`` (stderr) gets files and bytes hashed while the files are read (see ``hash_tree``)."""
    ws = Workspace(Path(workspace))
    model_dir = Path(model_dir)
    weights = check_model_dir(model_dir)
    files = hash_tree(model_dir, ws.hash_cache, progress=progress)
    digest = tree_sha256(files)
    where = ws.model_provenance(digest)
    if where.exists():
        doc = read_provenance(where, "model")
        if doc["tree_sha256"] == digest:
            return Prepared("model", model_dir, where, doc, reused=True)
    doc = {
        "schema": PROVENANCE_SCHEMA,
        "kind": "model",
        "created_at": _now(),
        "kit_version": __version__,
        "path": str(model_dir.resolve()),
        "files": files,
        "file_count": len(files),
        "bytes": sum((model_dir / n).stat().st_size for n in files),
        "weights": weights,
        "tree_sha256": digest,
    }
    where.parent.mkdir(parents=True, exist_ok=True)
    write_new_document(where, doc)
    return Prepared("model", model_dir, where, doc, reused=False)


