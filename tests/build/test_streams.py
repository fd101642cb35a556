"""The streams layers pass through: a forward-only reader over the engine's chunks, hashing a
window whether read or skipped, and a writer that hashes and writes on a background thread."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kit.build.layers import normalize_layer
from kit.build.streams import BackgroundWork, ForwardReader, HashingWriter


def chunked(data: bytes, cuts: list[int]):
    edges = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(edges, edges[1:])]


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=1, max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=8),
       window=st.tuples(st.integers(0, 3000), st.integers(0, 3000)),
       steps=st.lists(st.tuples(st.booleans(), st.integers(0, 700)), max_size=12))
def test_reader_gives_the_bytes_and_hashes_the_window_read_or_skipped(data, cuts, window, steps):
    reader = ForwardReader(chunked(data, cuts))
    start = window[0] % len(data)
    size = window[1] % (len(data) - start + 1)
    assert reader.read(start) == data[:start]
    reader.hash_window(start, size)
    for is_read, amount in steps:
        position = reader.tell()
        if is_read:   # every byte read is the byte at its position
            assert reader.read(amount) == data[position:position + amount]
        else:
            assert reader.seek(amount, 1) == min(position + amount, len(data))
    reader.seek(max(reader.tell(), start + size))   # the rest of the window passes, skipped
    assert reader.digest() == "sha256:" + hashlib.sha256(data[start:start + size]).hexdigest()


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=5000), cuts=st.lists(st.integers(0, 5000), max_size=8),
       sizes=st.lists(st.integers(0, 900), max_size=20))
def test_reads_return_exactly_the_stream(data, cuts, sizes):
    reader = ForwardReader(chunked(data, cuts) if data else [])
    out = bytearray()
    for size in sizes:
        piece = reader.read(size)
        assert len(piece) == min(size, len(data) - len(out))
        out += piece
    out += reader.read()
    assert bytes(out) == data and reader.tell() == len(data)


def test_reader_refuses_to_seek_back_or_from_the_end():
    reader = ForwardReader([b"abcdef"])
    reader.read(4)
    with pytest.raises(io.UnsupportedOperation, match="only seeks forward"):
        reader.seek(2)
    with pytest.raises(io.UnsupportedOperation, match="only seeks forward"):
        reader.seek(0, 2)
    assert reader.seek(1, 1) == 5 and reader.read() == b"f"


def test_digest_before_the_window_has_passed_is_refused():
    reader = ForwardReader([b"a" * 10, b"b" * 10])
    reader.hash_window(5, 10)
    reader.read(3)
    with pytest.raises(ValueError, match="window ends at 15"):
        reader.digest()


def test_writer_hashes_and_writes_everything_in_order():
    out = io.BytesIO()
    pieces = [b"x" * 100, b"y" * (3 << 20), b"z" * 7, bytearray(b"w" * 5000)]
    with HashingWriter(out) as writer:
        for piece in pieces:
            writer.write(piece)
    whole = b"".join(bytes(p) for p in pieces)
    assert out.getvalue() == whole and writer.size == len(whole) and writer.tell() == len(whole)
    assert writer.hexdigest() == hashlib.sha256(whole).hexdigest()


def test_an_error_in_the_background_reaches_the_caller():
    class Full(io.RawIOBase):
        def write(self, data):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        with HashingWriter(Full()) as writer:
            writer.write(b"a" * (2 << 20))
            writer.write(b"b" * (2 << 20))
    work = BackgroundWork(lambda item: 1 / item)
    work.put(0)
    with pytest.raises(ZeroDivisionError):
        work.close()


def test_a_layer_normalized_from_the_stream_equals_one_normalized_from_a_file(tmp_path):
    """The engine's save stream, as chunks, and the same tar as a file give the same bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for index in range(300):
            info = tarfile.TarInfo(f"opt/venv/lib/python3.11/site-packages/pkg{index // 30}/"
                                   + "m" * (index % 120) + f"{index}.py")
            body = bytes([index % 256]) * (index * 37 % 5000)
            info.size, info.mtime, info.uname = len(body), 1_800_000_000 + index, "builder"
            tar.addfile(info, io.BytesIO(body))
    data = buf.getvalue()
    from_file, from_stream = io.BytesIO(), io.BytesIO()
    a = normalize_layer(io.BytesIO(data), from_file, epoch=1704067200)
    b = normalize_layer(ForwardReader(chunked(data, [511, 4096, 70000, 70001, 200000])), from_stream, epoch=1704067200)
    assert from_file.getvalue() == from_stream.getvalue() and a.diff_id == b.diff_id and a.entries == 300
