"""Layer tarballs the kit writes itself, so an image's bytes depend on its inputs only.

A layer as an engine tars it carries the build machine's clock (file mtimes), user names and the
entry order its storage driver walks in. :func:`normalize_layer` rewrites one layer tar:
entries in canonical order (depth-first, names sorted per directory), every mtime set to the
build's epoch, numeric owners only, no access/change times, and the files that only record when
or where a build ran (logs, caches, machine-id) left out. Its sha256 is the layer's diff id.
Pure: file objects in, file objects out; no engine. Example::

    with open("layer.tar", "rb") as src, open("out.tar", "wb") as dst:
        result = normalize_layer(src, dst, epoch=1704067200)   # src: any readable stream
    result.diff_id                          # "sha256:…", equal on every machine for equal files
    first_differences(listing_a, listing_b)  # [("opt/rlk/built-at", {...}, {...})]
"""

from __future__ import annotations

import fnmatch
import hashlib
import tarfile
from dataclasses import dataclass, field
from typing import BinaryIO

from kit.build.streams import CHUNK, HashingWriter

# Files that record when/where a build ran, not what it built (Reproducible Builds' list).
DROPPED = ("var/log/*", "var/cache/ldconfig/aux-cache", "var/lib/apt/lists/*", "var/cache/apt/*",
           "var/cache/debconf/*-old", "etc/machine-id", "var/lib/dbus/machine-id", "root/.cache/*")
# Extended headers worth keeping: extended attributes (file capabilities). atime/ctime/mtime fractions are not.
_KEPT_PAX = ("SCHILY.xattr.",)


@dataclass
class LayerResult:
    diff_id: str                 # sha256:<hex> of the normalized tar
    size: int
    entries: int
    dropped: list[str] = field(default_factory=list)
    reordered: bool = False      # the engine's order was not canonical (the tar was sorted)


def canonical_key(name: str) -> tuple[str, ...]:
    """Depth-first order with names sorted per directory: ``a`` < ``a/b`` < ``a.txt``."""
    return tuple(name.strip("/").split("/"))


def is_dropped(name: str) -> bool:
    path = name.strip("/")
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in DROPPED)


def _normal_header(member: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(member.name.lstrip("./") if member.name.startswith("./") else member.name)
    info.type, info.mode, info.size = member.type, member.mode, member.size if member.isreg() else 0
    info.linkname, info.uid, info.gid = member.linkname, member.uid, member.gid
    info.uname = info.gname = ""
    info.devmajor, info.devminor = member.devmajor, member.devminor
    info.mtime = epoch
    info.pax_headers = {k: v for k, v in member.pax_headers.items() if k.startswith(_KEPT_PAX)}
    return info


def normalize_layer(src: BinaryIO, dst: BinaryIO, *, epoch: int) -> LayerResult:
    """Rewrite the layer tar ``src`` into ``dst``; see the module docstring.

    ``src`` is read once, front to back: it needs ``read``, ``tell`` and a ``seek`` that only
    ever goes forward (a file, or the kit's reader over the engine's save stream). Engines tar a
    layer in the canonical order already (a sorted directory walk), so nothing is held back. When
    an entry comes out of order the result says ``reordered`` and :func:`sort_layer` must run over
    ``dst``. (tarfile's "r:"/"w:" modes with 1 MiB copies, not its stream modes: the same bytes
    in about 60% of the time, the stream modes moving data 10 KiB at a time.)
    """
    kept = 0
    dropped_names: list[str] = []
    reordered, last = False, ()
    with HashingWriter(dst) as writer, tarfile.open(fileobj=src, mode="r:") as tar, \
            tarfile.open(fileobj=writer, mode="w:", format=tarfile.PAX_FORMAT) as out:
        out.copybufsize = CHUNK
        for member in tar:
            key = canonical_key(member.name)
            reordered = reordered or key < last
            last = max(last, key)
            if is_dropped(member.name) and not member.isdir():
                dropped_names.append(member.name)
                continue
            info = _normal_header(member, epoch)
            out.addfile(info, tar.extractfile(member) if info.isreg() else None)
            kept += 1
    return LayerResult("sha256:" + writer.hexdigest(), writer.size, kept, dropped_names, reordered)


def sort_layer(src: BinaryIO, dst: BinaryIO, *, epoch: int) -> LayerResult:
    """Rewrite a seekable layer tar in canonical order (for an engine that tars in another order)."""
    with tarfile.open(fileobj=src, mode="r:") as tar:
        members = sorted(tar.getmembers(), key=lambda m: canonical_key(m.name))
        names = {m.name for m in members}
        written: set[str] = set()
        with HashingWriter(dst) as writer, tarfile.open(fileobj=writer, mode="w:", format=tarfile.PAX_FORMAT) as out:
            out.copybufsize = CHUNK
            for member in members:
                info = _normal_header(member, epoch)
                if member.islnk() and member.linkname not in written and member.linkname in names:
                    # Hard links point at the first name written; the sort can put a link first.
                    target = tar.getmember(member.linkname)
                    info.type, info.size, info.linkname = tarfile.REGTYPE, target.size, ""
                    out.addfile(info, tar.extractfile(target))
                else:
                    out.addfile(info, tar.extractfile(member) if info.isreg() else None)
                written.add(member.name)
    return LayerResult("sha256:" + writer.hexdigest(), writer.size, len(members))


def layer_listing(src: BinaryIO) -> dict[str, dict]:
    """``{path: {size, mode, mtime, sha256, type}}`` of every entry of a layer tar (streamed)."""
    out: dict[str, dict] = {}
    with tarfile.open(fileobj=src, mode="r|") as tar:
        for member in tar:
            sha = ""
            if member.isreg():
                digest, handle = hashlib.sha256(), tar.extractfile(member)
                for chunk in iter(lambda: handle.read(CHUNK), b""):
                    digest.update(chunk)
                sha = digest.hexdigest()
            out[member.name] = {"type": member.type.decode(), "size": member.size, "mode": f"{member.mode:04o}",
                                "mtime": int(member.mtime), "uid": member.uid, "gid": member.gid,
                                "linkname": member.linkname, "sha256": sha}
    return out


def first_differences(a: dict[str, dict], b: dict[str, dict], limit: int = 10) -> list[tuple[str, dict | None, dict | None]]:
    """The first ``limit`` paths (canonical order) whose entry differs between two listings."""
    out = []
    for path in sorted(set(a) | set(b), key=canonical_key):
        if a.get(path) != b.get(path):
            out.append((path, a.get(path), b.get(path)))
            if len(out) >= limit:
                break
    return out
