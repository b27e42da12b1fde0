"""A plan's token-store shards at run time: each planned (part, document) read as its ids, by range.

A plan lays a token store out as shards — one per part of the store, ``format = "tokens:<fmt>"``, rows its
documents (``zephon.planner.counts.stores``) — and records in plan.json, per dataset, how to open the store
again (``token_store``: format, options, the ids' tokenizer) at its ``pinned`` path. ``PlanStores`` opens each
store once per run (its indexes only), finds a shard's part by the part's name, and refuses a part whose index
changed since planning (its fingerprint: format, dtype and per-document counts, and a sample of a local file's
bytes or a remote file's pin, :func:`part_fingerprint`).

``StoreShard.read(rows)`` returns the documents' ids in the order asked, end to end (``TokenDocuments``,
a sequence of per-document arrays to the reader): sliced from the memory map of a local file, else the rows
sorted, each run of consecutive documents one range read, then put back in order (``TokenStore.gather``). The
ids are the stored ids, as they are: no BOS or EOS is added or dropped (docs/token-stores.md says what each
format stores), and they go through the same packing as encoded text (``encode_in_slices`` passes them on).

Example: a shard of a Megatron store, rows ``[4, 1, 2]`` → documents 1..2 in one read and 4 in another →
``[ids(4), ids(1), ids(2)]``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from zephon.errors import DatasetError
from zephon.executor.token_stores.opening import open_token_store
from zephon.executor.token_stores.store import TokenDocuments, TokenStore
from zephon.plan.format import STORE_SHARD_PREFIX
from zephon.plan.records import ShardRef
from zephon.specs import StoreCredentials

__all__ = ["PlanStores", "StoreShard", "is_store_shard", "part_content", "part_counts", "part_fingerprint"]


def is_store_shard(ref: ShardRef) -> bool:
    """Whether ``ref`` is a token store's part (``zephon.plan.format.STORE_SHARD_PREFIX``)."""
    return ref.format.startswith(STORE_SHARD_PREFIX)


#: Blocks of a local part's file read into its fingerprint (``content_sample``), and their size.
SAMPLE_BLOCKS, SAMPLE_BYTES = 16, 4096


def part_fingerprint(fmt: str, dtype: object, counts: np.ndarray, content: bytes | None = None) -> str:
    """A part's fingerprint: ``index:<BLAKE2b>`` of its format, dtype and per-document counts (its index's
    content); with ``content`` (``part_content``: a local file's sample of bytes, a remote file's pin),
    ``store:<BLAKE2b>`` of those and it — so ids rewritten with the same counts (a store tokenized again, a file
    copied over it) are told apart too."""
    digest = hashlib.blake2b(f"{fmt}\0{np.dtype(dtype).str}\0".encode(), digest_size=16)  # type: ignore[call-overload]
    digest.update(np.ascontiguousarray(counts, dtype="<i8").tobytes())
    if content is None:
        return "index:" + digest.hexdigest()
    digest.update(content)
    return "store:" + digest.hexdigest()


def part_content(store: TokenStore, j: int) -> bytes | None:
    """What part ``j``'s fingerprint holds of its file: a local file's ``content_sample``, a remote file's pin
    (``TokenStore.pins``: ETag and version, or a Hub file's hash), or — a compressed MDS shard, decompressed into
    memory under the raw shard's name, local or remote — the ``content_sample`` of its decompressed bytes; else
    None (a part of none of these: its index alone)."""
    part = store.parts[j]
    name = part.name
    if "://" not in name and os.path.isfile(name):
        fd = os.open(name, os.O_RDONLY)
        try:
            return content_sample(os.fstat(fd).st_size, lambda at: os.pread(fd, SAMPLE_BYTES, at))
        finally:
            os.close(fd)
    pin = store.pins.get(name)
    if pin is not None:
        return f"pin:{pin}".encode()
    blob = getattr(part, "decompressed", None)
    if blob is None:
        return None
    return content_sample(blob.size, lambda at: bytes(blob.read(at, min(at + SAMPLE_BYTES, blob.size))))


