"""The files of a run directory, read as evidence: regular files only, never a link out, bounded reads.

A sealed run dir holds plain regular files in plain directories. Anything else found while walking
it (a symbolic link, a FIFO, a device, a socket, a file with extra hard links) is a problem named by
path and never opened, so no artifact can make verification hang, read outside the tree or run out
of memory. Hashing opens with ``O_NOFOLLOW | O_NONBLOCK``, checks that the opened file is the one
that was walked, and reads at most ``limit + 1`` bytes. Example::

    listing = walk_run_dir(Path("ws/runs/r1"))
    listing.files["run.log"].size, listing.refused      # (4662, {})
    digest, size, over = hash_bounded(Path("ws/runs/r1"), "run.log", limit=4662)
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 1 << 20
# Directories deeper than this are refused: a run dir is two levels deep.
MAX_DEPTH = 32
MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class FileEntry:
    path: str          # POSIX path relative to the run dir
    size: int
    mode: int          # permission bits (st_mode & 0o7777)
    links: int
    device: int
    inode: int


@dataclass
class Listing:
    files: dict[str, FileEntry] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)    # path -> why it is not evidence


def kind_of(mode: int) -> str:
    """The kind of a non-regular file in words: ``kind_of(stat.S_IFIFO) == 'a FIFO'``."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def walk_run_dir(run_dir: Path, *, skip: tuple[str, ...] = ()) -> Listing:
    """Every entry under ``run_dir`` by lstat, links never followed; ``skip`` names top-level files left out."""
    listing = Listing()
    stack = [("", 0)]
    count = 0
    while stack:
        rel_dir, depth = stack.pop()
        try:
            entries = sorted(os.scandir(Path(run_dir, rel_dir) if rel_dir else run_dir), key=lambda e: e.name)
        except OSError as exc:
            listing.refused[rel_dir or "."] = f"cannot list ({exc.strerror or exc})"
            continue
        for entry in entries:
            count += 1
            if count > MAX_ENTRIES:
                listing.refused[rel_dir or "."] = f"more than {MAX_ENTRIES} entries; a run dir holds a few dozen"
                return listing
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if not rel_dir and entry.name in skip:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError as exc:
                listing.refused[rel] = f"cannot stat ({exc.strerror or exc})"
                continue
            if stat.S_ISDIR(info.st_mode):
                if depth + 1 > MAX_DEPTH:
                    listing.refused[rel] = f"nested deeper than {MAX_DEPTH} directories"
                else:
                    listing.dirs.append(rel)
                    stack.append((rel, depth + 1))
            elif stat.S_ISREG(info.st_mode):
                listing.files[rel] = FileEntry(rel, info.st_size, stat.S_IMODE(info.st_mode), info.st_nlink,
                                               info.st_dev, info.st_ino)
            else:
                listing.refused[rel] = f"{kind_of(info.st_mode)}; evidence is regular files only, never followed"
    listing.dirs.sort()
    return listing


def hash_bounded(run_dir: Path, rel: str, *, limit: int | None, expect: FileEntry | None = None) -> tuple[str, int, bool]:
    """``(sha256, bytes read, over_limit)`` of one regular file, reading at most ``limit + 1`` bytes.

    Raises OSError when the file cannot be opened as a regular file (a link, a FIFO swapped in after
    the walk) or is not the file ``expect`` describes."""
    fd = os.open(Path(run_dir, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, f"{kind_of(info.st_mode)} appeared in place of a file")
        if expect is not None and (info.st_dev, info.st_ino) != (expect.device, expect.inode):
            raise OSError(0, "replaced while being verified")
        h = hashlib.sha256()
        size = 0
        budget = None if limit is None else limit + 1
        while budget is None or budget > 0:
            block = os.read(fd, BLOCK if budget is None else min(BLOCK, budget))
            if not block:
                break
            size += len(block)
            h.update(block)
            if budget is not None:
                budget -= len(block)
        return h.hexdigest(), size, limit is not None and size > limit
    finally:
        os.close(fd)
