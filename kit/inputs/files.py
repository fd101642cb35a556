"""Content hashes of input files and trees, with a cache keyed by path, size and mtime.

Model checkpoints are tens of GiB; hashing them on every ``kit prepare``, ``kit doctor`` or run
manifest would take minutes. The cache remembers ``sha256`` per absolute path together with the
file's size and ``mtime_ns``; any change to either re-hashes the file. Example::

    files = hash_tree(Path("/models/Qwen3-8B"), Path("ws/cache/hashes.json"))
    files["model-00001-of-00005.safetensors"]   # '3f2a...'
    tree_sha256(files)                            # one digest for the whole tree

The cache is a convenience, never evidence: a stale entry is impossible unless a file is rewritten
with the same size and the same nanosecond mtime.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from kit.model.documents import schema_id
from kit.model.errors import BadInput
from kit.model.progress import ProgressLine

CACHE_SCHEMA = schema_id("hash-cache")
CHUNK = 1 << 20


class HashCache:
    """``{absolute path: {size, mtime_ns, sha256}}`` loaded from and saved to one JSON file.

    ``HashCache(None)`` is an in-memory cache that is never saved.
    """

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else None
        self.entries: dict[str, dict] = {}
        self.dirty = False
        if self.path is not None and self.path.is_file():
            self.entries = _read_cache(self.path)

    def lookup(self, key: str, size: int, mtime_ns: int) -> str | None:
        entry = self.entries.get(key)
        if entry and entry.get("size") == size and entry.get("mtime_ns") == mtime_ns:
            return entry.get("sha256")
        return None

    def store(self, key: str, size: int, mtime_ns: int, sha256: str) -> None:
        self.entries[key] = {"size": size, "mtime_ns": mtime_ns, "sha256": sha256}
        self.dirty = True

    def save(self) -> None:
        """Write atomically (temp file + rename) so a crash never leaves half a cache."""
        if self.path is None or not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"schema": CACHE_SCHEMA, "entries": dict(sorted(self.entries.items()))}
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)
        self.dirty = False


def _read_cache(path: Path) -> dict[str, dict]:
    # A damaged cache only costs a re-hash, so it is ignored rather than refused.
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("schema") != CACHE_SCHEMA or not isinstance(doc.get("entries"), dict):
        return {}
    return {k: v for k, v in doc["entries"].items() if isinstance(v, dict)}


def sha256_stream(fh, chunk: int = CHUNK, on_bytes: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    while True:
        block = fh.read(chunk)
        if not block:
            return h.hexdigest()
        h.update(block)
        if on_bytes is not None:
            on_bytes(len(block))


def hash_file_cached(path: Path | str, cache: HashCache | None = None,
                     on_bytes: Callable[[int], None] | None = None) -> str:
    """sha256 of one file's content, answered from ``cache`` when size and mtime are unchanged.

    ``on_bytes`` is told the size of each block as it is hashed (not for a cached answer).
    ``hash_file_cached("ws/data/dapo-math-17k.jsonl", HashCache("ws/cache/hashes.json"))``
    """
    path = Path(path)
    try:
        info = path.stat()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror})") from None
    if not path.is_file():
        raise BadInput(f"{path}: not a regular file")
    key = str(path.resolve())
    if cache is not None:
        known = cache.lookup(key, info.st_size, info.st_mtime_ns)
        if known:
            return known
    try:
        with open(path, "rb") as fh:
            digest = sha256_stream(fh, on_bytes=on_bytes)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror})") from None
    if cache is not None:
        cache.store(key, info.st_size, info.st_mtime_ns, digest)
    return digest


def list_tree(root: Path) -> list[str]:
    """Relative POSIX paths of every regular file under ``root`` (links to files followed), sorted.

    Hugging Face cache snapshots are trees of symbolic links into a blob store, so file links
    are followed; directory links are not, which keeps a link cycle from looping.
    """
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            full = Path(dirpath, name)
            if full.is_file():
                out.append(full.relative_to(root).as_posix())
    return sorted(out)


def hash_tree(root: Path | str, cache_path: Path | str | None = None, *,
              progress: TextIO | None = None) -> dict[str, str]:
    """``{relative_path: sha256}`` for every file under ``root``; the cache file is updated.

    With ``progress`` (a stream, normally stderr), files and bytes hashed so far are reported there
    while a file is read: a 16 GiB checkpoint takes minutes. Answers from the cache are counted
    as done at once; a tree answered wholly from the cache prints nothing.
    ``hash_tree("/models/Qwen3-8B", "ws/cache/hashes.json", progress=sys.stderr)["config.json"]``
    """
    root = Path(root)
    if not root.is_dir():
        raise BadInput(f"{root}: not a directory")
    cache = HashCache(cache_path)
    names = list_tree(root)
    bar = HashProgress(progress, root, names) if progress is not None else None
    try:
        out = {}
        for rel in names:
            out[rel] = hash_file_cached(root / rel, cache, on_bytes=bar.advance if bar else None)
            if bar:
                bar.file_done(root / rel)
        return out
    finally:
        if bar:
            bar.finish()
        cache.save()


class HashProgress:
    """``hashing /models/Qwen3-8B: 2/5 files, 6.1/15.3 GiB (40%), 410 MiB/s`` on stderr.

    At most one update per ``interval_s`` (on a terminal the line is redrawn in place, otherwise a new
    line each time, so logs stay readable), and one closing line when anything was hashed."""

    def __init__(self, stream: TextIO, root: Path, names: list[str], interval_s: float | None = None):
        self.root = root
        self.line = ProgressLine(stream, interval_s=interval_s)
        self.files_total = len(names)
        self.bytes_total = sum(_size(root / n) for n in names)
        self.files_done = self.bytes_done = self.bytes_hashed = self.finished_bytes = 0
        self.t0 = time.monotonic()

    def advance(self, n: int) -> None:
        self.bytes_done += n
        self.bytes_hashed += n
        if self.line.due():
            self.line.update(self._line(time.monotonic()))

    def file_done(self, path: Path) -> None:
        # a file answered from the cache counts at once; a hashed one already counted block by block
        self.files_done += 1
        self.finished_bytes += _size(path)
        self.bytes_done = self.finished_bytes

    def _line(self, now: float) -> str:
        pct = 100.0 * self.bytes_done / self.bytes_total if self.bytes_total else 100.0
        rate = self.bytes_hashed / max(now - self.t0, 1e-6)
        return (f"hashing {self.root}: {self.files_done}/{self.files_total} files, {_human(self.bytes_done)}/"
                f"{_human(self.bytes_total)} ({pct:.0f}%), {_human(rate)}/s")

    def finish(self) -> None:
        if self.bytes_hashed or self.line.drawn:
            self.line.update(self._line(time.monotonic()), final=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _human(n: float) -> str:
    """``_human(1536) == "1.5 KiB"``"""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"


def tree_sha256(files: dict[str, str]) -> str:
    """One digest over a tree: sha256 of the ``sha256sum``-style lines ``<hex>  <path>\\n``, sorted by path.

    The same tree gives the same digest wherever it lives; ``sha256sum -c`` can check the lines.
    """
    lines = "".join(f"{files[rel]}  {rel}\n" for rel in sorted(files))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()
