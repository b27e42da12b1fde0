"""Where a record pipeline's records come from: whole rows of Parquet and JSONL shards (every column), read by
the executor's ``ShardReader`` in record mode (local, through the shard cache, or by ranges), WebDataset
samples of tar shards (``zephon.executor.records.tar``: local, object stores by range GETs or any remote shard
through the shard cache), MDS samples (``zephon.executor.records.mds``: local, object stores by range GETs,
any remote shard through the shard cache), and the plan positions they stand at (``PlanPositions``).

A Parquet row becomes a dict of its columns: a Hugging Face ``datasets`` image column (struct ``{bytes, path}``)
arrives as ``{"bytes": b"...", "path": "..."}``, a binary column as ``bytes``, a list column as a list. A JSONL
line becomes its object. Nothing is decoded beyond Arrow → Python: image decoding belongs to ``map_transform``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from zephon.executor.operators import Where
from zephon.executor.plan_reader import PlanBundle, SampleChunk
from zephon.executor.read.shard_reader import ShardReader
from zephon.executor.records import mds
from zephon.executor.records.mds import MdsRecords
from zephon.executor.records.tar import TarShard, open_copy, open_local, open_object
from zephon.plan.records import ShardRef
from zephon.storage.objects.paths import is_object_uri
from zephon.storage.remote import is_remote_uri
from zephon.storage.tar_index import TAR_FORMATS


class WholeRecords:
    """The ``RecordConverter`` of a record pipeline: every column, none required, records handed over as read
    (the pipeline's operators run later, with the records' plan positions: ``zephon.executor.records.transforms``)."""

    columns: tuple[str, ...] | None = None
    required: tuple[str, ...] = ()

    def convert_all(self, where: list[Where], records: list[Any], documents: Any) -> list[Any]:
        return records


class RecordReader:
    """Records of (shard, row) pairs: Parquet and JSONL rows through the run's ``ShardReader`` (record mode),
    WebDataset samples through ``TarShard`` (``zephon.executor.records.tar``) and MDS samples through
    ``MdsRecords`` (``zephon.executor.records.mds``), up to ``capacity`` of those shards open (least recently
    used closed first)."""

    def __init__(self, reader: ShardReader, shards: list[ShardRef], capacity: int) -> None:
        self.reader = reader
        self._tar = {s.shard_id for s in shards if s.format in TAR_FORMATS or s.format == "mds"}
        self._open: OrderedDict[int, TarShard | MdsRecords] = OrderedDict()
        self._capacity = max(1, capacity)

    def ref(self, shard_id: int) -> ShardRef:
        return self.reader.ref(shard_id)

    def records(self, shard_ids: np.ndarray, rows: np.ndarray) -> list[Any]:
        """The records in the order given (None: a bad record the skip policy left out)."""
        if not len(shard_ids):
            return []
        tar = np.isin(shard_ids, list(self._tar)) if self._tar else np.zeros(len(shard_ids), bool)
        out: list[Any] = [None] * len(shard_ids)
        rest = np.flatnonzero(~tar)
        if len(rest):
            for i, v in zip(rest.tolist(), self.reader.texts(shard_ids[rest], rows[rest]), strict=True):
                out[i] = v
        for sid in dict.fromkeys(shard_ids[tar].tolist()):
            idx = np.flatnonzero(shard_ids == sid)
            shard = self._tar_shard(sid)
            got = shard.read(rows[idx], self.reader.bad_documents)
            for i, v in zip(idx.tolist(), got, strict=True):
                out[i] = v
        return out

    def _tar_shard(self, shard_id: int) -> TarShard | MdsRecords:
        shard = self._open.get(shard_id)
        if shard is not None:
            self._open.move_to_end(shard_id)
            return shard
        ref = self.reader.ref(shard_id)
        while len(self._open) >= self._capacity:
            self._open.popitem(last=False)[1].close()
        shard: TarShard | MdsRecords
        if ref.format == "mds":
            shard = self._mds(ref)
        elif is_object_uri(ref.uri) and self.reader.ranged:
            shard = open_object(ref, self.reader.credentials)
        elif is_remote_uri(ref.uri):
            handle = self.reader.acquire(ref)
            shard = open_copy(ref, str(handle.path), handle.close)
        else:
            shard = open_local(ref)
        self._open[shard_id] = shard
        return shard

    def _mds(self, ref: ShardRef) -> MdsRecords:
        if is_object_uri(ref.uri) and self.reader.ranged:
            return mds.open_object(ref, self.reader.credentials)
        if is_remote_uri(ref.uri):
            handle = self.reader.acquire(ref)
            return mds.open_copy(ref, str(handle.path), handle.close)
        return mds.open_local(ref)

    def close(self) -> None:
        while self._open:
            self._open.popitem(last=False)[1].close()


class PlanPositions:
    """Dataset, shard and row of plan positions, read forward from ``start`` (a run asks in increasing order).

    State: the plan's chunks from ``start`` on, and the part of them still ahead (``_lo`` and its arrays)."""

    def __init__(self, plan: PlanBundle, start: int, chunk: int) -> None:
        self._chunks: Iterator[SampleChunk] = plan.chunks(max(1, chunk), start)
        self._lo = start
        self._dataset = np.zeros(0, np.int64)
        self._shard = np.zeros(0, np.int64)
        self._row = np.zeros(0, np.int64)

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(dataset_id, shard_id, row)`` of ``positions`` (sorted, none before an earlier call's smallest)."""
        if not len(positions):
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        need = int(positions.max()) + 1
        while self._lo + len(self._row) < need:
            chunk = next(self._chunks)
            self._dataset = np.concatenate((self._dataset, chunk.dataset_id.astype(np.int64)))
            self._shard = np.concatenate((self._shard, chunk.shard_id.astype(np.int64)))
            self._row = np.concatenate((self._row, chunk.row.astype(np.int64)))
        drop = int(positions.min()) - self._lo  # nothing before the smallest is asked for again
        if drop > 0:
            self._dataset, self._shard, self._row = self._dataset[drop:], self._shard[drop:], self._row[drop:]
            self._lo += drop
        at = positions - self._lo
        return self._dataset[at], self._shard[at], self._row[at]
