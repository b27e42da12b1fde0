"""Reading WebDataset samples from a tar shard: each sample's members by one read of their range.

``TarShard`` holds a shard's member index (``zephon.storage.tar_index``) and a way to read its bytes:

* a local tar (``open_local``): checked before any sample is used — the planned size (one ``stat``) and the
  member listing, rebuilt from the headers (about 512 bytes read per member) and compared with the plan's
  ``tarindex:`` fingerprint (a shard rewritten since planning is refused); samples by ``os.pread``;
* a tar on an object store (``open_object``, range mode): the index kept by the object's pin at planning
  (``zephon.storage.objects.tars``; rebuilt from header GETs on a machine without it), samples by range GETs
  carrying the pin (``If-Match``: a shard rewritten since planning is refused by the store, one line), the
  samples of one call fetched concurrently (``fetch_ranges``: 8 GETs at a time);
* a local copy from the shard cache (``open_copy``): the cache verified the bytes; the index is rebuilt from
  the copy's headers;
* a ``.tar.gz`` anywhere: decompressed whole when opened, samples sliced from memory;
* a remote tar read whole (``open_bytes``: the planner's computed cost pass, which reads every sample): indexed
  from memory, samples sliced from it.

A sample is ``{"__key__": key, ext: bytes, ...}``, nothing decoded (decode in ``map_transform``). Its members
are consecutive in the tar (the index requires it), so one read covers them all: from the first member's
payload to the last one's end (the headers between them come along, 512 bytes each). Example: members at
``[(512, 300), (1536, 20)]`` → one read of bytes ``[512, 1556)``, sliced into ``[0, 300)`` and ``[1024, 1044)``.

A read that comes back short (the file was truncated under the run) is a bad sample: one ``DatasetError``
naming the shard, key and member, or under ``on_bad_document="skip"`` the sample is None and counted
(``truncated_member``).
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Callable
from typing import Protocol

import numpy as np

from zephon.errors import DatasetError
from zephon.plan.records import ShardRef
from zephon.specs import StoreCredentials
from zephon.storage.tar_index import TarIndex, index_of, tar_index

#: The key of a sample's record (WebDataset's name for it).
KEY = "__key__"


def sample_key(record: object) -> str | None:
    """A WebDataset sample's key (``__key__``), for messages; None for other records."""
    key = record.get(KEY) if isinstance(record, dict) else None
    return key if isinstance(key, str) else None


class Reporter(Protocol):
    """The reader's bad-document policy (``zephon.executor.read.bad_documents.BadDocuments``)."""

    def report(self, ref: ShardRef, row: int, reason: str, message: str) -> None: ...


def _where(ref: ShardRef) -> str:
    return f"dataset {ref.dataset!r}: shard {ref.uri}"


class TarShard:
    """One open tar shard: its ``index`` and ``read(start, end)`` over its bytes (``end`` exclusive)."""

    __slots__ = ("_close", "_read", "index", "ref", "requests")

    def __init__(
        self,
        ref: ShardRef,
        index: TarIndex,
        read: Callable[[list[tuple[int, int]]], list[bytes]],
        close: Callable[[], None] = lambda: None,
    ) -> None:
        """``read(spans)``: the bytes of each ``[start, end)`` (an object store fetches them concurrently)."""
        self.ref, self.index, self._read, self._close = ref, index, read, close
        #: Reads of sample bytes made (one per sample).
        self.requests = 0
        if len(index) != ref.rows:
            close()
            raise DatasetError(
                f"{_where(ref)} changed since planning: it must hold {ref.rows} samples, got {len(index)} — restore "
                "the planned data or re-plan"
            )

    def read(self, rows: np.ndarray, bad: Reporter | None = None) -> list[dict[str, object] | None]:
        """The samples at ``rows``, in the order given (None: a bad sample the skip policy left out)."""
        ix = self.index
        out: list[dict[str, object] | None] = []
        picked = rows.tolist()
        width = ix.offsets.shape[1]
        los = ix.offsets[rows].min(axis=1) if width else np.zeros(len(picked), np.int64)
        his = (ix.offsets[rows] + ix.sizes[rows]).max(axis=1) if width else np.zeros(len(picked), np.int64)
        spans = [(int(lo), int(hi)) for lo, hi in zip(los, his, strict=True) if hi > lo]
        fetched = iter(self._read(spans) if spans else [])
        self.requests += len(spans)
        for row, lo, hi in zip(picked, los.tolist(), his.tolist(), strict=True):
            starts, sizes = ix.offsets[row], ix.sizes[row]
            data = next(fetched) if hi > lo else b""
            sample: dict[str, object] | None = {KEY: ix.keys[row]}
            for k, ext in enumerate(ix.extensions):
                start, size = int(starts[k]) - lo, int(sizes[k])
                if start + size > len(data):
                    message = (
                        f"{_where(self.ref)} key {ix.keys[row]!r} member {ext!r} must have {size} bytes, got "
                        f"{max(0, len(data) - start)} (a truncated tar) — restore the shard"
                    )
                    if bad is None:
                        raise DatasetError(message)
                    bad.report(self.ref, row, "truncated_member", message)
                    sample = None
                    break
                sample[ext] = bytes(data[start : start + size])
            out.append(sample)
        return out

    def close(self) -> None:
        self._close()
        self._close = lambda: None