def content_sample(size: int, read: Callable[[int], bytes]) -> bytes:
    """The size of a file (or of a decompressed shard's bytes) and ``SAMPLE_BLOCKS`` blocks of ``SAMPLE_BYTES``
    spread evenly from its first byte to its last, ``read(offset)`` giving the block there (~64 KiB read, whatever
    the size): a rewrite of its ids shows in them unless it spares every block. Example: a 1 GB ``.bin`` → its
    size and the 4 KiB at offsets 0, ~66.7 MB, …, 1 GB − 4 KiB."""
    last = max(size - SAMPLE_BYTES, 0)
    offsets = sorted({last * k // (SAMPLE_BLOCKS - 1) for k in range(SAMPLE_BLOCKS)})
    return str(size).encode() + b"".join(read(at) for at in offsets)


def part_counts(store: TokenStore, j: int) -> np.ndarray:
    """Tokens of each document of part ``j`` (int64, from the index)."""
    return store.token_counts()[int(store.part_starts[j]) : int(store.part_starts[j + 1])]


class StoreShard:
    """One part of a store, read as a shard: rows are the part's document numbers."""

    def __init__(self, ref: ShardRef, store: TokenStore, part: int) -> None:
        self.ref, self.store, self.part = ref, store, part
        self.first = int(store.part_starts[part])

    def read(self, rows: np.ndarray) -> TokenDocuments:
        """The ids of documents ``rows`` (in that order), end to end (``TokenStore.gather``: sliced from the memory
        map of a local file, else one range read per run of consecutive rows); a list of documents to the reader."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.ref.rows):
            bad = int(rows[(rows < 0) | (rows >= self.ref.rows)][0])
            raise DatasetError(
                f"dataset {self.ref.dataset!r}: shard {self.ref.uri} must have row {bad}, got {self.ref.rows} "
                "documents — the plan does not match the store; re-plan"
            )
        return self.store.gather(self.first + rows)


class PlanStores:
    """The token stores of a plan's datasets, opened when a shard of theirs is first read (see the module)."""

    def __init__(
        self,
        datasets: Sequence[Any],
        *,
        vocab_size: int | None = None,
        credentials: Sequence[StoreCredentials] = (),
    ) -> None:
        """``datasets``: plan.json's ``datasets`` (``PlanDataset``: ``id``, ``name``, ``pinned``, ``token_store``).
        ``vocab_size``: the run's tokenizer's; every read refuses ids ≥ it, naming the file and document.
        ``credentials``: the run's ``StoreOptions.credentials``, first for object-store stores (the Hub's token
        comes from ``HF_TOKEN`` or ``hf auth login`` at open, as for raw text)."""
        self._credentials = tuple(credentials)
        self._specs: dict[int, tuple[str, Mapping[str, Any]]] = {
            d.id: (d.pinned, d.token_store) for d in datasets if d.token_store is not None
        }
        self._names = {d.id: d.name for d in datasets}
        self.vocab_size = vocab_size
        self._stores: dict[int, tuple[TokenStore, dict[str, int]]] = {}

    def __bool__(self) -> bool:
        return bool(self._specs)

    def store(self, dataset_id: int) -> TokenStore:
        """Dataset ``dataset_id``'s store, opened once (its indexes read)."""
        return self._opened(dataset_id)[0]

    def _opened(self, dataset_id: int) -> tuple[TokenStore, dict[str, int]]:
        got = self._stores.get(dataset_id)
        if got is None:
            if dataset_id not in self._specs:
                raise DatasetError(
                    f"dataset {self._names.get(dataset_id, dataset_id)!r} must be recorded as a token store in "
                    "plan.json, got no token_store entry — the bundle is damaged; re-plan"
                )
            path, spec = self._specs[dataset_id]
            options = {k: spec.get(k) for k in ("dtype", "eos_token_id", "bos_token_id", "tokens_field")}
            name = self._names.get(dataset_id, dataset_id)
            try:
                store = open_token_store(
                    path, fmt=spec.get("fmt"), vocab_size=self.vocab_size, credentials=self._credentials, **options
                )
            except DatasetError as exc:  # the store's own words, with the dataset they are about (as at planning)
                raise DatasetError(f"dataset {name!r}: {exc}") from None
            if store.has_loss != bool(spec.get("loss_mask")):
                now = "keeps a loss mask (.ds.loss)" if store.has_loss else "keeps no loss mask"
                raise DatasetError(
                    f"dataset {name!r}: token store {store.path!r} {now}, which "
                    "the plan does not record — it changed since planning, or the plan predates loss masks: re-plan "
                    "(the run applies a store's mask only when its plan records it)"
                )
            got = (store, {p.name: j for j, p in enumerate(store.parts)})
            self._stores[dataset_id] = got
        return got

    def open(self, ref: ShardRef) -> StoreShard:
        """The shard ``ref`` as a part of its store, checked against the plan (name, documents, fingerprint)."""
        store, parts = self._opened(ref.dataset_id)
        j = parts.get(ref.uri)
        if j is None:
            raise DatasetError(
                f"dataset {ref.dataset!r}: token store {store.path!r} must still hold {ref.uri} as planned, got "
                f"parts {sorted(parts)[:4]} — restore the store or re-plan"
            )
        counts = part_counts(store, j)
        sampled = ref.fingerprint.startswith("store:")  # plans before content samples: the index alone
        content = part_content(store, j) if sampled else None
        if len(counts) != ref.rows or part_fingerprint(store.format, store.dtype, counts, content) != ref.fingerprint:
            what = "documents, counts, dtype or content" if sampled else "documents, counts or dtype"
            raise DatasetError(
                f"dataset {ref.dataset!r}: {ref.uri} changed since planning: its {what} differ from the plan's "
                f"({len(counts)} documents now, {ref.rows} planned) — restore the store or re-plan"
            )
        return StoreShard(ref, store, j)
