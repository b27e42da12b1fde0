"""Fetching the text of planned documents from their shards, local or through the shard cache.

``ShardReader`` returns the texts of (shard, row) pairs. It opens each shard — a local file, or a remote one
downloaded into the shard cache and pinned there while open — checks it, and hands it to the reader of its
format: Parquet shards are read one row group at a time with only the text column
(``zephon.executor.read.parquet``); JSONL shards are read and decompressed whole, since gzip and zstd streams
cannot be sought (``zephon.executor.read.jsonl``). Decoded shards stay in a small LRU sized by the plan's
shuffle window (rows are shuffled within windows of ``window_shards`` shards per dataset), so each shard is
read about once per epoch.

Checked when a shard is opened (each time it enters the LRU), before any row is used — a shard that changed
since planning is refused, never read:

* local shards: the file exists and has the planned size (one ``stat``);
* Parquet: the planned row count (footer) and the footer fingerprint (the last 8 bytes and the footer are read
  again: a few KB, no data page); the text column exists and holds strings;
* JSONL: the BLAKE2b fingerprint of the file's bytes (one hash pass over the bytes read anyway, ~0.9 GB/s on
  one core), a complete gzip/zstd stream, and the planned row count;
* remote shards: size and etag (sha256 or git blob id) are verified by the shard cache at download.

Fingerprints are compared for local shards whose plan holds one that Zephon computes (``_checkable``).

A bad *document* (invalid UTF-8 or JSON, not an object, no such field, null or not a string) raises a
``DatasetError`` naming the dataset, shard and row, unless the reader runs with ``on_bad_document="skip"``:
then its text is None and it is counted (``zephon.executor.read.bad_documents``); the error suggests that policy
only when the reader is ``skippable`` (a run of an estimated plan). A bad *shard* (truncated,
corrupt, changed, missing column) always raises: a shard is not a document. Empty texts (``""``) are valid
documents. Over 400 lines: one LRU of open shards and their cache pins serves every kind of text shard (local,
cached, by ranges, a token store's part, the plan's copy); split by kind, each would keep its own.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from zephon.errors import ConfigError, DatasetError
from zephon.executor.encode.slices import LossFlagged
from zephon.executor.operators import Where
from zephon.executor.read.bad_documents import ON_BAD_DOCUMENT, SKIP_REASONS, BadDocuments, RecordConverter
from zephon.executor.read.jsonl import JsonlLines, JsonlShard
from zephon.executor.read.memory_release import release_memory, release_now_and_then
from zephon.executor.read.parquet import ParquetShard, in_index_order
from zephon.executor.read.selected_copy import CopiedShard
from zephon.executor.read.shared_groups import SharedRowGroups
from zephon.executor.read.spill import Spill
from zephon.executor.token_stores.shards import PlanStores, is_store_shard
from zephon.plan.records import ShardRef
from zephon.specs import StoreCredentials
from zephon.storage.objects.paths import is_object_uri
from zephon.storage.objects.range_file import RangeFile
from zephon.storage.remote import is_remote_uri, remote_file
from zephon.storage.shard_cache import CachedShard, CacheEntrySpec, ShardCache

__all__ = ["ON_BAD_DOCUMENT", "SKIP_REASONS", "ShardReader", "planning_cache", "remote_spec"]


#: Shard formats only a record pipeline reads (WebDataset tars, MDS shards of records).
RECORD_FORMATS = ("tar", "tar.gz", "mds")


def remote_spec(ref: ShardRef, credentials: tuple[StoreCredentials, ...] = ()) -> CacheEntrySpec:
    """The shard cache entry of a remote shard: downloaded whole, verified against size and etag (an object
    store's GET carries the pin itself, ``zephon.storage.objects.reads``)."""
    if is_object_uri(ref.uri):
        from zephon.storage.objects.reads import download_object, object_file

        obj = object_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format)
        return CacheEntrySpec(
            key=f"{obj.path.cloud}/{obj.path.bucket}/{obj.path.key}",
            size=ref.bytes,
            etag=obj.pin,
            fetch=lambda dest: download_object(obj, dest, credentials),
        )
    from zephon.storage.hub.client import download_remote_file

    file = remote_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format)
    return CacheEntrySpec(
        key=f"hf/{file.repo_id}/{file.revision}/{file.path_in_repo}",
        size=ref.bytes,
        etag=file.etag,
        fetch=lambda dest: download_remote_file(file, dest, in_place=True),
    )


def planning_cache() -> ShardCache:
    """The shard cache the planner downloads remote shards into when it must read them (calibration, the
    count pass): ``$ZEPHON_CACHE_DIR/shards``, unbounded."""
    from zephon.storage.files import cache_dir

    return ShardCache(cache_dir() / "shards", None)