def _in_memory(ref: ShardRef, raw: bytes) -> TarShard:
    try:
        data = gzip.decompress(raw) if ref.format == "tar.gz" else raw
    except (OSError, EOFError) as exc:
        raise DatasetError(f"{_where(ref)} must be a complete gzip stream, got {exc} — restore the shard") from exc
    index = index_of(io.BytesIO(data), len(data), _where(ref), read=len(raw), whole=True)
    return TarShard(ref, index, lambda spans: [data[s:e] for s, e in spans])


def _local(ref: ShardRef, path: str, size: int) -> TarShard:
    if ref.format == "tar.gz":
        with open(path, "rb") as f:
            return _in_memory(ref, f.read())
    index = tar_index(path, ref.format, size, _where(ref))
    fd = os.open(path, os.O_RDONLY)
    try:
        return TarShard(ref, index, lambda spans: [os.pread(fd, e - s, s) for s, e in spans], lambda: os.close(fd))
    except BaseException:
        os.close(fd)
        raise


def planned_size(ref: ShardRef, where: str) -> int:
    """The size of the local file ``ref`` names, refused in one line (``where`` names it) when it is gone or its
    size is not the planned ``ref.bytes``."""
    try:
        size = os.path.getsize(ref.uri)
    except OSError as exc:
        raise DatasetError(f"{where} must exist as planned, got {exc.strerror} — restore the file or re-plan") from exc
    if size != ref.bytes:
        raise DatasetError(
            f"{where} changed since planning: size must be {ref.bytes} bytes, got {size} — restore the planned "
            "data or re-plan"
        )
    return size


def open_local(ref: ShardRef) -> TarShard:
    """A local tar shard, checked against the plan (size, then the member listing's fingerprint)."""
    size = planned_size(ref, _where(ref))
    shard = _local(ref, ref.uri, size)
    if shard.index.fingerprint != ref.fingerprint:
        shard.close()
        raise DatasetError(
            f"{_where(ref)} changed since planning: its members must match fingerprint {ref.fingerprint} "
            f"({ref.rows} samples), got {shard.index.fingerprint} ({len(shard.index)} samples) — restore the planned "
            "data or re-plan"
        )
    return shard


def open_copy(ref: ShardRef, path: str, release: Callable[[], None]) -> TarShard:
    """A remote tar shard's local copy in the shard cache (verified against the pin when downloaded);
    ``release`` unpins it when the shard is closed."""
    try:
        shard = _local(ref, path, ref.bytes)
    except BaseException:
        release()
        raise
    inner = shard._close
    shard._close = lambda: (inner(), release())  # type: ignore[func-returns-value]
    return shard


def open_bytes(ref: ShardRef, raw: bytes) -> TarShard:
    """A remote tar shard's bytes, read whole (planning's computed cost pass: one GET per shard rather than one
    per sample), indexed from memory; a ``.tar.gz`` decompressed."""
    return _in_memory(ref, raw)


def open_object(ref: ShardRef, credentials: tuple[StoreCredentials, ...]) -> TarShard:
    """A tar shard on an object store, read by range GETs carrying its pin (a ``.tar.gz``: one whole GET)."""
    from zephon.storage.objects.range_file import fetch_ranges
    from zephon.storage.objects.reads import object_file, read_whole
    from zephon.storage.objects.tars import object_tar_index

    obj = object_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format)
    if ref.format == "tar.gz":
        return _in_memory(ref, read_whole(obj, credentials))
    index, _, _ = object_tar_index(obj, _where(ref), credentials)
    return TarShard(ref, index, lambda spans: fetch_ranges(obj, spans, credentials, kind="tar_members"))
