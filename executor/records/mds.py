"""Reading the samples of an MDS shard as records: ``{column: value}`` per sample, images left encoded.

``MdsRecords`` holds an open shard's sample offsets, its columns and a way to read its bytes:

* a local shard (``open_local``): checked against the plan before any sample is used — the planned size (one
  ``stat``), then the fingerprint of its ``index.json`` entry and header (``read_offsets``, the header reader the
  token-store reader shares) — and each sample read by one positioned read;
* a shard on an object store (``open_object``, range mode): its header and the column JSON the writer put after
  it by one range GET carrying the pin (no ``index.json``: a pinned object's bytes are the planned ones), then
  one range GET per sample, a call's samples fetched concurrently; a shard rewritten since planning is refused
  by the store (HTTP 412, one line);
* a shard-cache copy of a remote shard (``open_copy``): the cache verified the bytes; opened from its own header;
* a compressed shard (``.mds.zstd``, ``.mds.gz``, ``.mds.bz2``; ``zephon.storage.mds_compression``) anywhere:
  read whole and decompressed when opened, samples sliced from memory.

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

from zephon.errors import DatasetError, ZephonError
from zephon.executor.records.tar import Reporter, planned_size
from zephon.plan.records import ShardRef
from zephon.specs import StoreCredentials
from zephon.storage.mds_compression import compression_of, decompress, shard_file
from zephon.storage.mds_records import check_shard, embedded_entry, mds_entry, mds_fingerprint, read_offsets

#: Bytes read after a pinned shard's header when it is opened: its column JSON (a few hundred bytes) comes along.
HEAD_PROBE = 2048

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
    """One open MDS shard of records (see the module docstring): its sample ``offsets``, its columns (from
    ``entry``) and ``read(spans)``, the bytes of each ``[start, end)`` of the (decompressed) shard."""

    __slots__ = ("_close", "_decoders", "_read", "_var", "names", "offsets", "ref", "requests", "sizes")

    def __init__(
        self,
        ref: ShardRef,
        offsets: np.ndarray,
        entry: dict,
        read: Callable[[list[tuple[int, int]]], list[bytes]],
        close: Callable[[], None] = lambda: None,
    ) -> None:
        self.ref, self.offsets, self._read, self._close = ref, offsets, read, close
        #: Reads of sample bytes made (one per sample).
        self.requests = 0
        where = f"dataset {ref.dataset!r}: MDS shard {ref.uri}"
        try:
            if len(offsets) - 1 != ref.rows:
                raise DatasetError(
                    f"{where} changed since planning: it must hold {ref.rows} samples, got {len(offsets) - 1} — "
                    "restore the planned data or re-plan"
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

    def read(self, rows: np.ndarray, bad: Reporter | None = None) -> list[dict[str, Any] | None]:
        """The records at ``rows``, in the order given; a sample that does not decode is one line, or with
        ``bad`` (the run's ``on_bad_document`` policy) reported and None (``bad_sample``). The samples' bytes are
        read in one call (an object store fetches them concurrently); then a Python loop per sample and column:
        records are few and large; the decode, not this loop, is a record run's cost."""
        picked = rows.tolist()
        spans = [(int(self.offsets[r]), int(self.offsets[r + 1])) for r in picked]
        fetched = self._read(spans) if spans else []
        self.requests += len(spans)
        out: list[dict[str, Any] | None] = []
        for row, span, data in zip(picked, spans, fetched, strict=True):
            try:
                out.append(self._sample(row, span, data))
            except DatasetError as exc:
                if bad is None:
                    raise
                bad.report(self.ref, row, "bad_sample", str(exc))
                out.append(None)
        return out

    def _sample(self, row: int, span: tuple[int, int], data: bytes) -> dict[str, Any]:
        words = 4 * len(self._var)
        lo, hi = span
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
        self._close()
        self._close = lambda: None


def _where(ref: ShardRef) -> str:
    return f"dataset {ref.dataset!r}: MDS shard {ref.uri}"


def _slices(data: bytes) -> Callable[[list[tuple[int, int]]], list[bytes]]:
    return lambda spans: [data[s:e] for s, e in spans]


def open_local(ref: ShardRef) -> MdsRecords:
    """A local MDS shard, checked against the plan: its size, then the fingerprint of its ``index.json`` entry and
    header; a compressed one read whole and decompressed."""
    where = _where(ref)
    size = planned_size(ref, where)
    entry = mds_entry(ref.uri, where)
    fd = os.open(ref.uri, os.O_RDONLY)
    try:
        offsets, header, read = check_shard(entry, lambda s, e: os.pread(fd, e - s, s), size, where)
        got = mds_fingerprint(size, entry, header)
        if got != ref.fingerprint or len(offsets) - 1 != ref.rows:
            raise DatasetError(
                f"{where} changed since planning: it must match fingerprint {ref.fingerprint} ({ref.rows} "
                f"samples), got {got} ({len(offsets) - 1} samples) — restore the planned data or re-plan"
            )
        if shard_file(entry)[2] is not None:  # decompressed in memory: the file is not needed any more
            os.close(fd)
            return MdsRecords(ref, offsets, entry, lambda spans: [read(s, e) for s, e in spans])
    except BaseException:
        os.close(fd)
        raise
    return MdsRecords(
        ref, offsets, entry, lambda spans: [os.pread(fd, e - s, s) for s, e in spans], lambda: os.close(fd)
    )


def _pinned(ref: ShardRef, read: Callable[[int, int], bytes], size: int) -> MdsRecords:
    """A shard whose bytes are the planned ones (a pinned object, a verified copy): its header and its own
    column JSON, no ``index.json``; a compressed one (``.mds.zstd``, …) read whole and decompressed."""
    where = _where(ref)
    compressed = compression_of(ref.uri.rpartition("/")[2])
    if compressed is not None:
        data = decompress(read(0, size) if size else b"", compressed, None, where)
        offsets = read_offsets(lambda s, e: data[s:e], len(data), ref.rows, where)
        return MdsRecords(ref, offsets, embedded_entry(lambda s, e: data[s:e], offsets, where), _slices(data))
    head = read(0, min(size, 4 * (ref.rows + 2) + HEAD_PROBE))  # the header and, most often, the column JSON

    def first(start: int, end: int) -> bytes:
        return head[start:end] if end <= len(head) else read(start, end)

    offsets = read_offsets(first, size, ref.rows, where)
    return MdsRecords(ref, offsets, embedded_entry(first, offsets, where), lambda spans: [read(s, e) for s, e in spans])


def open_bytes(ref: ShardRef, raw: bytes) -> MdsRecords:
    """A remote MDS shard's bytes, read whole (planning's computed cost pass: one GET per shard rather than one
    per sample); a compressed one decompressed."""
    return _pinned(ref, lambda s, e: raw[s:e], len(raw))


def open_copy(ref: ShardRef, path: str, release: Callable[[], None]) -> MdsRecords:
    """A remote MDS shard's local copy in the shard cache (verified against the pin when downloaded); ``release``
    unpins it when the shard is closed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except BaseException:
        release()
        raise
    closed = lambda: (os.close(fd), release())  # noqa: E731
    try:
        shard = _pinned(ref, lambda s, e: os.pread(fd, e - s, s), ref.bytes)
    except BaseException:
        closed()
        raise
    if compression_of(ref.uri.rpartition("/")[2]) is not None:
        closed()
    else:
        shard._close = closed
    return shard


def open_object(ref: ShardRef, credentials: tuple[StoreCredentials, ...]) -> MdsRecords:
    """An MDS shard on an object store, read by range GETs carrying its pin: one for the header and the column
    JSON (``REQUESTS["mds_header"]``), then one per sample, a call's samples fetched concurrently
    (``REQUESTS["mds_samples"]``). A compressed shard is one GET of the whole object, decompressed in memory."""
    from zephon.storage.objects.range_file import fetch_ranges
    from zephon.storage.objects.reads import object_file, read_range

    obj = object_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format)
    whole = compression_of(ref.uri.rpartition("/")[2]) is not None
    kind = "whole" if whole else "mds_header"
    shard = _pinned(ref, _named(ref, lambda s, e: read_range(obj, s, e, credentials, kind=kind)), ref.bytes)
    if not whole:
        shard._read = _named(ref, lambda spans: fetch_ranges(obj, spans, credentials, kind="mds_samples"))
    return shard


def _named(ref: ShardRef, read: Callable[..., Any]) -> Callable[..., Any]:
    """``read`` whose one-line errors (a 412 for a rewritten object, a 404 for a removed one) name the dataset."""
    prefix = f"dataset {ref.dataset!r}: "

    def named(*args: Any) -> Any:
        try:
            return read(*args)
        except ZephonError as exc:
            if str(exc).startswith(prefix):
                raise
            raise type(exc)(prefix + str(exc)) from None

    return named
