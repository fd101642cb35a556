"""Reading, validating, hashing and writing the kit's JSON documents.

Every document carries ``"schema": "rlk-kit/<name>/v<N>"`` and validates against
``kit/schemas/<name>.v<N>.json`` (JSON Schema 2020-12). Schemas change by new version,
never in place. Example::

    doc = read_json_file(Path("manifests/G10.json"))
    problems = schema_problems(doc)          # [] when valid
    digest = sha256_of_document(doc)         # identity of a stack
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from kit.model.errors import BadInput
from kit.model.regular_files import read_regular_bytes

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64          # the deepest shipped document nests about 10 levels
SCHEMA_ID_RE = re.compile(r"^rlk-kit/([a-z][a-z0-9-]*)/v([1-9][0-9]*)$")


def schema_id(name: str, version: int = 1) -> str:
    """``schema_id("stack") == "rlk-kit/stack/v1"``."""
    return f"rlk-kit/{name}/v{version}"


# --- reading -----------------------------------------------------------------

def read_json_file(path: Path | str, *, limit: int = MAX_DOCUMENT_BYTES) -> Any:
    """Read one JSON file, turning every way it can be unreadable into a BadInput naming the file.

    Only a regular file is read (a link to one is followed; a FIFO, a device or a directory is
    refused without blocking), at most ``limit`` bytes, nested at most ``MAX_DEPTH`` deep."""
    path = Path(path)
    return parse_json_bytes(read_regular_bytes(path, limit=limit, what="a JSON document"), str(path))


def parse_json_bytes(raw: bytes, source: str) -> Any:
    """Parse UTF-8 JSON; reject NaN/Infinity (also 1e400, which overflows to it) and nesting over MAX_DEPTH."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{source}: not UTF-8 (byte {exc.start}); documents must be UTF-8 JSON") from None

    def _no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    def _finite(text: str) -> float:
        value = float(text)
        if math.isinf(value):
            raise ValueError(f"{text[:40]} is out of the range of a double")
        return value

    try:
        doc = json.loads(text, parse_constant=_no_constants, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{source}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise BadInput(f"{source}: nested deeper than {MAX_DEPTH} levels; documents are shallow") from None
    except ValueError as exc:
        raise BadInput(f"{source}: malformed JSON: {exc}") from None
    pointer = too_deep(doc)
    if pointer is not None:
        raise BadInput(f"{source}: {pointer[:200]}: nested deeper than {MAX_DEPTH} levels; documents are shallow")
    return doc


def too_deep(doc: Any, limit: int | None = None) -> str | None:
    """The pointer of the first value nested deeper than ``limit`` (MAX_DEPTH), else None; iterative."""
    limit = MAX_DEPTH if limit is None else limit
    stack = [(doc, 0, "")]
    while stack:
        value, depth, pointer = stack.pop()
        if isinstance(value, (dict, list)):
            if depth >= limit:
                return pointer or "/"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend((v, depth + 1, f"{pointer}/{k}") for k, v in items if isinstance(v, (dict, list)))
    return None


# --- schemas -----------------------------------------------------------------

@lru_cache(maxsize=None)
def load_schema(schema: str) -> dict:
    """The shipped JSON Schema for a document id such as ``rlk-kit/stack/v1``."""
    match = SCHEMA_ID_RE.match(schema)
    if not match:
        raise BadInput(f"unknown schema id {schema!r}; expected 'rlk-kit/<name>/v<N>'")
    filename = f"{match.group(1)}.v{match.group(2)}.json"
    ref = resources.files("kit.schemas").joinpath(filename)
    if not ref.is_file():
        raise BadInput(f"unknown schema {schema!r}; shipped schemas: {', '.join(shipped_schemas())}")
    return json.loads(ref.read_text(encoding="utf-8"))


def shipped_schemas() -> list[str]:
    names = []
    for ref in resources.files("kit.schemas").iterdir():
        m = re.match(r"^([a-z][a-z0-9-]*)\.v([0-9]+)\.json$", ref.name)
        if m:
            names.append(schema_id(m.group(1), int(m.group(2))))
    return sorted(names)


@lru_cache(maxsize=None)
def _validator(schema: str):
    import jsonschema  # lazy: keeps CLI start-up fast

    doc = load_schema(schema)
    cls = jsonschema.validators.validator_for(doc)
    return cls(doc, format_checker=cls.FORMAT_CHECKER)


def json_pointer(parts: Iterable[Any]) -> str:
    """RFC 6901 pointer for a path of keys and indices; ``""`` is the whole document. It goes into
    one-line messages, so a control character of a key is written as its escape:
    ``json_pointer(["inputs", "a\rb"]) == "/inputs/a\\rb"``."""
    out = ""
    for part in parts:
        text = str(part).replace("~", "~0").replace("/", "~1")
        if not text.isprintable():
            text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
        out += "/" + text
    return out


def schema_problems(doc: Any, expected: str | None = None, *, as_schema: str | None = None) -> list[tuple[str, str]]:
    """Every schema violation as (JSON pointer, message); [] when the document is valid.

    ``expected`` is a schema name ("stack") or id ("rlk-kit/stack/v1") the document must carry.
    ``as_schema`` validates a document of an outside format that carries no ``schema`` field
    (an in-toto statement) against the shipped schema of that id.
    """
    if not isinstance(doc, dict):
        return [("", f"expected a JSON object, found {type(doc).__name__}")]
    declared = as_schema or doc.get("schema")
    if not isinstance(declared, str):
        return [("/schema", "missing 'schema' id (for example \"rlk-kit/stack/v1\")")]
    if expected is not None:
        wanted = expected if expected.startswith("rlk-kit/") else None
        name_ok = declared == wanted if wanted else (SCHEMA_ID_RE.match(declared) or [None, None])[1] == expected
        if not name_ok:
            return [("/schema", f"is {declared!r}, expected a {expected!r} document")]
    try:
        validator = _validator(declared)
    except BadInput as exc:
        return [("/schema", str(exc))]
    problems = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: (list(map(str, e.absolute_path)), e.message)):
        problems.append((json_pointer(err.absolute_path), _short_message(err)))
    return problems


