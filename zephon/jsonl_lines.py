"""Row boundaries of JSONL data, shared by the shard scan (planner side) and the shard reader (executor).

A row is a line that is not empty: ``b"\\n"`` ends a line, a trailing ``b"\\r"`` belongs to the line ending,
and a last line without a newline still counts. Empty lines are not rows (many writers end files with one);
a line of only spaces is a row, and fails JSON decoding when read, with its row number.

Worked example: ``b'{"a":1}\\n\\n{"a":2}\\r\\n{"a":3}'`` has rows at byte spans (0, 7), (9, 16), (18, 25).
"""

from __future__ import annotations

import gzip

import numpy as np


def decompress(data: bytes, fmt: str) -> bytes:
    """Decompress a whole JSONL shard given its format (``jsonl``, ``jsonl.gz`` or ``jsonl.zst``)."""
    if fmt == "jsonl":
        return data
    if fmt == "jsonl.gz":
        return gzip.decompress(data)
    if fmt == "jsonl.zst":
        import zstandard

        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            return reader.read()
    raise ValueError(f"JSONL format must be jsonl, jsonl.gz or jsonl.zst, got {fmt!r}")


def line_spans(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(starts, ends)`` byte offsets (int64) of the rows of ``data``, ends exclusive."""
    buf = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(buf == 0x0A)
    starts = np.concatenate(([0], newlines + 1)).astype(np.int64)
    ends = np.concatenate((newlines, [len(buf)])).astype(np.int64)
    # A "\r" just before the newline belongs to the line ending.
    has_cr = (ends > starts) & (buf[np.maximum(ends - 1, 0)] == 0x0D) if len(buf) else ends > starts
    ends = ends - has_cr.astype(np.int64)
    keep = ends > starts
    return starts[keep], ends[keep]
