"""Fetching the text of planned documents from their shards.

Parquet shards are read one row group at a time with only the text column; JSONL shards are read and
decompressed whole (gzip and zstd streams cannot be sought). Decoded shards stay in a small LRU sized by
the plan's shuffle window (rows are shuffled within windows of ``window_shards`` shards per dataset), so
each shard is read about once per epoch. Before first use, a shard's size is compared with the plan: a
shard that changed since planning is refused, never read.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import ConfigError, DatasetError
from zephon.executor.plan_reader import ShardRef
from zephon.jsonl_lines import decompress, line_spans
from zephon.remote import is_remote_uri, remote_file
from zephon.shard_cache import CacheEntrySpec, ShardCache


def remote_spec(ref: ShardRef) -> CacheEntrySpec:
    """The shard cache entry of a remote shard: downloaded whole, verified against size and etag."""
    from zephon.hub import download_remote_file

    file = remote_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format)
    return CacheEntrySpec(
        key=f"hf/{file.repo_id}/{file.revision}/{file.path_in_repo}",
        size=ref.bytes,
        etag=file.etag,
        fetch=lambda dest: download_remote_file(file, dest, in_place=True),
    )


@dataclass(slots=True)
class _OpenShard:
    ref: ShardRef
    parquet: pq.ParquetFile | None = None
    rg_starts: np.ndarray | None = None
    row_groups: dict[int, pa.Array] = field(default_factory=dict)
    jsonl: bytes | None = None
    spans: tuple[np.ndarray, np.ndarray] | None = None
    handle: object | None = None  # a pinned zephon.shard_cache.CachedShard for remote shards

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()  # type: ignore[attr-defined]
            self.handle = None


def planning_cache() -> ShardCache:
    """The shard cache the planner downloads remote shards into when it must read them (calibration, the
    count pass): ``$ZEPHON_CACHE_DIR/shards``, unbounded."""
    from zephon.shard_scan import cache_dir

    return ShardCache(cache_dir() / "shards", None)


class ShardReader:
    """Return the ``field`` values of (shard, row) pairs, caching up to ``capacity`` open shards."""

    def __init__(
        self, shards: list[ShardRef], field_name: str, capacity: int, *, cache: ShardCache | None = None
    ) -> None:
        self._shards = {s.shard_id: s for s in shards}
        self._field = field_name
        self._capacity = max(1, capacity)
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()
        self._cache = cache
        #: Set by the executor: shard id → the plan position of its next use (None: never again).
        self.next_use: dict[int, int | None] | None = None

    def attach_cache(self, cache: ShardCache) -> None:
        self._cache = cache

    @property
    def capacity(self) -> int:
        """Shards held open at most (remote ones pinned in the shard cache)."""
        return self._capacity

    def close(self) -> None:
        """Release every open shard (and its pin in the shard cache)."""
        while self._open:
            self._open.popitem(last=False)[1].close()

    def _next_use_keys(self) -> dict[str, int] | None:
        if self.next_use is None:
            return None
        return {remote_spec(self._shards[s]).key: p for s, p in self.next_use.items() if p is not None}

    def ref(self, shard_id: int) -> ShardRef:
        return self._shards[shard_id]

    def texts(self, shard_ids: np.ndarray, rows: np.ndarray) -> list[str]:
        """Texts of the documents, in the order given."""
        out: list[str] = [""] * len(shard_ids)
        # Group by shard, keeping the first-appearance order so LRU eviction follows the plan.
        _, first = np.unique(shard_ids, return_index=True)
        for shard_id in shard_ids[np.sort(first)]:
            idx = np.flatnonzero(shard_ids == shard_id)
            values = self._read(int(shard_id), rows[idx])
            for i, v in zip(idx.tolist(), values, strict=True):
                out[i] = v
        return out

    def iter_shard(self, shard_id: int, chunk_rows: int = 4096) -> Iterator[list[str]]:
        """All texts of one shard in row order, a row group (or ``chunk_rows`` JSONL rows) at a time.

        Used by the planner's count pass; nothing is cached, so memory stays at one row group.
        """
        shard = self.open_shard(shard_id, cache=False)
        try:
            if shard.parquet is not None:
                assert shard.rg_starts is not None
                for g in range(shard.parquet.metadata.num_row_groups):
                    column = shard.parquet.read_row_group(g, columns=[self._field]).column(0)
                    first = int(shard.rg_starts[g])
                    yield [self._check(shard.ref, first + i, v) for i, v in enumerate(column.to_pylist())]
            else:
                assert shard.spans is not None
                for start in range(0, len(shard.spans[0]), chunk_rows):
                    yield self._read_jsonl(shard, np.arange(start, min(start + chunk_rows, len(shard.spans[0]))))
        finally:
            shard.close()

    def open_shard(self, shard_id: int, *, cache: bool = True) -> _OpenShard:
        """Open a shard (remote: through the shard cache, pinned until closed); ``cache=False`` leaves it
        out of the LRU, and the caller closes it."""
        shard = self._open.get(shard_id)
        if shard is not None:
            self._open.move_to_end(shard_id)
            return shard
        ref = self._shards[shard_id]
        shard = _OpenShard(ref=ref)
        path = ref.uri
        if is_remote_uri(ref.uri):
            if self._cache is None:
                raise ConfigError(
                    f"dataset {ref.dataset!r}: remote shard {ref.uri} must be read through the shard cache, got "
                    "no cache — pass .options(io_options=StoreOptions(cache=CacheOptions(enabled=True, root=...)))"
                )
            if cache:  # release pins first, so the shards held open never exceed the reader's capacity
                while len(self._open) >= self._capacity:
                    self._open.popitem(last=False)[1].close()
            handle = self._cache.acquire(remote_spec(ref), next_use=self._next_use_keys())
            shard.handle, path = handle, str(handle.path)
        else:
            try:
                size = os.path.getsize(ref.uri)
            except OSError as exc:
                raise DatasetError(
                    f"dataset {ref.dataset!r}: shard {ref.uri} must exist as planned, got {exc.strerror} — "
                    "restore the file or re-plan"
                ) from exc
            if size != ref.bytes:
                raise DatasetError(
                    f"dataset {ref.dataset!r}: shard {ref.uri} changed since planning: size must be {ref.bytes} "
                    f"bytes, got {size} — restore the planned data or re-plan"
                )
        if ref.format == "parquet":
            shard.parquet = pq.ParquetFile(path)
            names = shard.parquet.schema_arrow.names
            if self._field not in names:
                raise DatasetError(
                    f"dataset {ref.dataset!r}: shard {ref.uri} must have the column {self._field!r}, got "
                    f"columns {names} — pass field=... to tokenize() with one of them"
                )
            meta = shard.parquet.metadata
            counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            shard.rg_starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        else:
            shard.jsonl = decompress(Path(path).read_bytes(), ref.format)
            shard.spans = line_spans(shard.jsonl)
        if not cache:
            return shard
        self._open[shard_id] = shard
        while len(self._open) > self._capacity:
            self._open.popitem(last=False)[1].close()
        return shard

    def _read(self, shard_id: int, rows: np.ndarray) -> list[str]:
        shard = self.open_shard(shard_id)
        if shard.parquet is not None:
            return self._read_parquet(shard, rows)
        return self._read_jsonl(shard, rows)

    def _read_parquet(self, shard: _OpenShard, rows: np.ndarray) -> list[str]:
        assert shard.parquet is not None and shard.rg_starts is not None
        groups = np.searchsorted(shard.rg_starts, rows, side="right") - 1
        out: list[str] = [""] * len(rows)
        for g in np.unique(groups).tolist():
            column = shard.row_groups.get(g)
            if column is None:
                table = shard.parquet.read_row_group(g, columns=[self._field])
                column = table.column(0).combine_chunks()
                shard.row_groups[g] = column
            idx = np.flatnonzero(groups == g)
            local = rows[idx] - shard.rg_starts[g]
            values = column.take(pa.array(local)).to_pylist()
            for i, local_row, v in zip(idx.tolist(), local.tolist(), values, strict=True):
                out[i] = self._check(shard.ref, int(shard.rg_starts[g]) + local_row, v)
        return out

    def _read_jsonl(self, shard: _OpenShard, rows: np.ndarray) -> list[str]:
        assert shard.jsonl is not None and shard.spans is not None
        starts, ends = shard.spans
        data = shard.jsonl
        out = []
        for row in rows.tolist():
            line = data[starts[row] : ends[row]]
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise DatasetError(
                    f"dataset {shard.ref.dataset!r}: shard {shard.ref.uri} row {row} must be a JSON object, "
                    f"got invalid JSON ({exc}) — fix or remove that line"
                ) from exc
            if not isinstance(record, dict) or self._field not in record:
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise DatasetError(
                    f"dataset {shard.ref.dataset!r}: shard {shard.ref.uri} row {row} must have the field "
                    f"{self._field!r}, got {keys} — pass field=... to tokenize() or fix the data"
                )
            out.append(self._check(shard.ref, row, record[self._field]))
        return out

    def _check(self, ref: ShardRef, row: int, value: object) -> str:
        if not isinstance(value, str):
            raise DatasetError(
                f"dataset {ref.dataset!r}: shard {ref.uri} row {row} field {self._field!r} must be a string, "
                f"got {'null' if value is None else type(value).__name__} — clean the data or pick another field"
            )
        return value
