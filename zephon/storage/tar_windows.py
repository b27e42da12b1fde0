"""Tar headers read by range windows: a WebDataset shard's member index from a store that reads byte ranges.

``ranged_tar_index(read, size, ...)`` builds the same ``TarIndex`` as ``zephon.storage.tar_index.tar_index``
(same keys, ranges and ``tarindex:`` listing digest) from any ``read(start, end) -> bytes`` — an object store's
range GET, the Hub's range request — without reading the payloads it can skip.

The walk: ``tarfile`` reads a 512-byte header, then seeks past the member's payload to the next header.
``WindowedRanges`` serves those reads from one buffer, the last range fetched. A read outside the buffer is
one new request, starting at the read, of

* ``window`` bytes (64 KiB) when the walk skipped less than ``window`` since its last read — payloads are
  small, so one request covers the headers of many members (and the small payloads between them);
* ``probe`` bytes (4 KiB) when it skipped ``window`` or more — a large payload (an image) was jumped over, so
  the next header is fetched with the small members that usually follow it (caption, JSON), and the next
  large payload is not read.

Invariant: every byte the index needs (headers, GNU/PAX name blocks, the end-of-archive blocks) is read, each
request is one contiguous range of at most ``max(window, the read asked for)`` bytes, and the result equals the
local index of the same bytes. ``requests`` and ``bytes_read`` say what it cost.

Worked example: 100 samples of ``jpg`` (100 KB) + ``txt`` (40 B) + ``json`` (30 B). Request 1 reads 64 KiB at
0: the first header; tarfile seeks past the jpg (100 KB skipped, ≥ 64 KiB): request 2 reads 4 KiB at 100,864 —
the txt and json members and the second jpg's header (5 blocks); the next seek skips 100 KB again: request 3
reads 4 KiB. So one request and 4 KiB per sample: 100 requests, ~0.4 MB read of a 10 MB shard. With 200-byte
payloads instead, a 64 KiB window holds ~40 samples' members: 100 samples cost 3 requests.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable
from dataclasses import replace

from zephon.errors import DatasetError
from zephon.storage.tar_index import TarIndex, index_of

#: Bytes fetched after a read outside the buffer when payloads are small.
WINDOW = 64 << 10
#: Bytes fetched after a large payload was skipped: a header and the small members after it.
PROBE = 4 << 10


class WindowedRanges(io.RawIOBase):
    """A read-only, seekable file over ``read(start, end)``; reads are served from the last range fetched."""

    def __init__(self, read: Callable[[int, int], bytes], size: int, *, window: int = WINDOW, probe: int = PROBE):
        self._read, self.size, self.window, self.probe = read, size, window, probe
        self._pos = 0
        self._last = 0  # where the last read ended
        self._buf = b""
        self._at = 0  # the buffer holds bytes [_at, _at + len(_buf))
        self.requests = 0
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else self._pos + offset if whence == 1 else self.size + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        pos = self._pos
        n = min(len(buffer), self.size - pos)
        if n <= 0:
            return 0
        if not (self._at <= pos and pos + n <= self._at + len(self._buf)):
            span = self.probe if self._buf and pos - self._last >= self.window else self.window
            stop = min(self.size, pos + max(n, span))
            self._buf, self._at = self._read(pos, stop), pos
            self.requests += 1
            self.bytes_read += stop - pos
        i = pos - self._at
        buffer[:n] = self._buf[i : i + n]
        self._pos = self._last = pos + n
        return n


def ranged_tar_index(
    read: Callable[[int, int], bytes],
    size: int,
    fmt: str,
    where: str,
    *,
    window: int = WINDOW,
    probe: int = PROBE,
) -> tuple[TarIndex, int]:
    """``(index, requests)`` of the tar of ``size`` bytes behind ``read``: a plain tar by windows of headers
    (module docstring), a ``.tar.gz`` by one read of the whole object (gzip cannot be sought)."""
    if fmt == "tar.gz":
        raw = read(0, size) if size else b""
        try:
            data = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DatasetError(f"{where} must be a complete gzip stream, got {exc} — restore the shard") from exc
        return index_of(io.BytesIO(data), len(data), where, read=size, whole=True), 1
    ranges = WindowedRanges(read, size, window=window, probe=probe)
    index = index_of(ranges, size, where)
    return replace(index, bytes_read=ranges.bytes_read), ranges.requests
