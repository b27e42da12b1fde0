"""Encoding a chunk of texts in slices of bounded size, so a rank's memory does not follow its largest chunk.

A read chunk is a number of documents (``read_chunk``, 1,024), not a number of bytes: on real text its size
varies with the documents in it — a chunk of the local corpus's mixture held 0.4 to 6.4 M characters, and a
longer run meets larger chunks (more code files, whose sizes have a long tail). One engine call on a whole
chunk holds, while it runs, the engine's own per-token objects for every document of it: with the
``tokenizers`` engine ~40 B a token in its ``Encoding`` objects and as much again in the Python lists of ids
handed back — ~130 MB for a chunk of 1.9 M tokens — and the encode pool runs two such calls side by side. So
the rank's peak RSS grew with the run: the cl100k conversion on the ``tokenizers`` engine, samples plan, 818 MB
at ×1 and 994 MB at ×4 of the local corpus; 798 MB at ×4 in slices (docs/performance.md, Memory at default
settings).

``encode_in_slices(encoder, texts, split=...)`` makes one ``encode_flat`` call per slice of consecutive
texts holding at most ``MAX_CHARS`` characters (a longer text is a slice on its own), and joins the slices'
ids and sizes. Each document is encoded on its own by every engine, so the ids are the same as one call's
(``test_encoding_in_slices_gives_the_ids_of_one_call``); only the engine's transient memory is bounded
(~25 MB a call with ``tokenizers``), and the int32 ids of the chunk, 4 B a token, are what stays.

Documents of a token store come as their ids (NumPy arrays, ``zephon.executor.token_stores.shards``): they are
not encoded. A chunk of one store's documents comes end to end (``TokenDocuments``): its ids are the chunk's,
with no per-document work; a chunk mixing them with texts goes through ``with_stored_ids``, which encodes the
texts among them and puts each document's ids in its place, the
stored ids as they are (no BOS/EOS added: docs/token-stores.md), so they go through the same packing.

Left whole: a call that settles the engine (the first of a run checks the fast engine on the run's own
documents: ``zephon.executor.encode.text``), and batches of anything but strings (chat records).

Example: a chunk of 1,024 texts of 5.2 M characters in all is encoded in 5 calls of ≤ 1 Mi characters each;
a chunk of 300 K characters in one call, as before.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from zephon.executor.encode.flags import FLAGGED, as_ids, join, tag, token_dtype, training
from zephon.executor.encode.text import Encoded
from zephon.executor.engines.at_document import AtDocument
from zephon.executor.token_stores.store import TokenDocuments

#: Characters per engine call (``encode_in_slices``): ~250 K tokens of English or code, a few ms of work
#: per call on any engine, so the slicing costs nothing measurable.
MAX_CHARS = 1 << 20


def slice_bounds(sizes: list[int], max_chars: int = MAX_CHARS) -> list[tuple[int, int]]:
    """``(start, end)`` of consecutive slices holding at most ``max_chars`` characters each (a text longer
    than that is a slice on its own); one slice ``(0, n)`` when they all fit."""
    bounds: list[tuple[int, int]] = []
    start, held = 0, 0
    for i, size in enumerate(sizes):
        if held and held + size > max_chars:
            bounds.append((start, i))
            start, held = i, 0
        held += size
    if start < len(sizes) or not bounds:
        bounds.append((start, len(sizes)))
    return bounds


def encode_in_slices(encoder: Any, texts: list[Any], *, split: bool = True, max_chars: int | None = None) -> Encoded:
    """``encoder.encode_flat(texts, split=split)``, made in slices of at most ``max_chars`` (default
    ``MAX_CHARS``) characters (see the module docstring): the same ids and sizes."""
    if isinstance(texts, TokenDocuments):  # one token store's documents, end to end: their ids as stored
        ids = as_ids(texts.tokens)  # FLAGGED already when the store keeps a loss mask (LossFlagged)
        return Encoded(training(ids) if token_dtype(encoder) == FLAGGED else ids, texts.lengths)
    kinds = set(map(type, texts))  # one pass in C (three generator passes cost ~3 CPU ns a token on short texts)
    if kinds != {str}:  # anything but plain strings: decided from the kinds, not the texts again
        if any(issubclass(k, np.ndarray) for k in kinds):  # a token store's documents: their ids, as stored
            return with_stored_ids(encoder, texts, split=split, max_chars=max_chars)
        if not all(issubclass(k, str) for k in kinds):
            return encoder.encode_flat(texts, split=split)
    if not getattr(encoder, "settled", False):
        return encoder.encode_flat(texts, split=split)
    limit = MAX_CHARS if max_chars is None else max_chars
    sizes = list(map(len, texts))
    if sum(sizes) <= limit:  # they all fit: one slice (what ``slice_bounds`` gives), without its loop
        return encoder.encode_flat(texts, split=split)
    bounds = slice_bounds(sizes, limit)
    if len(bounds) == 1:
        return encoder.encode_flat(texts, split=split)
    parts = []
    for a, b in bounds:
        try:
            parts.append(encoder.encode_flat(texts[a:b], split=split))
        except AtDocument as exc:  # its index in the caller's texts
            raise exc.at(a + exc.index) from None
    cut = None
    if any(p.cut is not None for p in parts):  # tokens truncation cut, per document of the whole call
        cut = np.concatenate([p.cut if p.cut is not None else np.zeros(len(p), np.int64) for p in parts])
    return Encoded(join([p.ids for p in parts]), np.concatenate([p.sizes for p in parts]), cut)


def with_stored_ids(encoder: Any, docs: list[Any], *, split: bool = True, max_chars: int | None = None) -> Encoded:
    """``encode_in_slices`` of documents some of which are already ids (arrays: read as they are, never
    encoded); the texts among them are encoded in one call. Example: ``["ab", ids([7, 8, 2])]`` → the ids of
    ``"ab"`` framed by the encoder (BOS, EOS), then ``7, 8, 2``; sizes ``[len(ab's ids), 3]``."""
    stored = [isinstance(d, np.ndarray) for d in docs]  # one check per document: the reader's lists are per document
    at = [i for i, s in enumerate(stored) if not s]
    sizes = np.zeros(len(docs), dtype=np.int64)
    encoded: Encoded | None = None
    if at:
        try:
            encoded = encode_in_slices(encoder, [docs[i] for i in at], split=split, max_chars=max_chars)
        except AtDocument as exc:  # its index in the caller's documents
            raise exc.at(at[exc.index]) from None
        sizes[at] = encoded.sizes
    for i, s in enumerate(stored):
        if s:
            sizes[i] = len(docs[i])
    pieces: list[np.ndarray] = []
    ends = np.cumsum(encoded.sizes) if encoded is not None else None
    flagged = token_dtype(encoder) == FLAGGED  # stored ids then train, every one (or as the store's mask says)
    k = 0
    for i, s in enumerate(stored):
        if s:
            pieces.append(training(docs[i]) if flagged else docs[i])
        else:
            assert encoded is not None and ends is not None
            pieces.append(encoded.ids[int(ends[k] - encoded.sizes[k]) : int(ends[k])])
            k += 1
    ids = join(pieces)
    cut = None
    if encoded is not None and encoded.cut is not None:  # the texts' cuts in their places (stored ids: never cut)
        cut = np.zeros(len(docs), dtype=np.int64)
        cut[at] = encoded.cut
    return Encoded(ids, sizes, cut)


class _StoreRows(Protocol):
    def read(self, rows: np.ndarray) -> TokenDocuments: ...


class LossFlagged:
    """A token store's shard whose documents come with the store's loss mask (datatrove ``.ds.loss``) in their
    ids' flags: ``FLAGGED`` records, ``LOSS`` where a token trains, so the mask travels with the ids through every
    stage (``zephon.executor.encode.flags``) — the run's encoder carries flags then (``StoreLoss``). Documents of
    a store without a mask come as they are."""

    def __init__(self, shard: _StoreRows) -> None:
        self.shard = shard

    def read(self, rows: np.ndarray) -> TokenDocuments:
        got = self.shard.read(rows)
        if got.loss_mask is None:
            return got
        return TokenDocuments(tokens=tag(as_ids(got.tokens), loss=got.loss_mask), offsets=got.offsets)
