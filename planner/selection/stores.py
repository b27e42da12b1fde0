"""A selection by metadata on a token store: the store's own files, read as the selection reads raw shards.

A Parquet or JSONL token store (``fmt="parquet"|"jsonl"`` with ``tokens_field=``; docs/token-stores.md) is a
set of files whose row i is document i of its part: the plan's shard is the file (``format = "tokens:parquet"``,
``zephon.planner.counts.stores``) and the plan's row is the file's row. Its other columns are metadata, so
``where``, ``order_by``, ``dedup_on`` and a sidecar ``metadata=``/``key=`` join select its documents exactly as
they select a raw dataset's (``zephon.planner.selection.evaluate``): this module only renames each store part
as the raw shard it is — its file's uri, its file format, its file size and pin — and the selection returns
(shard, row) pairs in the store's own numbering, which the plan then reads by index.

Invariant: ``selection_refs(name, store, refs)[j]`` describes the same file as part ``j`` of the store, with the same
number of rows; the selection's shard ``j`` row ``r`` is store part ``j`` document ``r``.

Stores without columns (Megatron, OLMo, datatrove, litData, MDS) have only ids: a selection on one is refused
in one line (select before writing the store, or keep a Parquet/JSONL token column with its metadata).

Example: store ``data/tok/`` holding ``a.parquet`` (columns ``input_ids``, ``score``; 3 rows) → shard
``ShardRef(uri="/abs/data/tok/a.parquet", format="tokens:parquet", rows=3)`` becomes
``ShardRef(uri="/abs/data/tok/a.parquet", format="parquet", rows=3, bytes=<file size>)`` for the selection;
``where="score >= 3"`` keeps the rows whose score passes, as for raw text.
"""

from __future__ import annotations

from dataclasses import replace

from zephon.executor.token_stores.columns import ColumnPart
from zephon.executor.token_stores.files import HubBlob, LocalBlob, ObjectBlob
from zephon.executor.token_stores.store import TokenStore
from zephon.plan.records import ShardRef
from zephon.recipe.token_store import selection_refused

__all__ = ["COLUMN_STORES", "selection_refs"]

#: Store formats whose parts are files with columns beside the ids (a selection can name them).
COLUMN_STORES = ("parquet", "jsonl")


def selection_refs(dataset: str, store: TokenStore, refs: tuple[ShardRef, ...]) -> tuple[ShardRef, ...]:
    """Dataset ``dataset``'s store parts (``refs``, opened as ``store`` by ``zephon.planner.counts.stores``) as
    the raw shards the selection code reads (see the module); refused for stores without columns."""
    if store.format not in COLUMN_STORES:
        raise selection_refused(dataset, store.format)
    out = []
    for ref, part in zip(refs, store.parts, strict=True):
        assert isinstance(part, ColumnPart)
        blob = part.blob  # the part's file, as the store listed and pinned it
        fmt = part.format  # parquet, jsonl, jsonl.gz, jsonl.zst: the file's own format
        if isinstance(blob, LocalBlob):
            uri, fingerprint = str(blob.path), ref.fingerprint
        elif isinstance(blob, ObjectBlob):
            uri, fingerprint = blob.file.uri, blob.file.pin
        else:
            assert isinstance(blob, HubBlob)
            uri, fingerprint = blob.name, f"etag:{blob.file.etag}"
        out.append(replace(ref, uri=uri, format=fmt, bytes=blob.size, fingerprint=fingerprint))
    return tuple(out)
