"""Reading a file a user named: a regular file only, opened without blocking, read with a bound.

A FIFO would block ``open()`` forever and a link to ``/dev/zero`` would read until memory runs out,
so every reader of a path from the command line opens it with ``O_NONBLOCK``, checks with ``fstat``
that it is a regular file, and reads at most ``limit`` bytes. Every refusal is a BadInput naming the
path and what is accepted. Example::

    raw = read_regular_bytes(Path("G10.log"), limit=64 << 20, what="a VIME log")
    for line in iter_regular_lines(Path("G10.log"), limit=512 << 20, what="a VIME log"):
        ...
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from kit.model.errors import BadInput

BLOCK = 1 << 20
# A log is held in memory as lines; 512 MiB is far over any run.log the kit has written and still fits.
MAX_LOG_BYTES = 512 << 20


def _mib(limit: int) -> str:
    return f"{limit / (1 << 20):g} MiB"


def _accepted(what: str, limit: int) -> str:
    return f"expected {what}: a regular file under {_mib(limit)}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: Path | str, *, limit: int, what: str = "a file") -> int:
    """A read-only descriptor of ``path``, a regular file of at most ``limit`` bytes (a link to one is
    followed); BadInput names the path otherwise. The caller closes the descriptor."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file; {_accepted(what, limit)}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadInput(f"{path}: symbolic link loop; {_accepted(what, limit)}") from None
        if exc.errno == errno.EISDIR:
            raise BadInput(f"{path}: is a directory; {_accepted(what, limit)}") from None
        raise BadInput(f"{path}: cannot read ({exc.strerror}); {_accepted(what, limit)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(f"{path}: is {_kind(info.st_mode)}; {_accepted(what, limit)}")
        if info.st_size > limit:
            raise BadInput(f"{path}: {info.st_size} bytes is over the {_mib(limit)} limit; {_accepted(what, limit)}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_bytes(path: Path | str, *, limit: int, what: str = "a file") -> bytes:
    """All bytes of ``path`` (see ``open_regular``); one that grows past ``limit`` while read is refused."""
    path = Path(path)
    fd = open_regular(path, limit=limit, what=what)
    chunks, size = [], 0
    try:
        while size <= limit:
            block = os.read(fd, min(BLOCK, limit + 1 - size))
            if not block:
                break
            chunks.append(block)
            size += len(block)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if size > limit:
        raise BadInput(f"{path}: over the {_mib(limit)} limit (it grew while read); {_accepted(what, limit)}")
    return b"".join(chunks)


def read_regular_text(path: Path | str, *, limit: int, what: str = "a file") -> str:
    """``read_regular_bytes`` decoded as UTF-8, undecodable bytes replaced."""
    return read_regular_bytes(path, limit=limit, what=what).decode("utf-8", errors="replace")


def iter_regular_lines(path: Path | str, *, limit: int = MAX_LOG_BYTES, what: str = "a log file") -> Iterator[str]:
    """The lines of ``path`` as text (undecodable bytes replaced), streamed; the file is checked when
    the first line is asked for, and reading stops with a BadInput past ``limit`` bytes."""
    path = Path(path)
    fd = open_regular(path, limit=limit, what=what)
    with os.fdopen(fd, "rb") as fh:
        size = 0
        try:
            for raw in fh:
                size += len(raw)
                if size > limit:
                    raise BadInput(f"{path}: over the {_mib(limit)} limit (it grew while read); {_accepted(what, limit)}")
                yield raw.decode("utf-8", errors="replace")
        except OSError as exc:
            raise BadInput(f"{path}: cannot read ({exc.strerror})") from None
