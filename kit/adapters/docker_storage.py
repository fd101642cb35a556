"""An image's layers read straight from a local Docker engine's store, without ``docker save``.

``docker save`` (Docker 20.10 to 27, classic image store) first copies every layer of the image,
the base's too, into a temporary directory and only then streams it: about 10 s for the 1.5 GB
smoke image before the first byte, the larger part of a reproducible build's overhead. The engine
keeps what it needs to write a layer's tar in two places: the files (overlay2's ``diff``
directory) and the tar's exact headers and padding (the tar-split record beside the layer,
``tar-split.json.gz``). :func:`stored_image` reads both, as the engine itself does for a save, so
the bytes are the engine's layer tar; each layer's sha256 is checked against the diff id the
image's config names, so a store that does not hold what the engine would send is caught.

This works only for a local engine with the overlay2 driver whose root directory this process can
read (``kit build`` as root beside the engine, as in CI). Anything else — a remote engine,
Podman, the containerd image store, another driver — gives None and the caller uses ``docker save``.
Example::

    stored = stored_image(client, image_id)        # None: use the save stream
    stored.diff_ids, stored.config                  # the engine's config bytes, checked by sha256
    for chunk in stored.layer_chunks(3): ...        # the engine's tar of layer 3, as chunks
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

_FILE, _SEGMENT = 1, 2          # tar-split entry types (github.com/vbatts/tar-split/tar/storage)
_BLOCK = 1 << 20


class StoreMismatch(Exception):
    """The engine's store does not hold what its records say (a file missing or of another size)."""


@dataclass(frozen=True)
class StoredImage:
    config: bytes                 # the image config exactly as the engine stored it (sha256 = image id)
    diff_ids: tuple[str, ...]
    layer_dirs: tuple[Path, ...]  # image/overlay2/layerdb/sha256/<chain id>/ of each layer
    driver_root: Path             # <DockerRootDir>/overlay2: each layer's files under <cache-id>/diff

    def layer_chunks(self, index: int):
        """The engine's tar of layer ``index``, in blocks of about 1 MiB (StoreMismatch on a gap)."""
        record = self.layer_dirs[index]
        diff = self.driver_root / (record / "cache-id").read_text().strip() / "diff"
        pending = bytearray()
        with gzip.open(record / "tar-split.json.gz", "rt", encoding="utf-8") as lines:
            for line in lines:
                entry = json.loads(line)
                if entry["type"] == _SEGMENT:
                    pending += base64.b64decode(entry.get("payload") or "")
                elif entry["type"] == _FILE and entry.get("size"):
                    name = entry["name"] if "name_raw" not in entry else os.fsdecode(base64.b64decode(entry["name_raw"]))
                    yield from _file_blocks(_inside(diff, name), entry["size"], pending)
                if len(pending) >= _BLOCK:
                    yield bytes(pending)
                    pending.clear()
        if pending:
            yield bytes(pending)


def _inside(diff: Path, name: str) -> Path:
    """The layer file ``name`` names, refused when the name would leave the layer's directory."""
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        raise StoreMismatch(f"{diff}: the layer's record names {name!r}, outside the layer")
    return diff.joinpath(*parts)


def _file_blocks(path: Path, size: int, pending: bytearray):
    """A file's bytes: small files join ``pending``; large ones go out in blocks of their own.
    The last component is opened without following a link (a regular file is what the record names)."""
    try:
        handle = os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")
    except OSError as error:
        raise StoreMismatch(f"{path}: {error.strerror}") from None
    with handle:
        left = size
        while left > 0:
            data = handle.read(min(left, _BLOCK))
            if not data:
                raise StoreMismatch(f"{path}: {size - left} bytes, the layer's record says {size}")
            left -= len(data)
            if len(pending) + len(data) < _BLOCK:
                pending += data
                continue
            if pending:
                yield bytes(pending)
                pending.clear()
            yield data


def stored_image(client, image_id: str) -> StoredImage | None:
    """The image as the local engine stores it, or None when this process cannot read that store."""
    try:
        info = client.info()
    except Exception:   # an engine that does not answer here is not a local store to read
        return None
    root = Path(info.get("DockerRootDir") or "/nonexistent")
    if info.get("Driver") != "overlay2" or not root.is_dir():
        return None
    image_root = root / "image" / "overlay2"
    digest = image_id.split(":", 1)[-1]
    try:
        config = (image_root / "imagedb" / "content" / "sha256" / digest).read_bytes()
    except OSError:     # not root, another host's engine, or the containerd image store
        return None
    if hashlib.sha256(config).hexdigest() != digest:
        return None
    diff_ids = tuple(json.loads(config).get("rootfs", {}).get("diff_ids", []))
    dirs, chain = [], None
    for diff_id in diff_ids:
        chain = diff_id if chain is None else "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
        record = image_root / "layerdb" / "sha256" / chain.split(":", 1)[1]
        if not (record / "tar-split.json.gz").is_file() or not (record / "cache-id").is_file():
            return None
        dirs.append(record)
    return StoredImage(config, diff_ids, tuple(dirs), root / "overlay2")
