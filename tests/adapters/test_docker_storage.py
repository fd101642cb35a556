"""A layer's tar rebuilt from a tar-split record and a diff directory, as the engine keeps them:
the exact bytes of the tar the record was taken from, and a record that names what the directory
does not hold (or a path outside it) is refused. No engine: the store is written here."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from kit.adapters.docker_storage import StoredImage, StoreMismatch


def a_layer_tar() -> tuple[bytes, dict[str, bytes]]:
    buf, files = io.BytesIO(), {}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, body in [("opt/", None), ("opt/a", b"alpha\n"), ("opt/empty", b""), ("opt/big", os.urandom(3 << 20)),
                           ("opt/" + "d" * 150 + "/deep", b"deep"), ("opt/ü name", b"x")]:
            info = tarfile.TarInfo(name.rstrip("/"))
            if body is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
            files[name] = body
        link = tarfile.TarInfo("opt/link")
        link.type, link.linkname = tarfile.SYMTYPE, "a"
        tar.addfile(link)
    return buf.getvalue(), files


def write_store(root: Path, data: bytes, files: dict[str, bytes]) -> StoredImage:
    """A tar-split record of ``data`` (headers and padding as segments, file bodies by name) and
    the files in overlay2/<cache-id>/diff, laid out as the engine lays them out."""
    record = root / "image" / "overlay2" / "layerdb" / "sha256" / ("1" * 64)
    diff = root / "overlay2" / "cache1" / "diff"
    record.mkdir(parents=True)
    (record / "cache-id").write_text("cache1")
    entries, position = [], 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            entries.append({"type": 2, "payload": base64.b64encode(data[position:member.offset_data]).decode()})
            entries.append({"type": 1, "name": member.name, "size": member.size})
            position = member.offset_data + member.size
    entries.append({"type": 2, "payload": base64.b64encode(data[position:]).decode()})
    with gzip.open(record / "tar-split.json.gz", "wt") as out:
        out.write("".join(json.dumps(e) + "\n" for e in entries))
    for name, body in files.items():
        (diff / name).parent.mkdir(parents=True, exist_ok=True)
        (diff / name).write_bytes(body)
    return StoredImage(b"{}", ("sha256:" + "1" * 64,), (record,), root / "overlay2")


def test_the_record_and_the_files_give_back_the_exact_tar(tmp_path):
    data, files = a_layer_tar()
    stored = write_store(tmp_path, data, files)
    chunks = list(stored.layer_chunks(0))
    assert b"".join(chunks) == data
    assert max(len(c) for c in chunks) <= 1 << 20 and len(chunks) >= 3   # blocks, not one buffer


def test_a_file_missing_or_shorter_than_its_record_is_refused(tmp_path):
    data, files = a_layer_tar()
    stored = write_store(tmp_path, data, files)
    (stored.driver_root / "cache1" / "diff" / "opt" / "a").write_bytes(b"al")
    with pytest.raises(StoreMismatch, match="2 bytes, the layer's record says 6"):
        b"".join(stored.layer_chunks(0))
    (stored.driver_root / "cache1" / "diff" / "opt" / "a").unlink()
    with pytest.raises(StoreMismatch, match="opt/a: No such file"):
        b"".join(stored.layer_chunks(0))


def test_a_record_naming_a_path_outside_the_layer_or_a_link_is_refused(tmp_path):
    data, files = a_layer_tar()
    stored = write_store(tmp_path, data, files)
    record = stored.layer_dirs[0] / "tar-split.json.gz"
    lines = gzip.decompress(record.read_bytes()).decode().splitlines()
    escaped = [line.replace('"opt/a"', '"../../../etc/hostname"') for line in lines]
    record.write_bytes(gzip.compress(("\n".join(escaped) + "\n").encode()))
    with pytest.raises(StoreMismatch, match="outside the layer"):
        b"".join(stored.layer_chunks(0))
    record.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    target = stored.driver_root / "cache1" / "diff" / "opt" / "a"
    target.unlink()
    target.symlink_to("/etc/hostname")
    with pytest.raises(StoreMismatch, match="opt/a"):
        b"".join(stored.layer_chunks(0))
