"""``SeekableSpans``: a read-only, seekable raw file whose bytes come from spans read on demand.

Files read by ranges (an object read by range requests, blocks fetched ahead with a GET for what they miss)
all need the same ``io.RawIOBase`` bookkeeping — a position, ``seek`` from the start, the position or the
end, and ``readinto`` that never reads past the end — and differ only in where the bytes of ``[start, end)``
come from. Subclasses give ``size()`` and ``span(start, end)``; ``span`` is asked only for ``start < end <=
size()``. Example: a 10-byte file at position 8, ``read(5)`` asks ``span(8, 10)`` and returns 2 bytes.
"""

from __future__ import annotations

import io


class SeekableSpans(io.RawIOBase):
    """A read-only, seekable binary file over ``size()`` bytes, read as ``span(start, end)`` (see the module)."""

    _pos: int = 0

    def size(self) -> int:
        raise NotImplementedError

    def span(self, start: int, end: int) -> bytes:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size()}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.size() - self._pos)
        if n <= 0:
            return 0
        memoryview(buffer)[:n] = self.span(self._pos, self._pos + n)
        self._pos += n
        return n
