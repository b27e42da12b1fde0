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
from typing import Any

from zephon.errors import ConfigError, DatasetError, TokenizerError, one_line, warn
from zephon.executor.encode.load import EOS_GUESSES, load_tokenizer
from zephon.executor.token_stores import TokenStore, open_token_store
from zephon.executor.token_stores.identity import TokenizerIdentity
from zephon.executor.token_stores.shards import part_content, part_counts, part_fingerprint
from zephon.plan.format import STORE_SHARD_PREFIX
from zephon.plan.records import ShardInfo, ShardRef
from zephon.planner.counts.shard_tokens import ShardTokens
from zephon.recipe.dataset import Dataset
from zephon.recipe.token_store import TokenStoreSpec
from zephon.specs import TokenizeSpec

__all__ = ["forget_stores", "load_identity", "open_dataset_store", "store_identity", "store_shards", "store_tokens"]

#: Stores opened by the plan being prepared (``forget_stores`` empties it when a plan starts, so a store
#: rewritten between two plans of one process is read again).
_OPENED: dict[tuple[str, TokenStoreSpec], TokenStore] = {}


#: Tokenizer identities loaded by the plan being prepared, by (name, EOS override); None: it did not load.
_IDENTITIES: dict[tuple[str, str | None], TokenizerIdentity | None] = {}


def forget_stores() -> None:
    """Drop the stores opened so far (``zephon.planner.prepare`` calls it as each plan starts)."""
    _OPENED.clear()
    _IDENTITIES.clear()


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
                fingerprint=part_fingerprint(store.format, store.dtype, counts, part_content(store, j)),
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


def load_identity(name: str, *, eos_token: str | None = None) -> TokenizerIdentity:
    """The identity of tokenizer ``name``, loaded on its own (no text tokenized); ``eos_token`` overrides its EOS as
    ``tokenize(eos_token=)`` does. Raises ``TokenizerError`` when it does not load."""
    tokenizer, specials = load_tokenizer(name)
    eos = eos_token or specials.get("eos_token")
    if eos is None:
        eos = next((t for t in EOS_GUESSES if tokenizer.token_to_id(t) is not None), None)
    eos_id = tokenizer.token_to_id(eos) if eos is not None else None
    bos = specials.get("bos_token")
    pad = specials.get("pad_token")
    pad_id = tokenizer.token_to_id(pad) if pad else None
    return TokenizerIdentity(
        tokenizer=name,
        vocab_size=int(tokenizer.get_vocab_size(with_added_tokens=True)),
        eos_token_id=eos_id,
        bos_token_id=tokenizer.token_to_id(bos) if bos else None,
        pad_token_id=eos_id if pad_id is None else pad_id,
    )


def _identity(name: str, eos_token: str | None, *, dataset: str, quiet: bool = False) -> TokenizerIdentity | None:
    key = (name, eos_token)
    if key not in _IDENTITIES:
        try:
            _IDENTITIES[key] = load_identity(name, eos_token=eos_token)
        except TokenizerError as exc:
            _IDENTITIES[key] = None
            if not quiet:
                warn(
                    f"dataset {dataset!r}: the tokenizer {name!r} its ids were made with must load for the plan to "
                    f"record its vocabulary and special tokens, got: {one_line(exc)} — the run will only check "
                    "that ids are below its vocabulary; pass tokenizer= a local tokenizer or a Hub id in the cache"
                )
    return _IDENTITIES[key]


def store_identity(ds: Dataset, tokenize: TokenizeSpec | None) -> dict[str, Any] | None:
    """plan.json ``token_store.identity``: the vocabulary size and special ids of the tokenizer the store's ids were
    made with (``zephon.executor.token_stores.identity``), or None when no tokenizer is named or it does not load.

    The tokenizer is the store's record (datatrove), else ``tokenizer=``, else the plan's ``tokenize``. Loading
    it reads its files only: no text is tokenized, so a plan of token stores only still tokenizes nothing. When
    the store names its own tokenizer and the plan tokenizes with another that loads and differs, the plan is
    refused here rather than every run later."""
    store = open_dataset_store(ds)
    assert ds.token_store is not None
    declared = store.tokenizer or ds.token_store.tokenizer
    planned = tokenize.tokenizer_id if tokenize is not None else None
    name = declared or planned
    if name is None:
        return None
    eos = tokenize.eos_token if tokenize is not None and name == planned else None
    identity = _identity(name, eos, dataset=ds.name)
    if identity is None:
        return None
    if declared and planned and planned != declared and tokenize is not None:
        other = _identity(planned, tokenize.eos_token, dataset=ds.name, quiet=True)
        differences = identity.differences(other) if other is not None else []
        if differences:
            raise ConfigError(
                f"dataset {ds.name!r}: token store {store.path!r} must be planned with the tokenizer its ids were "
                f"made with, got tokenize(tokenizer_id={planned!r}) whose {', '.join(differences)} differ from "
                f"{name!r}'s — tokenize with {name!r} (or one of the same vocabulary and special tokens), or "
                "tokenize the store again with this tokenizer"
            )
    return identity.as_json()
