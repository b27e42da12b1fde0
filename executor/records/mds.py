"""Reading the samples of an MDS shard as records: ``{column: value}`` per sample, images left encoded.

``MdsRecords`` opens a local MDS shard the plan holds (``zephon.storage.mds_records``: format ``mds``), checks it
against the plan before any sample is used — the planned size (one ``stat``), then the fingerprint of its
``index.json`` entry and header (``read_offsets``, the header reader the token-store reader shares) — and reads
each asked-for sample with one positioned read of its bytes.

A sample is one uint32 size per column of no fixed size, in column order, then every column's bytes. Values:

| encoding | value |
|---|---|
| ``bytes`` | ``bytes`` |
| ``jpeg``, ``png`` | ``bytes``: the encoded image, as stored (decode in ``map_transform``, like WebDataset) |
| ``str`` | ``str`` (UTF-8) |
| ``json`` | the parsed JSON value |
| ``int`` (8 bytes), ``int8`` … ``uint64``, ``float16`` … ``float64`` | a Python ``int`` / ``float`` |
| ``str_int``, ``str_float`` | ``int`` / ``float`` parsed from the ASCII text |

A sample whose bytes do not decode (invalid UTF-8 or JSON, sizes that do not add up) is one ``DatasetError``
naming the shard, row and column, or under ``on_bad_document="skip"`` left out and counted (``bad_sample``).
Other encodings (``pkl``: unpickling runs code; ``pil``, ``ndarray``) are refused when the shard is opened,
naming the column. Example: columns ``caption: str``, ``image: jpeg``, ``label: int`` (sizes ``None, None, 8``):
a sample ``uint32 5 | uint32 631 | b"a cat" | 631 JPEG bytes | int64 3`` → ``{"caption": "a cat", "image":
b"\\xff\\xd8…", "label": 3}``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from zephon.errors import DatasetError
from zephon.executor.records.tar import Reporter, planned_size
from zephon.plan.records import ShardRef
from zephon.storage.mds_records import mds_entry, mds_fingerprint, read_offsets

_SCALARS = {
    "int": "<i8",
    "int8": "<i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "uint8": "<u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
}


def _scalar(dtype: np.dtype, value: bytes) -> Any:
    return np.frombuffer(value, dtype)[0].item()


_DECODERS: dict[str, Callable[[bytes], Any]] = {
    "bytes": bytes,
    "jpeg": bytes,
    "png": bytes,
    "str": lambda b: b.decode("utf-8"),
    "json": lambda b: json.loads(b.decode("utf-8")),
    "str_int": lambda b: int(b.decode("ascii")),
    "str_float": lambda b: float(b.decode("ascii")),
    **{name: partial(_scalar, np.dtype(dt)) for name, dt in _SCALARS.items()},
}
#: The MDS encodings a record pipeline reads.
RECORD_ENCODINGS = tuple(sorted(_DECODERS))


class MdsRecords:
    """One open MDS shard of records (see the module docstring)."""

    __slots__ = ("_decoders", "_fd", "_var", "names", "offsets", "ref", "sizes")

    def __init__(self, ref: ShardRef) -> None:
        self.ref = ref
        where = f"dataset {ref.dataset!r}: MDS shard {ref.uri}"
        size = planned_size(ref, where)
        entry = mds_entry(ref.uri, where)
        self._fd = os.open(ref.uri, os.O_RDONLY)
        try:
            self.offsets = read_offsets(self._pread, size, int(entry["samples"]), where)
            got = mds_fingerprint(size, entry, self._pread(0, 4 * (len(self.offsets) + 1)))
            if got != ref.fingerprint or len(self.offsets) - 1 != ref.rows:
                raise DatasetError(
                    f"{where} changed since planning: it must match fingerprint {ref.fingerprint} ({ref.rows} "
                    f"samples), got {got} ({len(self.offsets) - 1} samples) — restore the planned data or re-plan"
                )
            self.names = [str(n) for n in entry["column_names"]]
            self.sizes = [None if s is None else int(s) for s in entry["column_sizes"]]
            self._var = [j for j, s in enumerate(self.sizes) if s is None]
            self._decoders = [
                self._decoder(n, str(e), where) for n, e in zip(self.names, entry["column_encodings"], strict=True)
            ]
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _decoder(name: str, encoding: str, where: str) -> Callable[[bytes], Any]:
        decoder = _DECODERS.get(encoding)
        if decoder is None:
            raise DatasetError(
                f"{where} column {name!r} must have one of the encodings {', '.join(RECORD_ENCODINGS)}, got "
                f"{encoding!r} — write it as bytes, jpeg/png, str, json or a number"
                + (" (unpickling runs code: Zephon never does)" if encoding == "pkl" else "")
            )
        return decoder

    def _pread(self, start: int, end: int) -> bytes:
        return os.pread(self._fd, end - start, start)

    def read(self, rows: np.ndarray, bad: Reporter | None = None) -> list[dict[str, Any] | None]:
        """The records at ``rows``, in the order given; a sample that does not decode is one line, or with
        ``bad`` (the run's ``on_bad_document`` policy) reported and None (``bad_sample``). A Python loop per
        sample and column: records are few and large; the decode, not this loop, is a record run's cost."""
        out: list[dict[str, Any] | None] = []
        for row in rows.tolist():
            try:
                out.append(self._sample(row))
            except DatasetError as exc:
                if bad is None:
                    raise
                bad.report(self.ref, row, "bad_sample", str(exc))
                out.append(None)
        return out

    def _sample(self, row: int) -> dict[str, Any]:
        words = 4 * len(self._var)
        lo, hi = int(self.offsets[row]), int(self.offsets[row + 1])
        data = self._pread(lo, hi)
        where = f"dataset {self.ref.dataset!r}: MDS shard {self.ref.uri} row {row}"
        if len(data) != hi - lo or hi - lo < words:
            raise DatasetError(f"{where} must have {hi - lo} bytes, got {len(data)} — restore the shard")
        var = np.frombuffer(data[:words], "<u4").tolist()
        at, record = words, {}
        for j, (name, decode) in enumerate(zip(self.names, self._decoders, strict=True)):
            width = self.sizes[j] if self.sizes[j] is not None else var[self._var.index(j)]
            assert width is not None
            value = data[at : at + width]
            at += width
            try:
                record[name] = decode(value)
            except (ValueError, UnicodeDecodeError, IndexError) as exc:
                raise DatasetError(f"{where} column {name!r} must decode, got {exc} — restore the shard") from None
        if at != len(data):
            raise DatasetError(f"{where} must hold its columns' {at} bytes, got {len(data)} — restore the shard")
        return record

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None  # type: ignore[assignment]
