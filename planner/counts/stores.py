"""A token store's shards and exact token counts at plan time, from its indexes alone: no count pass, no tokenizer.

A token-store dataset (``zephon.recipe.token_store``) is opened once per plan (``open_dataset_store``): the
store readers (``zephon.executor.token_stores``) read its indexes. Each *part* of the store (a Megatron prefix, a
datatrove ``.ds``, a litData chunk, an MDS shard, a Parquet file) is one shard of the plan — a row of
shards.parquet with ``format = "tokens:<fmt>"`` (``zephon.plan.format.STORE_SHARD_PREFIX``), ``uri`` the part's
file as the reader names it, ``rows`` its documents — and a document's row is its number in the part. Its tokens
are the part's index counts: exactly the ids the executor reads, as stored (no BOS/EOS added: a Megatron store
written with ``--append-eod`` already ends each document in EOS; docs/token-stores.md).

Fingerprint of a part: ``index:`` + BLAKE2b of its format, dtype and per-document counts — its index's
content, which the executor recomputes when it opens the store (``zephon.executor.token_stores.shards``), so a
store rewritten with other documents is refused.

Example: ``data/web_text_document`` (one Megatron prefix, 6 documents of 4, 3, 6, 2, 5, 3 ids, int32) → one
shard ``ShardInfo(uri=".../web_text_document.bin", format="tokens:megatron", rows=6, bytes=92, ...)``, counts
``[4, 3, 6, 2, 5, 3]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from zephon.errors import DatasetError
from zephon.executor.token_stores import TokenStore, open_token_store
from zephon.executor.token_stores.shards import part_counts, part_fingerprint
from zephon.plan.format import STORE_SHARD_PREFIX
from zephon.plan.records import ShardInfo, ShardRef
from zephon.planner.counts.shard_tokens import ShardTokens
from zephon.recipe.dataset import Dataset
from zephon.recipe.token_store import TokenStoreSpec

__all__ = ["forget_stores", "open_dataset_store", "store_shards", "store_tokens"]

#: Stores opened by the plan being prepared (``forget_stores`` empties it when a plan starts, so a store
#: rewritten between two plans of one process is read again).
_OPENED: dict[tuple[str, TokenStoreSpec], TokenStore] = {}


def forget_stores() -> None:
    """Drop the stores opened so far (``zephon.planner.prepare`` calls it as each plan starts)."""
    _OPENED.clear()


def store_path(ds: Dataset) -> str:
    """The path the store is opened at: ``pinned`` (absolute for a local store, so a run from elsewhere finds it)."""
    return ds.pinned or ds.path


def open_dataset_store(ds: Dataset) -> TokenStore:
    """The dataset's store, opened once per plan for its path and options (its indexes read once)."""
    spec = ds.token_store
    assert spec is not None
    key = (store_path(ds), spec)
    store = _OPENED.get(key)
    if store is None:
        try:
            store = open_token_store(store_path(ds), **spec.open_options())
        except DatasetError as exc:
            raise DatasetError(f"dataset {ds.name!r}: {exc}") from None
        if store.holds != "tokens":
            raise DatasetError(
                f"dataset {ds.name!r}: token store {store.path!r} must hold token ids to be planned, got text items "
                "— tokenize the text, or plan it as raw text (Parquet/JSONL)"
            )
        _OPENED[key] = store
    return store


def store_shards(ds: Dataset) -> list[ShardInfo]:
    """One ``ShardInfo`` per part of the dataset's store, in the store's order (see the module)."""
    store = open_dataset_store(ds)
    assert store.dtype is not None
    out = []
    for j, part in enumerate(store.parts):
        counts = part_counts(store, j)
        out.append(
            ShardInfo(
                uri=part.name,
                format=STORE_SHARD_PREFIX + store.format,
                rows=len(counts),
                bytes=int(counts.sum()) * store.dtype.itemsize,
                fingerprint=part_fingerprint(store.format, store.dtype, counts),
                row_groups=1,
            )
        )
    return out


def store_tokens(ds: Dataset, refs: Sequence[ShardRef]) -> ShardTokens:
    """The dataset's per-document token counts, one array per part (int64, from the index: nothing tokenized)."""
    store = open_dataset_store(ds)
    return ShardTokens(
        [lambda j=j: part_counts(store, j) for j in range(len(refs))],
        rows=[r.rows for r in refs],
        names=[f"{r.uri} (dataset {r.dataset!r})" for r in refs],
    )
