"""Row boundaries of JSONL data, shared by the shard scan (planner side) and the shard reader (executor).

A row is a line that is not empty: ``b"\\n"`` ends a line, a trailing ``b"\\r"`` belongs to the line ending,
and a last line without a newline still counts. Empty lines are not rows (many writers end files with one);
a line of only spaces is a row, and fails JSON decoding when read, with its row number.

Worked example: ``b'{"a":1}\\n\\n{"a":2}\\r\\n{"a":3}'`` has rows at byte spans (0, 7), (9, 16), (18, 25).

JSONL is UTF-8 (a UTF-8 byte order mark is skipped by the reader). A file saved as UTF-16 or UTF-32 (what Windows
tools call "Unicode") splits on its ``0A`` bytes into lines full of NULs, every one of them invalid JSON — a
whole file of bad documents, which the skip policy would count away. ``decompress`` refuses such a file instead,
as it refuses a truncated stream: by its byte order mark, or, without one, by a NUL byte beside the first
character (no UTF-8 JSON text starts with a NUL). Example: ``b"\\xff\\xfe{\\x00"`` → ValueError "UTF-16 text (byte
order mark FF FE), not UTF-8: convert it with iconv -f UTF-16 -t UTF-8". So is one JSON array in place of JSON
lines (a ``.json`` dump of a list): ``b'[\n  {"text": "a"}\n]'`` → ValueError "one JSON array, not JSON lines".
"""

from __future__ import annotations

import gzip
import re
import zlib

import numpy as np

_VISIBLE = re.compile(rb"\S")
#: Byte order marks of the wide Unicode encodings, UTF-32 LE's before the UTF-16 LE one it begins with.
_WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


def decompress(data: bytes, fmt: str) -> bytes:
    """Decompress a whole JSONL shard given its format (``jsonl``, ``jsonl.gz`` or ``jsonl.zst``).

    Every stream must be complete: a truncated or corrupt gzip or zstd stream raises ``ValueError`` with a
    one-line description (the callers add the dataset, the shard and the fix), never a partial result.
    Concatenated gzip members and zstd frames are all read. Text that is UTF-16 or UTF-32 raises too (module
    docstring).
    """
    if fmt == "jsonl":
        text = data
    elif fmt == "jsonl.gz":
        try:
            text = gzip.decompress(data)
        except EOFError as exc:
            raise ValueError("a truncated gzip stream (it ends before the end-of-stream marker)") from exc
        except (OSError, zlib.error) as exc:
            raise ValueError(f"a corrupt gzip stream ({exc})") from exc
    elif fmt == "jsonl.zst":
        text = _zstd_frames(data)
    else:
        raise ValueError(f"JSONL format must be jsonl, jsonl.gz or jsonl.zst, got {fmt!r}")
    return _utf8(text)


def _utf8(data: bytes) -> bytes:
    """``data``, unless it is UTF-16 or UTF-32 text (``ValueError``, module docstring)."""
    for bom, name in _WIDE_BOMS:
        if data.startswith(bom):
            raise ValueError(
                f"{name} text (byte order mark {bom.hex(' ').upper()}), not UTF-8: convert it with iconv -f {name} "
                "-t UTF-8"
            )
    if len(data) >= 2 and (data[0] == 0) != (data[1] == 0):
        order = "BE" if data[0] == 0 else "LE"
        raise ValueError(
            f"UTF-16 text without a byte order mark (a NUL byte beside the first character), not UTF-8: convert it "
            f"with iconv -f UTF-16{order} -t UTF-8"
        )
    _not_an_array(data)
    return data


def _not_an_array(data: bytes) -> None:
    """Refuse one JSON array (``[{...}, {...}]``, what ``json.dump`` of a list writes: Alpaca's data, for one) in
    place of JSON lines — pretty-printed (its first line ``[``) or on one line — a whole file whose every line the
    skip policy would count away, or one bad row."""
    found = _VISIBLE.search(data, 0, 1 << 16)  # (no copy of the data: a shard may be large)
    if found is None or data[found.start() : found.start() + 1] != b"[":
        return
    end = data.find(b"\n", found.start())
    one_line = end < 0 or _VISIBLE.search(data, end) is None
    if one_line or data[found.start() : end].strip() == b"[":
        raise ValueError(
            "one JSON array, not JSON lines (one object per line): convert it with jq -c '.[]' FILE > FILE.jsonl"
        )


def _zstd_frames(data: bytes) -> bytes:
    """All zstd frames of ``data``; ``stream_reader`` would return a truncated frame's partial output silently."""
    import zstandard

    out: list[bytes] = []
    rest = data
    while rest:
        frame = zstandard.ZstdDecompressor().decompressobj()
        try:
            out.append(frame.decompress(rest))
        except zstandard.ZstdError as exc:
            raise ValueError(f"a corrupt zstd stream ({exc})") from exc
        if not frame.eof:
            raise ValueError("a truncated zstd stream (its last frame is incomplete)")
        rest = frame.unused_data
    return b"".join(out)


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
