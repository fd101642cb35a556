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
import json
import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, TextIO
from urllib.parse import urlparse

from kit import __version__

from kit.build import layout as image_layout
from kit.model.documents import read_json_file, require_valid, schema_id, write_new_document
from kit.model.errors import BadInput, CheckFailed
from kit.inputs.files import HashCache, hash_file_cached, hash_tree, list_tree, tree_sha256

PROVENANCE_SCHEMA = schema_id("provenance")

PUBLISHED_URL = ("https://huggingface.co/datasets/BytedTsinghua-SIA/DAPO-Math-17k/"
                 "resolve/main/data/train-00000-of-00001.parquet")
PUBLISHED_OUTPUT_SHA256 = "73e2166517fd635e1157aff17202f86a5cced44ca1669e6f49d2d63a59bf509d"
# sha256 of parquet files known to be the published train split. Neither the reference study nor any
# other source consulted states it; add the hub's LFS sha256 (a published download's provenance records
# it as source_sha256, checked against the hub's ETag) once observed. Only informative: the expected
# output hash does not depend on it (see the module docstring).
PUBLISHED_PARQUET_SHA256: frozenset[str] = frozenset()

COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
RECORD_FIELDS = ("prompt", "label", "data_source", "ability", "source_index", "reward_style")
DATASET_NAME = "dapo-math-17k"
WEIGHT_SUFFIXES = (".safetensors", ".bin")


# --- where things go in a workspace ----------------------------------------------------------

@dataclass(frozen=True)
class Workspace:
    """The layout of a workspace directory: ``data/``, ``downloads/``, ``checkpoints/``, ``cache/``."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data" / f"{DATASET_NAME}.jsonl"

    @property
    def data_provenance(self) -> Path:
        return self.root / "data" / f"{DATASET_NAME}.provenance.json"

    @property
    def hash_cache(self) -> Path:
        return self.root / "cache" / "hashes.json"

    @property
    def provenance_dir(self) -> Path:
        return self.root / "provenance"

    def download_path(self, url: str) -> Path:
        name = Path(urlparse(url).path).name or "download"
        tag = "published" if url == PUBLISHED_URL else _short(_sha256_text(url))
        return self.root / "downloads" / f"{tag}-{name}"

    def model_provenance(self, model_tree_sha256: str) -> Path:
        return self.provenance_dir / f"model-{_short(model_tree_sha256)}.json"

    def checkpoint_dir(self, stack_sha256: str, model_tree_sha256: str) -> Path:
        """One converted checkpoint per (stack, model) pair: the converter's Megatron shapes the bytes."""
        return self.root / "checkpoints" / f"torch_dist-{_short(stack_sha256)}-{_short(model_tree_sha256)}"

    def checkpoint_provenance(self, checkpoint_dir: Path) -> Path:
        return checkpoint_dir.with_name(checkpoint_dir.name + ".provenance.json")


def _short(hexdigest: str) -> str:
    return hexdigest[:12]


def _sha256_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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


# --- parquet -> JSONL (pure conversion) --------------------------------------------------------

@dataclass(frozen=True)
class ConversionCounts:
    rows_read: int
    rows_written: int

    @property
    def duplicates_removed(self) -> int:
        return self.rows_read - self.rows_written