@dataclass(slots=True)
class _OpenShard:
    """An open shard: its format's reader and, for a remote shard, its pin in the shard cache."""

    ref: ShardRef
    text: ParquetShard | JsonlShard | CopiedShard | LossFlagged
    handle: CachedShard | None = None  # a remote shard's pinned cache entry, released by close()

    @property
    def parquet(self) -> pq.ParquetFile | None:
        """The Parquet file (None for JSONL, and for a plan's copy: its rows are not the shard's)."""
        return self.text.file if isinstance(self.text, ParquetShard) else None

    @property
    def spans(self) -> tuple[np.ndarray, np.ndarray] | None:
        """JSONL: the ``(starts, ends)`` of the decompressed lines (None for Parquet)."""
        return self.text.spans if isinstance(self.text, JsonlShard) else None

    def close(self) -> None:
        if isinstance(self.text, ParquetShard | CopiedShard):
            self.text.close()
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        release_now_and_then()  # the shard's decoded text, unless released lately (zephon.executor.read.memory_release)


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
        on_skip: Callable[..., None] | None = None,
        skippable: bool = False,
        convert: RecordConverter | None = None,
        copies: dict[int, ShardRef] | None = None,
        stores: PlanStores | None = None,
    ) -> None:
        """``convert`` (chat): hand out each whole record converted by it instead of the field's string
        (``zephon.executor.read.bad_documents.RecordConverter``). ``skippable``: the caller may switch on
        ``on_bad_document="skip"`` (a run of an estimated plan), so a bad document's error suggests it; planning,
        inspection and exact plans cannot skip, and are not told to. ``copies``: shard id → the plan's compact
        copy of its planned rows, read instead of the shard (``zephon.executor.read.selected_copy``). ``stores``:
        the plan's token stores, whose shards (``tokens:<fmt>``) give each document's ids instead of its text
        (``zephon.executor.token_stores.shards``)."""
        self._documents = BadDocuments(field_name, on_bad_document, on_skip, skippable=skippable, convert=convert)
        self._shards = {s.shard_id: s for s in shards}
        self._cache_keys: dict[int, str] = {}  # shard id → its shard cache key (``_next_use_keys``), made once
        self._copies = copies or {}
        self._stores = stores
        self._capacity = max(1, capacity)
        #: At most this many open shards per dataset (evicting that dataset's least recently used): a dataset
        #: read slowly keeps its window open while another streams through its shards (a global LRU evicted
        #: the slow one's shards, and their row groups were decoded again and again).
        self._per_dataset = per_dataset
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()
        self._cache = cache
        #: Range mode for object-store shards (``attach_ranges``): the read-ahead bound in bytes, else None.
        self._range_bytes: int | None = None
        self._credentials: tuple[StoreCredentials, ...] = ()
        #: Decoded row groups shared with the rank's other DataLoader workers (``attach_share``), else None.
        self._share: SharedRowGroups | None = None
        #: The budget of decoded text this reader keeps in memory, the rest in files (``ZEPHON_DECODED_MEMORY``):
        #: read when the first shard is kept open (a reader of shards read once, the count pass's, never needs it).
        self._spill: Spill | None = None
        self._spill_read = False
        #: Set by the executor: shard id → the plan position of its next use (None: never again).
        self.next_use: dict[int, int | None] | None = None

    def attach_cache(self, cache: ShardCache) -> None:
        self._cache = cache

    def attach_share(self, share: SharedRowGroups | None) -> None:
        """Parquet row groups decoded once for the rank's DataLoader workers from now on
        (``zephon.executor.read.shared_groups``); None: not shared."""
        self._share = share

    def publish_decoded(self, share: SharedRowGroups) -> int:
        """Publish the decoded row groups of the open Parquet shards to ``share`` (``ParquetShard.publish_decoded``:
        a calibration's, for the DataLoader workers about to start); how many."""
        shards = [s.text for s in self._open.values() if isinstance(s.text, ParquetShard)]
        return sum(shard.publish_decoded(share) for shard in shards)

    def attach_ranges(self, read_ahead_bytes: int) -> None:
        """Read object-store shards by range requests from now on (``StoreOptions(remote_read="range")``)."""
        self._range_bytes = read_ahead_bytes

    def attach_credentials(self, credentials: tuple[StoreCredentials, ...]) -> None:
        """Object-store reads use these overrides first (a run's ``StoreOptions.credentials``)."""
        self._credentials = credentials

    @property
    def bad_documents(self) -> BadDocuments:
        """This reader's ``on_bad_document`` policy (record readers of other formats report through it)."""
        return self._documents

    @property
    def credentials(self) -> tuple[StoreCredentials, ...]:
        return self._credentials

    @property
    def ranged(self) -> bool:
        """Object-store shards are read by range requests (``attach_ranges``), not through the shard cache."""
        return self._range_bytes is not None

    def acquire(self, ref: ShardRef) -> CachedShard:
        """A remote shard's local copy in the shard cache, pinned until the handle is closed."""
        if self._cache is None:
            raise ConfigError(
                f"dataset {ref.dataset!r}: remote shard {ref.uri} must be read through the shard cache, got "
                "no cache — pass .options(io_options=StoreOptions(cache=CacheOptions(enabled=True, root=...)))"
            )
        return self._cache.acquire(remote_spec(ref, self._credentials), next_use=self._next_use_keys())

    @property
    def capacity(self) -> int:
        """Shards held open at most (remote ones pinned in the shard cache)."""
        return self._capacity

    @property
    def pins(self) -> int:  # open shards pinned in the shard cache (remote shards read through it)
        return sum(shard.handle is not None for shard in self._open.values())

    def close(self) -> None:
        """Release every open shard (and its pin in the shard cache), then hand the memory they held back at once:
        a reader closed for good — at the end of a run, in a DataLoader's parent once its workers took over, after
        a planner's calibration — frees every decoded shard together, and the throttled release of each shard's
        close (``memory_release.release_now_and_then``) would keep most of it in the allocators, resident for the
        rest of the process (2.1 GB in a loader's parent over a 20-dataset mixture of 28 MB row groups)."""
        closed = bool(self._open)
        while self._open:
            self._open.popitem(last=False)[1].close()
        if self._spill is not None:
            self._spill.close()  # the files of row groups past the budget (zephon.executor.read.spill)
        if closed:
            release_memory()

    def _kept_spill(self) -> Spill | None:
        if not self._spill_read:
            self._spill, self._spill_read = Spill.from_env(), True
        return self._spill

    def _next_use_keys(self) -> dict[str, int] | None:
        if self.next_use is None:
            return None
        keys = self._cache_keys
        for s in self.next_use.keys() - keys.keys():
            keys[s] = remote_spec(self._shards[s]).key
        return {keys[s]: p for s, p in self.next_use.items() if p is not None}

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Skipped and dropped documents read inside are not reported to ``on_skip`` (still logged once per
        shard): a run's calibration reads documents that the run counts when it hands them out."""
        self._documents.counting = False
        try:
            yield
        finally:
            self._documents.counting = True

    def ref(self, shard_id: int) -> ShardRef:
        return self._shards[shard_id]

    def texts(self, shard_ids: np.ndarray, rows: np.ndarray) -> list[str | None]:
        """Texts of the documents, in the order given; None for a skipped document (``on_bad_document="skip"``).

        Shards are opened in the order they first appear (so LRU eviction follows the plan); each shard's rows
        are read together (Parquet: one ``take`` per decoded row group) and put back in the order given.
        """
        if not len(shard_ids):
            return []
        _, first = np.unique(shard_ids, return_index=True)
        order = shard_ids[np.sort(first)].tolist()
        # what the previous chunks' texts and ids left free (zephon.executor.read.memory_release)
        release_now_and_then()
        if len(order) == 1:
            got = self.open_shard(order[0]).text.read(rows)
            if self._documents.convert is None:
                return got  # type: ignore[return-value]
            parts = [(np.arange(len(rows)), got)]
        else:
            parts = []
            for shard_id in order:
                idx = np.flatnonzero(shard_ids == shard_id)
                parts.append((idx, self.open_shard(shard_id).text.read(rows[idx])))
        out = in_index_order(len(shard_ids), parts)
        if self._documents.convert is not None:  # record mode: the records, converted together
            ids, rs = shard_ids.tolist(), rows.tolist()
            where = [Where(self._shards[s], r) for s, r in zip(ids, rs, strict=True)]
            return self._documents.convert.convert_all(where, out, self._documents)
        return out

    def iter_shard(self, shard_id: int, chunk_rows: int = 4096) -> Iterator[list[str | None]]:
        """All texts of one shard in row order, a row group (or ``chunk_rows`` JSONL rows) at a time.

        Used by the planner's count pass; nothing is cached, so memory stays at one row group.
        """
        shard = self.open_shard(shard_id, cache=False)
        convert, ref, first = self._documents.convert, self._shards[shard_id], 0
        try:
            chunks = (
                shard.text.iter_texts() if isinstance(shard.text, ParquetShard) else shard.text.iter_texts(chunk_rows)
            )
            for chunk in chunks:
                if convert is not None:  # record mode: converted as training converts them
                    where = [Where(ref, first + i) for i in range(len(chunk))]
                    chunk = convert.convert_all(where, chunk, self._documents)
                first += len(chunk)
                yield chunk
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
        if ref.format in RECORD_FORMATS:  # a record pipeline reads these through zephon.executor.records
            kind = "an MDS" if ref.format == "mds" else "a WebDataset"
            raise ConfigError(
                f"dataset {ref.dataset!r}: shard {ref.uri} is {kind} shard of records, got a reader of text (a "
                "pipeline with .tokenize(), or zephon show without --no-text) — read its samples with a record "
                "pipeline (no .tokenize(); docs/records.md)"
            )
        if cache:  # first, so that a remote shard's pin is released before another is acquired
            self._make_room(ref)
        if is_store_shard(ref):  # a token store's part: its documents' ids, read by range
            if self._stores is None:
                raise ConfigError(
                    f"dataset {ref.dataset!r}: shard {ref.uri} is a token store's part, got a reader without the "
                    "plan's stores — read it through the plan's run (ShardAccess)"
                )
            shard = _OpenShard(ref=ref, text=LossFlagged(self._stores.open(ref)))
            if cache:
                self._open[shard_id] = shard
            return shard
        copy = self._copies.get(shard_id)
        if copy is not None:  # the plan's copy of the rows it reads: local to the bundle, checked when opened
            shard = _OpenShard(ref=ref, text=CopiedShard(ref, copy, self._documents))
            if cache:
                self._open[shard_id] = shard
            return shard
        handle: CachedShard | None = None
        path = ref.uri
        source: str | bytes | RangeFile | JsonlLines | None = None
        if is_object_uri(ref.uri) and self._range_bytes is not None:
            source = self._open_by_ranges(ref)
        elif is_remote_uri(ref.uri):
            handle = self.acquire(ref)
            path = str(handle.path)
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
        # A remote shard's bytes were verified by the shard cache at download, an object's by its pin at each GET.
        local = handle is None and source is None
        if source is None:
            source = path
        try:
            if isinstance(source, JsonlLines):
                text: ParquetShard | JsonlShard = source
            elif ref.format == "parquet":
                assert isinstance(source, str | RangeFile)
                text = ParquetShard(
                    ref,
                    source,
                    self._documents,
                    check_fingerprint=local and _checkable(ref, "pqfooter:"),
                    share=self._share if cache else None,  # a shard read once (count pass) is not shared
                    spill=self._kept_spill() if cache else None,  # (nor held: one row group at a time)
                )
            else:
                assert isinstance(source, str | bytes)
                text = JsonlShard(ref, source, self._documents, check_fingerprint=local and _checkable(ref, "blake2b:"))
        except BaseException:
            if handle is not None:
                handle.close()  # a refused remote shard releases its pin
            raise
        shard = _OpenShard(ref=ref, text=text, handle=handle)
        if cache:
            self._open[shard_id] = shard
        return shard

    def _open_by_ranges(self, ref: ShardRef) -> bytes | RangeFile | JsonlLines:
        """Range mode: a Parquet object as a :class:`RangeFile` (its footer read the first time: one GET); a
        plain JSONL object with a known line index as :class:`JsonlLines` (rows fetched by ranges); any other
        JSONL object's bytes read whole into memory (gzip and zstd cannot be sought; a plain one's line index is
        saved for its next opening). No local copy either way."""
        from zephon.storage.jsonl import line_spans
        from zephon.storage.objects.range_file import fetch_ranges
        from zephon.storage.objects.reads import object_file, read_whole
        from zephon.storage.objects.scan import line_index, save_line_index

        obj = object_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format)
        if ref.format == "parquet":
            assert self._range_bytes is not None
            return RangeFile(obj, self._credentials, read_ahead_bytes=self._range_bytes)
        spans = line_index(obj) if ref.format == "jsonl" else None
        if spans is not None:
            creds = self._credentials
            return JsonlLines(ref, spans, lambda ranges: fetch_ranges(obj, ranges, creds), self._documents)
        raw = read_whole(obj, self._credentials)
        if ref.format == "jsonl":
            save_line_index(obj, line_spans(raw))
        return raw

    def _make_room(self, ref: ShardRef) -> None:
        """Close shards so that one more of ``ref``'s dataset fits: that dataset's least recently used beyond
        its quota (``per_dataset``), then the least recently used of all beyond ``capacity``."""
        if self._per_dataset is not None:
            same = [k for k, s in self._open.items() if s.ref.dataset_id == ref.dataset_id]
            for k in same[: max(0, len(same) - self._per_dataset + 1)]:
                self._open.pop(k).close()
        while len(self._open) >= self._capacity:
            self._open.popitem(last=False)[1].close()


def _checkable(ref: ShardRef, kind: str) -> bool:
    """True when the plan's fingerprint is one Zephon computes (``kind`` + 32 hex digits): plans written by hand
    or by other tools may hold other values, which are not compared."""
    digest = ref.fingerprint.removeprefix(kind)
    return digest != ref.fingerprint and len(digest) == 32 and all(c in "0123456789abcdef" for c in digest)
