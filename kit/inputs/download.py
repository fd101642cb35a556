"""Resumable HTTP download with a progress bar and checksum verification (urllib only).

The bytes go to ``<dest>.partial``; an interrupted download keeps it, and the next call asks the
server for the rest with an HTTP ``Range`` request. Only a complete file whose sha256 matched is
renamed to ``dest``, so ``dest`` existing means "complete and verified". Example::

    got = download(URL, Path("ws/downloads/dapo.parquet"), expected_sha256=None, progress=sys.stderr)
    got.sha256, got.checksum_source      # '...', 'server' (Hugging Face sends the LFS sha256)

Where does the expected checksum come from? The caller's ``expected_sha256`` when given; otherwise
a 64-hex ``X-Linked-ETag`` header of the final response or of any redirect on the way, or the final
response's ``ETag``. The Hugging Face hub states the sha256 of LFS files as ``X-Linked-ETag`` on the
302 that sends the client to its CDN, whose own headers do not carry it, so every redirect's headers
are kept. Without either, the download is still size-checked against Content-Length, and the result
says ``checksum_source: None``.

Beside ``dest`` the check that was made is recorded (``<dest>.download.json``,
``rlk-kit/download-record/v1``), so a later reuse of the file can say what it was verified against
(:func:`read_record`) instead of assuming it.
"""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import TextIO

from kit import __version__
from kit.model.documents import read_json_file, require_valid, schema_id
from kit.model.errors import BadInput
from kit.inputs.files import sha256_stream
import datetime as _dt
from kit.model.documents import replace_document
from kit.model.errors import KitError
from kit.model.progress import ProgressLine

CHUNK = 1 << 20
SHA256_RE = re.compile(r'^(?:W/)?"?([0-9a-f]{64})"?$')
CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


@dataclass(frozen=True)
class Download:
    url: str
    path: Path
    sha256: str
    size: int
    resumed_from: int            # bytes already present in the .partial file when this call started
    expected_sha256: str | None
    checksum_source: str | None  # "caller", "server" or None (size-checked only)


def partial_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".partial")


def record_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".download.json")


def _sha256_header(headers, name: str) -> str | None:
    value = headers.get(name) if headers is not None else None
    m = SHA256_RE.match(value.strip()) if value else None
    return m.group(1) if m else None


def server_sha256(headers, redirects: tuple = ()) -> str | None:
    """The sha256 a server states for the whole file, if it states one (Hugging Face LFS ETags).

    ``redirects`` are the headers of the redirect responses on the way, first hop first. ``X-Linked-ETag``
    names the linked file's content wherever it appears (the hub sends it on the 302, the CDN does
    not), the hop nearest the file winning; a plain ``ETag`` counts only on the final response, as a
    redirect's own ETag describes the redirect.
    """
    for hop in (headers, *reversed(redirects)):
        found = _sha256_header(hop, "X-Linked-ETag")
        if found:
            return found
    return _sha256_header(headers, "ETag")