def open_parquet(source: Path):
    """The parquet file, after checking it is readable and has the five DAPO columns (reads no rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not source.exists():
        raise BadInput(f"{source}: no such file (expected the DAPO-Math-17k parquet)")
    if not source.is_file():
        raise BadInput(f"{source}: not a regular file (expected the DAPO-Math-17k parquet)")
    try:
        parquet = pq.ParquetFile(source)
        names = set(parquet.schema_arrow.names)
    except (pa.ArrowException, OSError) as exc:
        raise BadInput(f"{source}: not a readable parquet file ({_first_line(exc)})") from None
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise BadInput(f"{source}: missing column(s) {', '.join(missing)}; "
                       f"a DAPO-Math-17k parquet has {', '.join(COLUMNS)}")
    return parquet


def read_rows(source: Path, batch_size: int = 4096) -> Iterator[dict]:
    """The five columns of a DAPO parquet file, row by row; BadInput when the file cannot serve them."""
    import pyarrow as pa

    parquet = open_parquet(source)
    try:
        for batch in parquet.iter_batches(batch_size=batch_size, columns=list(COLUMNS)):
            yield from batch.to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise BadInput(f"{source}: corrupt parquet data ({_first_line(exc)})") from None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def record_from_row(row: dict, row_number: int) -> tuple[str, dict]:
    """``(source_index, record)`` for one parquet row; the record's key order is the file format.

    >>> record_from_row({"data_source": "d", "prompt": [{"content": "1+1?", "role": "user"}],
    ...   "ability": "MATH", "reward_model": {"ground_truth": "2", "style": "rule"},
    ...   "extra_info": {"index": "a"}}, 1)[1]["label"]
    '2'
    """
    extra = row.get("extra_info")
    index = extra.get("index") if isinstance(extra, dict) else None
    if not isinstance(index, str) or not index:
        raise BadInput(f"row {row_number}: extra_info.index is {index!r}; expected a non-empty string")
    reward = row.get("reward_model")
    reward = reward if isinstance(reward, dict) else {}
    label = reward.get("ground_truth")
    if not isinstance(label, str) or not label:
        raise BadInput(f"row {row_number} (index {index}): reward_model.ground_truth is {label!r}; "
                       "expected a non-empty string")
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        raise BadInput(f"row {row_number} (index {index}): prompt is {type(prompt).__name__}; "
                       "expected a non-empty chat list")
    record = {
        "prompt": prompt,
        "label": label,
        "data_source": row.get("data_source"),
        "ability": row.get("ability"),
        "source_index": index,
        "reward_style": reward.get("style"),
    }
    return index, record


def convert_rows(rows: Iterable[dict], out: TextIO) -> ConversionCounts:
    """Write one compact JSON line per first occurrence of ``extra_info.index``; non-ASCII kept as is."""
    seen: set[str] = set()
    read = written = 0
    for read, row in enumerate(rows, start=1):
        index, record = record_from_row(row, read)
        if index in seen:
            continue
        seen.add(index)
        out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
        out.write("\n")
        written += 1
    return ConversionCounts(read, written)


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
) -> Prepared:
    """Convert ``source`` (URL or path) into ``<ws>/data/dapo-math-17k.jsonl`` with provenance.

    Raises CheckFailed when a published source converts to another hash (the output is kept only as
    ``*.rejected-<sha12>``) unless ``accept_new_hash``; BadInput for unusable sources.
    """
    ws = Workspace(Path(workspace))
    cache = HashCache(ws.hash_cache)
    try:
        existing = _existing_dataset(ws, source, cache)
        if existing is not None:
            return existing
        location, source_file, checksum_source = _fetch_source(ws, source, progress, cache)
        source_sha256 = hash_file_cached(source_file, cache)

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
                        f"--dataset-source {location}: converted data have sha256 {output_sha256}, not the "
                        f"published DAPO-Math-17k conversion {expected}; kept for inspection as {rejected}; "
                        "pass --accept-new-hash to use it anyway (recorded in the provenance)")
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
        from kit.inputs.download import download

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
    from kit.inputs.download import read_record, record_path

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


# --- the checkpoint step ---------------------------------------------------------------------------

MODEL_ARGS_SCRIPT = "scripts/models/qwen3-8B.sh"
CONVERTER = "tools/convert_hf_to_torch_dist.py"


def stack_source_names(stack_document: dict) -> tuple[str, str]:
    """The names of the stack's VIME and Megatron sources, whose checkouts the converter runs from."""
    names = [s["name"] for s in stack_document.get("sources", [])]
    vime = next((n for n in names if n == "vime"), None)
    megatron = next((n for n in names if n.startswith("megatron")), None)
    if not vime or not megatron:
        raise BadInput(f"stack {stack_document.get('name')}: the checkpoint converter needs a 'vime' and a "
                       f"'megatron*' source; it has {', '.join(names) or 'none'}")
    return vime, megatron


