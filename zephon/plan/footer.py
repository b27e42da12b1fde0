"""A Parquet file's footer, read on its own: the bytes Zephon fingerprints shards and plan files by.

A Parquet file ends with its footer (the Thrift ``FileMetaData``: schema, row groups, every column chunk's
offsets, sizes and statistics), the footer's length (4 bytes, little-endian) and the magic bytes ``PAR1``.
``read_footer(path)`` reads only the last 8 bytes and the footer, never a data page; its ``fingerprint`` is
``pqfooter:`` and the BLAKE2b-128 digest of the file size (8 bytes, little-endian) followed by the footer
bytes. A rewritten file has another footer (offsets, sizes, statistics, writer), so another fingerprint.
Invariant: the fingerprint depends only on the file's size and footer bytes, the same for the planner's
scan of a shard, the executor's check of it, and the plan bundle's own files (``zephon.plan.integrity``).

Not caught: bytes changed inside a data page with the footer and size unchanged (bit rot); such a page is
refused only when it no longer decodes.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["ParquetFooter", "parquet_fingerprint", "read_footer"]

_MAGIC = b"PAR1"


@dataclass(frozen=True, kw_only=True, slots=True)
class ParquetFooter:
    """The size of a Parquet file, its footer bytes (with the 8-byte tail) and their fingerprint."""

    size: int
    #: The footer, its length and ``PAR1``: the file's last ``len(tail)`` bytes.
    tail: bytes
    fingerprint: str

    def metadata(self) -> pq.FileMetaData:
        """The footer parsed by pyarrow (raises ``OSError`` or ``ValueError`` when it does not parse)."""
        return pq.read_metadata(pa.BufferReader(self.tail))


def read_footer(path: str | os.PathLike[str]) -> ParquetFooter:
    """The footer of the Parquet file at ``path``, reading its last 8 bytes and the footer only.

    Raises ``ValueError`` (not Parquet, truncated) or ``OSError`` (unreadable).
    """
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size < 12:
            raise ValueError(f"a file of {size} bytes, shorter than a Parquet header and footer (empty or truncated)")
        fh.seek(size - 8)
        end = fh.read(8)
        if end[4:] != _MAGIC:
            raise ValueError("a file that does not end with the Parquet magic bytes PAR1 (truncated or not Parquet)")
        (footer_len,) = struct.unpack("<I", end[:4])
        if footer_len + 12 > size:
            raise ValueError(f"a footer of {footer_len} bytes in a file of {size} bytes (damaged or not Parquet)")
        fh.seek(size - 8 - footer_len)
        footer = fh.read(footer_len)
    digest = hashlib.blake2b(struct.pack("<Q", size) + footer, digest_size=16).hexdigest()
    return ParquetFooter(size=size, tail=footer + end, fingerprint=f"pqfooter:{digest}")


def parquet_fingerprint(path: str | os.PathLike[str]) -> tuple[int, str]:
    """``(size, "pqfooter:<digest>")`` of a Parquet file, reading only its last 8 bytes and its footer.

    Raises ``ValueError`` (not Parquet, truncated) or ``OSError`` (unreadable).
    """
    footer = read_footer(path)
    return footer.size, footer.fingerprint