class _RedirectHeaders(urllib.request.HTTPRedirectHandler):
    """Follows redirects as urllib does, keeping each redirect response's headers."""

    def __init__(self):
        super().__init__()
        self.hops: list = []

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self.hops.append(headers)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def download(
    url: str,
    dest: Path | str,
    *,
    expected_sha256: str | None = None,
    progress: TextIO | None = None,
    timeout: float = 60.0,
) -> Download:
    """Fetch ``url`` into ``dest``, resuming a previous ``.partial``; raise BadInput on any failure.

    A truncated transfer keeps the partial file (run again to resume); a checksum mismatch deletes it,
    because resuming a corrupt prefix would never converge.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(dest)
    offset = partial.stat().st_size if partial.is_file() else 0

    response, redirects = _open(url, offset, timeout)
    if response is None:  # 416: the partial already holds every byte the server has
        stated, total = server_sha256(None, redirects), offset
    else:
        with response:
            status = getattr(response, "status", 200)
            if offset and status != 206:
                offset = 0  # the server ignored Range: start over rather than append a second copy
            elif status == 206:
                m = CONTENT_RANGE_RE.match(response.headers.get("Content-Range", ""))
                if not m or int(m.group(1)) != offset:
                    raise BadInput(f"{url}: server answered the resume request with Content-Range "
                                   f"{response.headers.get('Content-Range')!r}, expected bytes {offset}-...")
            length = response.headers.get("Content-Length")
            total = offset + int(length) if length and length.isdigit() else None
            stated = server_sha256(response.headers, redirects)
            _copy(response, partial, offset, total, url, progress)

    size = partial.stat().st_size
    if total is not None and size != total:
        raise BadInput(f"{url}: download truncated at {size} of {total} bytes; "
                       f"{partial} is kept, run the command again to resume")
    expected, source = (expected_sha256, "caller") if expected_sha256 else (stated, "server" if stated else None)
    with open(partial, "rb") as fh:
        digest = sha256_stream(fh)
    if expected and digest != expected:
        partial.unlink(missing_ok=True)
        raise BadInput(f"{url}: checksum mismatch: sha256 {digest}, expected {expected} "
                       f"({'given' if source == 'caller' else 'stated by the server'}); the download was removed")
    got = Download(url, dest, digest, size, offset, expected, source)
    # the record first: a file at dest without one only loses what it was checked against, never lies
    _write_record(got)
    os.replace(partial, dest)
    return got


RECORD_SCHEMA = schema_id("download-record")


def _write_record(got: Download) -> None:


    doc = {"schema": RECORD_SCHEMA, "url": got.url, "file": got.path.name, "sha256": got.sha256, "size": got.size,
           "checksum_source": got.checksum_source, "expected_sha256": got.expected_sha256,
           "completed_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "kit_version": __version__}
    # replaces the record of an earlier, abandoned download of the same file (validated, fsynced)
    replace_document(record_path(got.path), doc, expected=RECORD_SCHEMA)


def read_record(dest: Path | str) -> dict | None:
    """The record :func:`download` wrote beside ``dest``; None when there is none or it does not read
    (a file put there by hand, or by a kit that kept no record: how it was checked is unknown)."""

    try:
        return require_valid(read_json_file(record_path(Path(dest))), str(record_path(Path(dest))), RECORD_SCHEMA)
    except KitError:
        return None


def _open(url: str, offset: int, timeout: float):
    """``(response, headers of each redirect on the way)``; the response is None for a 416 that says
    the partial file is already complete."""
    headers = {"User-Agent": f"rlk-kit/{__version__}"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    redirects = _RedirectHeaders()
    opener = urllib.request.build_opener(redirects)
    try:
        return opener.open(urllib.request.Request(url, headers=headers), timeout=timeout), tuple(redirects.hops)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:
            m = re.match(r"^bytes \*/(\d+)$", exc.headers.get("Content-Range", "") or "")
            if m and int(m.group(1)) == offset:
                return None, tuple(redirects.hops)
        raise BadInput(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, HTTPException, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise BadInput(f"{url}: cannot download ({reason})") from None


def _copy(response, partial: Path, offset: int, total: int | None, url: str, progress: TextIO | None) -> None:
    bar = _Progress(progress, offset, total)
    mode = "ab" if offset else "wb"
    try:
        with open(partial, mode) as out:
            while True:
                block = response.read(CHUNK)
                if not block:
                    break
                out.write(block)
                bar.advance(len(block))
    except (HTTPException, OSError) as exc:
        # IncompleteRead, a reset connection or a timeout: what arrived is kept for the resume.
        bar.finish()
        have = partial.stat().st_size if partial.exists() else 0
        raise BadInput(f"{url}: download interrupted at {have} bytes ({type(exc).__name__}); "
                       f"{partial} is kept, run the command again to resume") from None
    bar.finish()


class _Progress:
    """``  12.0 MiB / 40.0 MiB  30%  5.1 MiB/s`` on one line of stderr, at most ten updates a second."""

    def __init__(self, stream: TextIO | None, done: int, total: int | None):
        self.done, self.total = done, total
        self.line = ProgressLine(stream, tty_interval_s=0.1)
        self.start_bytes, self.t0 = done, time.monotonic()

    def advance(self, n: int) -> None:
        self.done += n
        if self.line.due():
            self.line.update(self._text(time.monotonic()))

    def _text(self, now: float) -> str:
        mib = 1 << 20
        rate = (self.done - self.start_bytes) / max(now - self.t0, 1e-6) / mib
        if self.total:
            pct = 100.0 * self.done / self.total
            width = 30
            fill = int(width * self.done / self.total)
            return (f"[{'#' * fill}{'.' * (width - fill)}] {self.done / mib:8.1f} / {self.total / mib:.1f} MiB "
                    f"{pct:5.1f}%  {rate:6.1f} MiB/s")
        return f"{self.done / mib:8.1f} MiB  {rate:6.1f} MiB/s"

    def finish(self) -> None:
        self.line.update(self._text(time.monotonic()), final=True)
