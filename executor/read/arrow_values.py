"""Arrow values as Python values, a value whose bytes are not UTF-8 found instead of raised.

Why: pyarrow reads a Parquet string column without checking its UTF-8, so a column some writer filled with other
bytes (Latin-1 text, binary) reads back without complaint and fails only when converted: ``to_pylist`` raises a
``UnicodeDecodeError`` for the whole read. The shard reader let that out as a traceback, even under
``on_bad_document="skip"`` — where JSONL already reported the row (``zephon.executor.read.jsonl``).

Algorithm: ``python_values`` converts the whole array at once (``to_pylist``, the common case, at its speed); only
when that raises ``UnicodeDecodeError`` are the values converted one by one, each value whose bytes are not UTF-8
becoming a ``NotUTF8`` (its first bad byte and where it lies in the value). The shard reader reports those rows as
bad documents, reason ``not_utf8`` (``zephon.executor.read.bad_documents``): one line naming the dataset, shard,
row and field, or skipped and counted. (``to_numpy(zero_copy_only=False)`` converts strings no faster here: 70 CPU
ns a short document either way, measured on fresh ``take`` results.)

Invariant: for an array ``to_pylist`` converts, its list of values; otherwise the values it would give one by one,
a ``NotUTF8`` in place of each that cannot be one (a record holding such a string is one ``NotUTF8``).

Example: ``["ab", None, b"o\\xffk" read as a string]`` → ``(["ab", None, NotUTF8(byte=0xFF, offset=1)], True)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["NotUTF8", "python_values"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NotUTF8:
    """A value whose bytes are not UTF-8: the first bad byte and its offset in the value's bytes."""

    byte: int
    offset: int


def python_values(array: pa.Array | pa.ChunkedArray) -> tuple[list[Any], bool]:
    """The values of ``array`` as Python objects, and whether any is a ``NotUTF8`` (module docstring)."""
    try:
        return array.to_pylist(), False
    except UnicodeDecodeError:
        pass
    values: list[Any] = []
    found = False
    for i in range(len(array)):
        try:
            values.append(array[i].as_py())
        except UnicodeDecodeError as exc:
            values.append(NotUTF8(byte=exc.object[exc.start], offset=exc.start))
            found = True
    return values, found
