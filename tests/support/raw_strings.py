"""A string array holding exactly the bytes given: pyarrow checks none of them, nor does its Parquet writer or
reader, so a file written from it is what a writer that did not check UTF-8 leaves (tests of ``not_utf8``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def raw_strings(values: list[bytes | None], kind: pa.DataType | None = None) -> pa.Array:
    """``values`` as a ``string`` (or ``kind``: ``large_string``) array, None a null, the bytes as they are."""
    kind = pa.string() if kind is None else kind
    width = np.int64 if kind == pa.large_string() else np.int32
    offsets = np.cumsum([0] + [len(v or b"") for v in values]).astype(width)
    validity = pa.array([v is not None for v in values]).buffers()[1]
    data = pa.py_buffer(b"".join(v or b"" for v in values))
    return pa.Array.from_buffers(kind, len(values), [validity, pa.py_buffer(offsets.tobytes()), data])
