"""Byte streams the kit reads and writes image layers through, fast on two cores.

Rewriting a layer is tar parsing (Python, under the GIL) plus sha256 and file writes (which
release the GIL). :class:`HashingWriter` and :class:`ForwardReader` push the second kind onto a
background thread, so both cores work: about 1.3 GB of layer is hashed twice (the engine's diff id
and the kit's) and written once per build. Example::

    with open("out.tar", "wb") as dst, HashingWriter(dst) as writer:
        writer.write(b"...")
    writer.hexdigest(), writer.size

    reader = ForwardReader(client.api.get_image(image_id, chunk_size=1 << 20))
    sha = reader.hash_window(start, size)   # hashed as those bytes pass, read or skipped
"""

from __future__ import annotations

import hashlib
import io
import queue
import threading
from typing import BinaryIO, Callable

CHUNK = 1 << 20


class BackgroundWork:
    """Applies ``work(item)`` to each item put, in order, on one background thread.

    ``close()`` waits for the queue to drain and re-raises the first error ``work`` raised; the
    queue is bounded, so a slow consumer holds the producer back rather than filling memory.
    """

    def __init__(self, work: Callable[[object], None], depth: int = 16):
        self.work, self.error = work, None
        self.items: queue.Queue = queue.Queue(maxsize=depth)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for item in iter(self.items.get, None):
            if self.error is None:
                try:
                    self.work(item)
                except BaseException as error:   # re-raised by close() in the producer's thread
                    self.error = error

    def put(self, item) -> None:
        if self.error is not None:
            raise self.error
        self.items.put(item)

    def close(self) -> None:
        if self.thread.is_alive():
            self.items.put(None)
            self.thread.join()
        if self.error is not None:
            raise self.error


class HashingWriter:
    """A write-only file that hashes and counts what passes through to ``out``.

    Small writes (tar headers) are gathered into 1 MiB blocks; hashing and writing the blocks run
    on a background thread. Use it as a context manager: the digest is final after the exit.
    """

    def __init__(self, out: BinaryIO):
        self.out, self.sha, self.size = out, hashlib.sha256(), 0
        self.pending = bytearray()
        self.worker = BackgroundWork(self._absorb)

    def _absorb(self, block: bytes) -> None:
        self.sha.update(block)
        self.out.write(block)

    def write(self, data) -> int:
        size = len(data)
        self.size += size
        if size >= CHUNK:
            self._flush()
            self.worker.put(bytes(data))
        else:
            self.pending += data
            if len(self.pending) >= CHUNK:
                self._flush()
        return size

    def _flush(self) -> None:
        if self.pending:
            self.worker.put(bytes(self.pending))
            self.pending.clear()

    def tell(self) -> int:
        return self.size

    def close(self) -> None:
        self._flush()
        self.worker.close()

    def hexdigest(self) -> str:
        return self.sha.hexdigest()

    def __enter__(self) -> "HashingWriter":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:   # the error in hand is the one to report; stop the thread quietly
            try:
                self.worker.close()
            except BaseException:
                pass


class ForwardReader:
    """A read-only file over an iterator of byte chunks (the engine's save stream) that can seek
    forward: tarfile's "r:" mode needs ``tell`` and ``seek`` and, read front to back, only ever
    seeks forward. Bytes inside the window set by :meth:`hash_window` are hashed on a background
    thread whether they are read or skipped (the engine's diff id of a layer, taken as it passes);
    :meth:`digest` waits for that hash once the window has passed."""

    def __init__(self, chunks):
        self.chunks, self.buffer, self.pos = iter(chunks), b"", 0
        self.start_of_buffer = self.position = 0
        self.exhausted = False
        self.window: tuple[int, int | None, object] | None = None
        self.hasher: BackgroundWork | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def hash_window(self, start: int, size: int | None = None):
        """Hash the bytes at [start, start + size) as they pass (to the stream's end when ``size``
        is None); returns the hash object."""
        self.close()
        sha = hashlib.sha256()
        self.window = (start, None if size is None else start + size, sha)
        self.hasher = BackgroundWork(lambda view: sha.update(view))
        self._hash_buffer()
        return sha

    def digest(self) -> str:
        """``sha256:<hex>`` of the window, once every byte of it has been read or skipped."""
        start, end, sha = self.window
        passed = self.exhausted if end is None else self.start_of_buffer + len(self.buffer) >= end
        if not passed:
            raise ValueError(f"the hashed window ends at {end or 'the end'}, the stream has passed {self.position}")
        self.close()
        return "sha256:" + sha.hexdigest()

    def close(self) -> None:
        if self.hasher is not None:
            self.hasher.close()
            self.hasher = None

    def _hash_buffer(self) -> None:
        if self.window is None or self.hasher is None:
            return
        start, end, _ = self.window
        stop = self.start_of_buffer + len(self.buffer)
        lo, hi = max(start, self.start_of_buffer), stop if end is None else min(end, stop)
        if lo < hi:   # a zero-copy view: the chunk itself is never changed
            self.hasher.put(memoryview(self.buffer)[lo - self.start_of_buffer:hi - self.start_of_buffer])

    def _take(self, size: int) -> bytes:
        """Up to ``size`` bytes from the current chunk (a new one is fetched when it is used up)."""
        if self.pos >= len(self.buffer):
            self.start_of_buffer += len(self.buffer)
            self.buffer, self.pos = next(self.chunks, b""), 0
            if not self.buffer:
                self.exhausted = True
                return b""
            self._hash_buffer()
        data = self.buffer[self.pos:self.pos + size]
        self.pos += len(data)
        self.position += len(data)
        return data

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self._take(CHUNK), b""))
        first = self._take(size)
        if len(first) == size or not first:
            return first
        parts, missing = [first], size - len(first)
        while missing > 0:
            data = self._take(missing)
            if not data:
                break
            parts.append(data)
            missing -= len(data)
        return b"".join(parts)

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset + (self.position if whence == 1 else 0)
        if whence not in (0, 1) or target < self.position:
            raise io.UnsupportedOperation(f"the engine's save stream only seeks forward (at {self.position}, "
                                          f"asked for {offset} from {('start', 'here', 'end')[whence]})")
        while self.position < target:
            skip = min(target - self.position, len(self.buffer) - self.pos)
            if skip:   # within the chunk in hand: no copy
                self.pos += skip
                self.position += skip
            elif not self._take(target - self.position):
                break
        return self.position
