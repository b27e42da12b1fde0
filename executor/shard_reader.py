"""Fetching the text of planned documents from their shards.

Parquet shards are read one row group at a time with only the text column; JSONL shards are read and
decompressed whole (gzip and zstd streams cannot be sought). Decoded shards stay in a small LRU sized by
the plan's shuffle window (rows are shuffled within windows of ``window_shards`` shards per dataset), so
each shard is read about once per epoch.

Checked when a shard is opened (each time it enters the LRU), before any row is used — a shard that changed
since planning is refused, never read:

* local shards: the file exists and has the planned size (one ``stat``);
* Parquet: the planned row count (footer) and the footer fingerprint (the last 8 bytes and the footer are read
  again: a few KB, no data page); the text column exists and holds strings;
* JSONL: the BLAKE2b fingerprint of the file's bytes (one hash pass over the bytes read anyway, ~0.9 GB/s on
  one core), a complete gzip/zstd stream, and the planned row count;
* remote shards: size and etag (sha256 or git blob id) are verified by the shard cache at download.

A bad *document* (invalid UTF-8 or JSON, not an object, no such field, null or not a string) raises a
``DatasetError`` naming the dataset, shard and row, unless the reader runs with ``on_bad_document="skip"``:
then its text is None, ``on_skip(ref, row, reason)`` counts it and the first one per shard is logged. A bad
*shard* (truncated, corrupt, changed, missing column) always raises: a shard is not a document. Empty texts
(``""``) are valid documents.
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import ConfigError, DatasetError, one_line
from zephon.plan.records import ShardRef
from zephon.storage.jsonl import decompress, line_spans
from zephon.storage.remote import is_remote_uri, remote_file
from zephon.storage.scan import jsonl_fingerprint, parquet_fingerprint
from zephon.storage.shard_cache import CacheEntrySpec, ShardCache

log = logging.getLogger(__name__)

#: Values of ``on_bad_document``: raise a ``DatasetError`` (default), or skip the document and count it.
ON_BAD_DOCUMENT = ("raise", "skip")
#: Why a document was skipped: the keys of ``RunStats.skipped``.
SKIP_REASONS = ("not_utf8", "invalid_json", "not_an_object", "missing_field", "null_text", "not_text")
_SKIP_HINT = 'or skip and count such documents with Pipeline.options(on_bad_document="skip") (estimated plans)'
_ARROW_ERRORS = (OSError, ValueError, pa.ArrowException)


def remote_spec(ref: ShardRef) -> CacheEntrySpec:
    """The shard cache entry of a remote shard: downloaded whole, verified against size and etag."""
    from zephon.storage.hub.client import download_remote_file

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
    #: Parquet: the text of every row of the row groups decoded so far (None elsewhere), converted once.
    values: list[object] = field(default_factory=list)
    decoded: np.ndarray | None = None  # per row group: already in ``values``
    nulls: bool = False  # a decoded row group holds a null: rows must be checked one by one
    jsonl: bytes | None = None
    spans: tuple[np.ndarray, np.ndarray] | None = None
    handle: object | None = None  # a pinned zephon.storage.shard_cache.CachedShard for remote shards

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()  # type: ignore[attr-defined]
            self.handle = None


def planning_cache() -> ShardCache:
    """The shard cache the planner downloads remote shards into when it must read them (calibration, the
    count pass): ``$ZEPHON_CACHE_DIR/shards``, unbounded."""
    from zephon.storage.files import cache_dir

    return ShardCache(cache_dir() / "shards", None)


class ShardReader:
    """Return the ``field`` values of (shard, row) pairs, caching up to ``capacity`` open shards."""

    def __init__(
        self,
        shards: list[ShardRef],
        field_name: str,
        capacity: int,
        *,
        per_dataset: int | None = None,
        cache: ShardCache | None = None,
        on_bad_document: str = "raise",
        on_skip: Callable[[ShardRef, int, str], None] | None = None,
    ) -> None:
        if on_bad_document not in ON_BAD_DOCUMENT:
            raise ConfigError(f'on_bad_document must be "raise" or "skip", got {on_bad_document!r}')
        self._shards = {s.shard_id: s for s in shards}
        self._field = field_name
        self._capacity = max(1, capacity)
        #: At most this many open shards per dataset (evicting that dataset's least recently used): a dataset
        #: read slowly keeps its window open while another streams through its shards (a global LRU evicted
        #: the slow one's shards, and their row groups were decoded again and again).
        self._per_dataset = per_dataset
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()
        self._cache = cache
        self._skip = on_bad_document == "skip"
        self._on_skip = on_skip
        self._warned: set[int] = set()  # shards whose first skipped document was logged
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

    def texts(self, shard_ids: np.ndarray, rows: np.ndarray) -> list[str | None]:
        """Texts of the documents, in the order given; None for a skipped document (``on_bad_document="skip"``).

        Shards are opened in the order they first appear (so LRU eviction follows the plan); Parquet row groups
        are decoded once into per-shard lists, and the texts are gathered by one list comprehension.
        """
        if not len(shard_ids):
            return []
        _, first = np.unique(shard_ids, return_index=True)
        lists: dict[int, list[object]] = {}  # shards whose rows need no check: their values
        others: list[tuple[np.ndarray, list[str | None]]] = []  # the rest: (indices, texts)
        for shard_id in shard_ids[np.sort(first)].tolist():
            shard = self.open_shard(shard_id)
            mask = shard_ids == shard_id
            if shard.parquet is not None:
                self._decode(shard, rows[mask])
                if not shard.nulls:
                    lists[shard_id] = shard.values
                    continue
            idx = np.flatnonzero(mask)
            read = self._read_parquet if shard.parquet is not None else self._read_jsonl
            others.append((idx, read(shard, rows[idx])))
        ids, rs = shard_ids.tolist(), rows.tolist()
        if len(lists) == 1 and not others:
            values = lists[ids[0]]
            return [values[r] for r in rs]  # type: ignore[misc]  # strings: the shard has no null
        out: list[str | None] = [lists[s][r] if s in lists else None for s, r in zip(ids, rs, strict=True)]  # type: ignore[misc]
        for idx, texts in others:
            for i, v in zip(idx.tolist(), texts, strict=True):
                out[i] = v
        return out

    def iter_shard(self, shard_id: int, chunk_rows: int = 4096) -> Iterator[list[str | None]]:
        """All texts of one shard in row order, a row group (or ``chunk_rows`` JSONL rows) at a time.

        Used by the planner's count pass; nothing is cached, so memory stays at one row group.
        """
        shard = self.open_shard(shard_id, cache=False)
        try:
            if shard.parquet is not None:
                assert shard.rg_starts is not None
                for g in range(shard.parquet.metadata.num_row_groups):
                    column = self._row_group(shard, g)
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
        if cache:  # first, so that a remote shard's pin is released before another is acquired
            self._make_room(ref)
        shard = _OpenShard(ref=ref)
        path = ref.uri
        if is_remote_uri(ref.uri):
            if self._cache is None:
                raise ConfigError(
                    f"dataset {ref.dataset!r}: remote shard {ref.uri} must be read through the shard cache, got "
                    "no cache — pass .options(io_options=StoreOptions(cache=CacheOptions(enabled=True, root=...)))"
                )
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
        try:
            if ref.format == "parquet":
                self._open_parquet(shard, path, local=shard.handle is None)
            else:
                self._open_jsonl(shard, path, local=shard.handle is None)
        except BaseException:
            shard.close()  # a refused remote shard releases its pin
            raise
        if cache:
            self._open[shard_id] = shard
        return shard

    def _make_room(self, ref: ShardRef) -> None:
        """Close shards so that one more of ``ref``'s dataset fits: that dataset's least recently used beyond
        its quota (``per_dataset``), then the least recently used of all beyond ``capacity``."""
        if self._per_dataset is not None:
            same = [k for k, s in self._open.items() if s.ref.dataset_id == ref.dataset_id]
            for k in same[: max(0, len(same) - self._per_dataset + 1)]:
                self._open.pop(k).close()
        while len(self._open) >= self._capacity:
            self._open.popitem(last=False)[1].close()

    def _open_parquet(self, shard: _OpenShard, path: str, *, local: bool) -> None:
        ref = shard.ref
        where = f"dataset {ref.dataset!r}: shard {ref.uri}"
        try:
            shard.parquet = pq.ParquetFile(path)
            fingerprint = parquet_fingerprint(path)[1] if local and _checkable(ref, "pqfooter:") else None
        except _ARROW_ERRORS as exc:
            raise DatasetError(
                f"{where} must be a readable Parquet file, got {one_line(exc)} — restore it from its source or re-plan"
            ) from exc
        meta = shard.parquet.metadata
        if meta.num_rows != ref.rows:
            raise DatasetError(
                f"{where} changed since planning: rows must be {ref.rows}, got {meta.num_rows} — restore the "
                "planned data or re-plan"
            )
        if fingerprint is not None and fingerprint != ref.fingerprint:
            raise DatasetError(
                f"{where} changed since planning: its Parquet footer (row groups, offsets, statistics) must match "
                f"fingerprint {ref.fingerprint}, got {fingerprint} — restore the planned data or re-plan"
            )
        schema = shard.parquet.schema_arrow
        if self._field not in schema.names:
            raise DatasetError(
                f"{where} must have the column {self._field!r}, got columns {schema.names} — pass field=... to "
                "tokenize() with one of them"
            )
        kind = schema.field(self._field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
            raise DatasetError(
                f"{where} column {self._field!r} must hold strings, got {kind} — pass field=... to tokenize() with "
                "a text column, or convert the column to strings"
            )
        counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        shard.rg_starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)

    def _open_jsonl(self, shard: _OpenShard, path: str, *, local: bool) -> None:
        ref = shard.ref
        where = f"dataset {ref.dataset!r}: shard {ref.uri}"
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise DatasetError(f"{where} must be readable, got {exc.strerror or exc} — restore the file") from exc
        if local and _checkable(ref, "blake2b:"):
            fingerprint = jsonl_fingerprint(raw)
            if fingerprint != ref.fingerprint:
                raise DatasetError(
                    f"{where} changed since planning: its bytes must match fingerprint {ref.fingerprint}, got "
                    f"{fingerprint} — restore the planned data or re-plan"
                )
        try:
            shard.jsonl = decompress(raw, ref.format)
        except ValueError as exc:
            raise DatasetError(
                f"{where} must be a complete {ref.format} file, got {one_line(exc)} — restore it from its source or "
                "re-export it, then re-plan"
            ) from exc
        shard.spans = line_spans(shard.jsonl)
        if len(shard.spans[0]) != ref.rows:
            raise DatasetError(
                f"{where} changed since planning: rows (non-empty lines) must be {ref.rows}, got "
                f"{len(shard.spans[0])} — restore the planned data or re-plan"
            )

    def _row_group(self, shard: _OpenShard, g: int) -> pa.Array:
        """The text column of row group ``g``; a row group that cannot be decoded is a corrupt shard."""
        assert shard.parquet is not None and shard.rg_starts is not None
        try:
            return shard.parquet.read_row_group(g, columns=[self._field]).column(0).combine_chunks()
        except _ARROW_ERRORS as exc:
            first, end = int(shard.rg_starts[g]), int(shard.rg_starts[g + 1])
            raise DatasetError(
                f"dataset {shard.ref.dataset!r}: shard {shard.ref.uri} row group {g} (rows {first}-{end - 1}) must "
                f"decode, got {type(exc).__name__}: {one_line(exc)} — the file is corrupt: restore it from its "
                "source or re-export it, then re-plan"
            ) from exc

    def _bad(self, ref: ShardRef, row: int, reason: str, message: str) -> None:
        """A bad document: raise (default), or count it for ``on_bad_document="skip"`` (its text becomes None)."""
        if not self._skip:
            raise DatasetError(f"{message} {_SKIP_HINT}")
        if self._on_skip is not None:
            self._on_skip(ref, row, reason)
        if ref.shard_id not in self._warned:
            self._warned.add(ref.shard_id)
            log.warning(
                "skipping a bad document (on_bad_document='skip'; Pipeline.stats().skipped counts them, this is "
                "logged once per shard): %s",
                message.rpartition(" — ")[0] or message,
            )

    def _decode(self, shard: _OpenShard, rows: np.ndarray) -> None:
        """Decode the row groups holding ``rows`` that are not yet in ``shard.values``."""
        assert shard.parquet is not None and shard.rg_starts is not None
        starts = shard.rg_starts
        if shard.decoded is None:
            shard.decoded = np.zeros(len(starts) - 1, dtype=bool)
            shard.values = [None] * int(starts[-1])
        groups = np.searchsorted(starts, rows, side="right") - 1
        for g in np.unique(groups[~shard.decoded[groups]]).tolist():
            column = self._row_group(shard, g)
            shard.values[int(starts[g]) : int(starts[g + 1])] = column.to_pylist()
            shard.nulls |= column.null_count > 0 or pa.types.is_null(column.type)
            shard.decoded[g] = True

    def _read_parquet(self, shard: _OpenShard, rows: np.ndarray) -> list[str | None]:
        """Texts of ``rows``, each checked (a shard with nulls), row group by row group."""
        assert shard.rg_starts is not None
        self._decode(shard, rows)
        groups = np.searchsorted(shard.rg_starts, rows, side="right") - 1
        out: list[str | None] = [None] * len(rows)
        for g in np.unique(groups).tolist():
            idx = np.flatnonzero(groups == g)
            for i, row in zip(idx.tolist(), rows[idx].tolist(), strict=True):
                out[i] = self._check(shard.ref, row, shard.values[row])
        return out

    def _read_jsonl(self, shard: _OpenShard, rows: np.ndarray) -> list[str | None]:
        assert shard.jsonl is not None and shard.spans is not None
        starts, ends = shard.spans
        data = shard.jsonl
        return [self._jsonl_row(shard.ref, row, data[starts[row] : ends[row]]) for row in rows.tolist()]

    def _jsonl_row(self, ref: ShardRef, row: int, line: bytes) -> str | None:
        where = f"dataset {ref.dataset!r}: shard {ref.uri} row {row}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            self._bad(
                ref,
                row,
                "not_utf8",
                f"{where} must be UTF-8 text, got byte 0x{line[exc.start]:02x} at byte {exc.start} of the line — "
                "re-encode the file as UTF-8 (e.g. iconv -t utf-8), fix or remove that line,",
            )
            return None
        if row == 0 and text.startswith("\ufeff"):  # a UTF-8 byte order mark opens the file
            text = text[1:]
        try:
            record = json.loads(text)
        except ValueError as exc:
            self._bad(
                ref,
                row,
                "invalid_json",
                f"{where} must be a JSON object, got invalid JSON ({one_line(exc)}) in {_excerpt(text)} — fix or "
                "remove that line,",
            )
            return None
        if not isinstance(record, dict):
            self._bad(
                ref,
                row,
                "not_an_object",
                f"{where} must be a JSON object, got a JSON {_json_kind(record)} — fix or remove that line,",
            )
            return None
        if self._field not in record:
            self._bad(
                ref,
                row,
                "missing_field",
                f"{where} must have the field {self._field!r}, got keys {sorted(record)} — pass field=... to "
                "tokenize(), fix the data,",
            )
            return None
        return self._check(ref, row, record[self._field])

    def _check(self, ref: ShardRef, row: int, value: object) -> str | None:
        if isinstance(value, str):
            return value
        reason, got = ("null_text", "null") if value is None else ("not_text", type(value).__name__)
        self._bad(
            ref,
            row,
            reason,
            f"dataset {ref.dataset!r}: shard {ref.uri} row {row} field {self._field!r} must be a string, got {got} "
            "— clean the data, pick another field,",
        )
        return None


def _checkable(ref: ShardRef, kind: str) -> bool:
    """True when the plan's fingerprint is one Zephon computes (``kind`` + 32 hex digits): plans written by hand
    or by other tools may hold other values, which are not compared."""
    digest = ref.fingerprint.removeprefix(kind)
    return digest != ref.fingerprint and len(digest) == 32 and all(c in "0123456789abcdef" for c in digest)


def _excerpt(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _json_kind(value: object) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