def conversion_command(stack_document: dict, output_dir: str) -> list[str]:
    """The in-image HF -> torch_dist command (reference §8.3 prepare step 4) with in-image paths.

    ``output_dir`` is a path inside the container (under ``/workspace``); the model is read-only at
    ``/inputs/model``. Example result::

        ["bash", "-lc", "set -euo pipefail; source /opt/rlk/src/vime/scripts/models/qwen3-8B.sh; "
         "PYTHONPATH=/opt/rlk/src/megatron /opt/rlk/venv/bin/python "
         "/opt/rlk/src/vime/tools/convert_hf_to_torch_dist.py \\"${MODEL_ARGS[@]}\\" "
         "--hf-checkpoint /inputs/model --save /workspace/checkpoints/.torch_dist-...partial"]
    """
    vime, megatron = stack_source_names(stack_document)
    vime_dir = image_layout.source_dir(vime)
    script = (
        "set -euo pipefail; "
        f"source {shlex.quote(f'{vime_dir}/{MODEL_ARGS_SCRIPT}')}; "
        f"PYTHONPATH={shlex.quote(image_layout.source_dir(megatron))} {shlex.quote(image_layout.PYTHON)} "
        f"{shlex.quote(f'{vime_dir}/{CONVERTER}')} \"${{MODEL_ARGS[@]}}\" "
        f"--hf-checkpoint {shlex.quote(image_layout.MODEL_DIR)} --save {shlex.quote(output_dir)}"
    )
    return ["bash", "-lc", script]


def check_conversion_request(arm_name: str, arm_document: dict, stack_document: dict, platform: str) -> None:
    """BadInput naming the flag when the arm is not a vime arm, the platform is not a GPU one or the
    stack lacks the converter's sources. Reads nothing."""
    if arm_document.get("engine") != "vime":
        raise BadInput(f"--arm {arm_name}: engine {arm_document.get('engine')!r} uses no Megatron checkpoint; "
                       "--convert-checkpoint needs a vime arm")
    if platform not in ("cuda", "rocm"):
        raise BadInput(f"--platform {platform}: the converter runs on cuda or rocm")
    stack_source_names(stack_document)


def find_conversion_image(arm_name: str, arm_document: dict, stack_document: dict, stack_sha256: str,
                          platform: str = "cuda"):
    """The arm's image for the in-image conversion, after every read-only check of the request.

    BadInput (exit 2) naming the flag when the request is unusable (:func:`check_conversion_request`),
    no Docker engine answers (naming --convert-checkpoint, dockerd and DOCKER_HOST), or the image is
    not built (naming the ``kit build`` command that makes it).
    """
    check_conversion_request(arm_name, arm_document, stack_document, platform)
    stack_name = stack_document.get("name", arm_document["stack"]["name"])

    import docker

    from kit.run.doctor import find_stack_image
    from kit.build.images import engine

    try:
        client = engine()
    except BadInput as exc:  # names dockerd and DOCKER_HOST
        raise BadInput(f"--convert-checkpoint: {exc}; the conversion runs inside the arm's image") from None
    try:
        image = find_stack_image(stack_name, stack_sha256, platform, client)
    except docker.errors.DockerException as exc:
        raise BadInput(f"--convert-checkpoint: the Docker engine cannot list images ({_first_line(exc)[:200]})") from None
    if image is None:
        raise BadInput(f"image not built: no rlk-kit/{stack_name}:{platform}-* image for stack {stack_name} "
                       f"(sha256 {stack_sha256}) on the Docker engine; run kit build {platform} --arm {arm_name}")
    return image