def _short_message(err) -> str:
    if err.validator == "additionalProperties":
        return f"unknown field(s): {err.message.split('(')[-1].rstrip(')')}" if "(" in err.message else err.message
    if err.validator == "pattern":
        hint = err.schema.get("description") if isinstance(err.schema, dict) else None
        base = f"{err.instance!r} does not match the required form"
        return f"{base}: {hint}" if hint else f"{base} {err.validator_value!r}"
    msg = err.message
    return msg if len(msg) <= 300 else msg[:297] + "..."


def require_valid(doc: Any, source: str, expected: str | None = None, *, as_schema: str | None = None) -> dict:
    """Return the document or raise BadInput naming the source and the first few problems."""
    problems = schema_problems(doc, expected, as_schema=as_schema)
    if problems:
        shown = "; ".join(f"{ptr or '/'}: {msg}" for ptr, msg in problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise BadInput(f"{source}: {shown}{more}")
    return doc


def require_valid_as(doc: Any, source: str, schema: str) -> dict:
    """Like ``require_valid`` for a document without a ``schema`` field: ``schema`` is the id to use."""
    return require_valid(doc, source, as_schema=schema)


# --- hashing -----------------------------------------------------------------

def canonical_json(doc: Any) -> bytes:
    """The byte form that identities are computed over: sorted keys, no whitespace, UTF-8."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def sha256_of_document(doc: Any) -> str:
    return hashlib.sha256(canonical_json(doc)).hexdigest()


def sha256_of_file(path: Path | str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


# --- writing -----------------------------------------------------------------

def dumps_pretty(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def write_new_document(path: Path | str, doc: dict, *, expected: str | None = None,
                       schema: str | None = None) -> Path:
    """Validate, then write atomically and exclusively: an existing file is never overwritten.

    The bytes go to a temporary file first and are linked into place, so a reader never sees
    half a document and a second writer fails instead of replacing evidence. ``schema`` names the
    schema id for a document of an outside format that carries no ``schema`` field (in-toto).
    """
    path = Path(path)
    if schema is None:
        require_valid(doc, str(path), expected)
    else:
        require_valid_as(doc, str(path), schema)
    tmp = _write_beside(path, doc)
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise BadInput(f"{path}: already exists; evidence is never overwritten") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def replace_document(path: Path | str, doc: dict, *, expected: str | None = None) -> Path:
    """Validate, then replace ``path`` atomically. Only for the one document the kit may rewrite
    (a detached run's status); its caller checks that the rewrite is allowed."""
    path = Path(path)
    require_valid(doc, str(path), expected)
    os.replace(_write_beside(path, doc), path)
    return path


def _write_beside(path: Path, doc: dict) -> Path:
    """The document's bytes, flushed to disk in a temporary file next to ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(dumps_pretty(doc).encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())
    return tmp