def convert_checkpoint(
    workspace: Path,
    *,
    arm_name: str,
    arm_document: dict,
    stack_document: dict,
    stack_sha256: str,
    model: Prepared,
    platform: str = "cuda",
    progress: TextIO | None = None,
    image=None,
) -> Prepared:
    """Run the converter inside the arm's image (docker-py) and record command and output tree hash.

    ``image`` is the one :func:`find_conversion_image` found; without it the lookup happens here.
    Refuses with BadInput (exit 2) when no engine answers or the arm's image is not on the engine,
    naming the expected image and the ``kit build`` command that makes it.
    """
    stack_name = stack_document.get("name", arm_document["stack"]["name"])
    ws = Workspace(Path(workspace))
    final = ws.checkpoint_dir(stack_sha256, model.document["tree_sha256"])
    record = ws.checkpoint_provenance(final)
    if final.exists() and record.exists():
        return Prepared("checkpoint", final, record, read_provenance(record, "checkpoint"), reused=True)
    if final.exists():
        raise BadInput(f"{final}: exists without its provenance; remove it and run again")
    if image is None:
        image = find_conversion_image(arm_name, arm_document, stack_document, stack_sha256, platform)

    partial = final.with_name(f".{final.name}.partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.parent.mkdir(parents=True, exist_ok=True)
    in_image = f"{image_layout.WORKSPACE}/{partial.relative_to(ws.root).as_posix()}"
    command = conversion_command(stack_document, in_image)
    try:
        _run_in_image(image, command, ws.root, Path(model.document["path"]), platform, progress)
        if not partial.is_dir() or not list_tree(partial):
            raise CheckFailed(f"checkpoint conversion in {image.tags[0] if image.tags else image.id} wrote "
                              f"nothing to {partial}")
        os.rename(partial, final)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
    files = hash_tree(final, ws.hash_cache)
    doc = {
        "schema": PROVENANCE_SCHEMA,
        "kind": "checkpoint",
        "created_at": _now(),
        "kit_version": __version__,
        "arm": arm_name,
        "stack": {"name": stack_name, "sha256": stack_sha256},
        "image": {"ref": image.tags[0] if image.tags else None, "id": image.id},
        "platform": platform,
        "model_tree_sha256": model.document["tree_sha256"],
        "command": command,
        "output": final.relative_to(ws.root).as_posix(),
        "files": files,
        "tree_sha256": tree_sha256(files),
    }
    write_new_document(record, doc)
    return Prepared("checkpoint", final, record, doc, reused=False)


def _run_in_image(image, command: list[str], workspace: Path, model_dir: Path, platform: str, progress) -> None:
    import docker
    from docker.types import DeviceRequest

    client = docker.from_env()
    kwargs: dict = {}
    if platform == "cuda":
        kwargs["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    else:
        kwargs["devices"] = ["/dev/kfd:/dev/kfd", "/dev/dri:/dev/dri"]
        kwargs["group_add"] = ["video"]
    container = client.containers.run(
        image.id, command, detach=True, shm_size="16g", working_dir=image_layout.WORKSPACE,
        volumes={str(model_dir.resolve()): {"bind": image_layout.MODEL_DIR, "mode": "ro"},
                 str(workspace.resolve()): {"bind": image_layout.WORKSPACE, "mode": "rw"}},
        **kwargs)
    tail: list[str] = []
    try:
        for chunk in container.logs(stream=True, follow=True):
            text = chunk.decode("utf-8", "replace")
            tail = (tail + text.splitlines())[-20:]
            if progress is not None:
                progress.write(text)
        status = container.wait().get("StatusCode", 1)
    finally:
        container.remove(force=True)
    if status != 0:
        raise CheckFailed(f"checkpoint conversion exited with {status}; last lines:\n" + "\n".join(tail))


def select_checkpoint(ws, stack_name: str, stack_sha256: str,
                      platform: str | None = None) -> tuple[Path | None, dict | None, str]:
    """The converted checkpoint an arm of this stack uses (kit run's default, doctor's check):
    ``(provenance path, document, how it was chosen)``.

    Only checkpoints whose provenance names the arm's full stack sha256 qualify (the directory name
    holds only 12 hex digits of it). Among several (other models, other platforms), the one of the
    host's platform is preferred, then the most recently converted; the note says so. A provenance
    that does not read is skipped here; ``(None, None, note)`` when none qualifies.
    """
    candidates = []
    for path in sorted((ws.root / "checkpoints").glob("*.provenance.json")):
        try:
            doc = read_provenance(path, "checkpoint")
        except BadInput:
            continue
        if doc["stack"]["sha256"] == stack_sha256:
            candidates.append((path, doc))
    if not candidates:
        return None, None, "none converted with this stack"
    if platform is not None and any(d["platform"] == platform for _, d in candidates):
        candidates = [(p, d) for p, d in candidates if d["platform"] == platform]
    candidates.sort(key=lambda pd: (pd[1]["created_at"], pd[0].name))
    path, doc = candidates[-1]
    note = "" if len(candidates) == 1 else (f"; the newest of {len(candidates)} checkpoints of stack "
                                            f"{stack_name} for {doc['platform']}")
    return path, doc, note
