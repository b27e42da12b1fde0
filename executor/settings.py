"""The executor's own settings (``ExecutorSpec``) and what a run reports (``RunStats``).

The stage settings it is built from (``TokenizeSpec``, ``PackSpec``, ``BatchSpec``, ``StoreOptions``) are in
``zephon.specs``, which the planner reads too; the loop itself is ``zephon.executor.runner``.

The executor follows the plan and decides nothing about *what* is read: the documents, their order and
therefore every batch are fixed by the plan bundle and the tokenize/pack settings. ``read_chunk`` (documents
read and tokenized together) and the tokenizer's thread count change speed only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon.checks import local_directory, plain_numbers, require_positive
from zephon.errors import ConfigError
from zephon.executor.identity import resolve_dp
from zephon.executor.operators import Operator
from zephon.executor.read.shard_reader import ON_BAD_DOCUMENT
from zephon.plan.records import ShardRef
from zephon.specs import BatchSpec, PackSpec, SamplePackSpec, StoreOptions, TokenizeSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutorSpec:
    """Everything the executor needs besides the plan: the one settings object a ``Pipeline`` holds.

    A pipeline is built step by step (``.tokenize()``, ``.pack_flat()``, ``.batch()``, ``.options()``), each step
    a ``dataclasses.replace`` of this object, so every value is checked here, once, whichever step set it.
    ``tokenize``, ``pack`` and ``batch`` are None until their step ran; ``ready()`` says which are missing. A
    pipeline with ``batch`` but neither ``tokenize`` nor ``pack`` is a *record* pipeline (``records``): it yields
    collated records (``zephon.executor.records``, docs/records.md).

    Attributes:
        tokenizer_threads: threads one rank tokenizes on (None: ``RAYON_NUM_THREADS``, else the cores this process
            may use). Set it to use a node's spare cores, or to share them among ranks; never changes the data.
        on_bad_document: ``"raise"`` (default) stops at a bad document with an error naming dataset, shard and
            row; ``"skip"`` (estimated plans only) skips it — no tokens — and counts it in ``RunStats.skipped``.
            See docs/reliability.md.
        dp_rank, dp_size: this process's data-parallel identity, both or neither (None: torch.distributed, else
            ``RANK``/``WORLD_SIZE``, else 0 of 1; ``zephon.executor.identity``).
        provenance_dir: where every rank logs what it yields (``zephon.executor.provenance_log``); None: no log.
        collate: record pipelines only — how a microbatch's records become one batch (None: the default
            collate, ``zephon.executor.records.collate``).
    """

    tokenize: TokenizeSpec | None = None
    pack: PackSpec | None = None
    batch: BatchSpec | None = None
    io: StoreOptions = field(default_factory=StoreOptions)
    read_chunk: int = 1024
    tokenizer_threads: int | None = None
    on_bad_document: str = "raise"
    #: User operators (``Pipeline.map_transform`` / ``map_batch``), run before tokenizing (executor.operators).
    operators: tuple[Operator, ...] = ()
    dp_rank: int | None = None
    dp_size: int | None = None
    provenance_dir: str | None = None
    collate: Callable[[list[dict[str, Any]]], Any] | None = None
    #: Record pipelines only: samples grouped into rows by cost at plan time (``Pipeline.pack_samples``).
    sample_pack: SamplePackSpec | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.io, StoreOptions):
            raise ConfigError(f"io_options must be zephon.io.StoreOptions, got {type(self.io).__name__}")
        plain_numbers(self, "read_chunk", "tokenizer_threads", "dp_rank", "dp_size")
        require_positive(self.read_chunk, "read_chunk")
        require_positive(self.tokenizer_threads, "tokenizer_threads", optional=True)
        if self.on_bad_document not in ON_BAD_DOCUMENT:
            raise ConfigError(f'on_bad_document must be "raise" or "skip", got {self.on_bad_document!r}')
        if self.dp_rank is not None or self.dp_size is not None:
            resolve_dp(self.dp_rank, self.dp_size)  # both or neither, rank in [0, size)
        if self.provenance_dir is not None:
            local_directory(  # logs are written where the rank runs: not empty (the working directory), no URL
                self.provenance_dir, "provenance_dir", example="'logs/run1'",
                remote_fix="logs are written where the rank runs: log to a local folder and copy it afterwards",
            )  # fmt: skip
        if self.pack is None or self.batch is None:
            return
        cells = self.batch.microbatch_size * self.pack.max_length
        memory = _physical_memory()
        if memory is not None and cells * BYTES_PER_CELL > memory // 2:
            raise ConfigError(
                f"microbatch_size × max_length must fit in half this machine's {memory / 2**30:.1f} GiB of memory, got "
                f"{self.batch.microbatch_size} × {self.pack.max_length} tokens needing "
                f"{cells * BYTES_PER_CELL / 2**30:.1f} GiB of batch buffers — lower microbatch_size or max_length"
            )

    @property
    def records(self) -> bool:
        """A record pipeline: neither ``.tokenize()`` nor ``.pack_flat()`` (docs/records.md)."""
        return self.tokenize is None and self.pack is None

    def ready(self) -> ExecutorSpec:
        """This spec, once ``tokenize``, ``pack`` and ``batch`` are all set — or, for a record pipeline, ``batch``
        alone (else one ``ConfigError`` naming the first missing step): what a run needs before its first batch."""
        if self.sample_pack is not None and not self.records:
            raise ConfigError(
                "pack_samples must go with a record pipeline, got it with .tokenize()/.pack_flat() — drop "
                "pack_samples (text is packed by pack_flat), or drop tokenize and pack_flat to yield records"
            )
        if self.records and self.batch is not None:
            return self
        if self.collate is not None:
            raise ConfigError(
                "batch(collate=...) must go with a record pipeline, got it with .tokenize()/.pack_flat() — drop "
                "collate (text batches are packed rows), or drop tokenize and pack_flat to yield records"
            )
        seeded = [op.name for op in self.operators if op.seeded]
        if seeded:
            raise ConfigError(
                f"map_transform(seeded=True) must run in a record pipeline, got {seeded[0]} with .tokenize() — "
                "derive randomness from the record in text pipelines (docs/operators.md)"
            )
        steps = (("tokenize", self.tokenize), ("pack_flat", self.pack), ("batch", self.batch))
        missing = [name for name, value in steps if value is None]
        if missing:
            raise ConfigError(
                f"Pipeline must have .tokenize(), .pack_flat() and .batch() before iterating, got none for "
                f"{', '.join(missing)} — add {missing[0]}(...)"
                + (" (or .batch() alone: a pipeline of records, docs/records.md)" if self.records else "")
            )
        return self

    def rank(self) -> tuple[int, int]:
        """``(dp_rank, dp_size)`` of this process (``zephon.executor.identity.resolve_dp``)."""
        return resolve_dp(self.dp_rank, self.dp_size)


#: Bytes of one token cell across a microbatch's buffers: int64 ids, labels and positions, the flags.
BYTES_PER_CELL = 26


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


#: What a batch's stats are counted from (``RunStats.handed_out``): the dataset of each of its pieces, or its
#: documents and tokens per dataset counted already (``handed_counts``: an estimated plan's block of microbatches
#: counted in one pass, each added as it is handed out).
Counted = np.ndarray | tuple[list[int], list[int]]


def handed_counts(
    datasets: np.ndarray, pieces: np.ndarray, batch: np.ndarray, batches: int, num_datasets: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Documents and tokens per dataset of each of ``batches`` batches, from ``pieces`` (``PIECE_DTYPE``): piece
    ``k`` of dataset ``datasets[k]``, in batch ``batch[k]``; a document counts in the batch holding its first
    piece (``doc_start`` 0). Two ``bincount`` calls for all the batches."""
    cell = batch * num_datasets + datasets
    size = batches * num_datasets
    docs = np.bincount(cell, weights=pieces["doc_start"] == 0, minlength=size).astype(np.int64)
    toks = np.bincount(cell, weights=pieces["length"], minlength=size).astype(np.int64)
    return docs.reshape(batches, num_datasets).tolist(), toks.reshape(batches, num_datasets).tolist()


@dataclass(slots=True)
class RunStats:
    """What a run has handed out so far, per dataset name, for every plan kind: documents and tokens.

    Counted when a batch is handed out (yielded), from the provenance of its rows — never when a document is
    read or tokenized, which the read-ahead does early — so read-ahead, ``read_chunk`` and threads never change
    them. ``tokens`` are the tokens of a dataset's documents in the batches handed out (BOS/EOS included; a
    document split across rows or batches counts its tokens in each batch that holds them); a document counts
    in ``documents`` in the batch that holds its first token. After a whole run, ``tokens`` sum to the valid
    tokens (``Batch.lengths``) of every batch; a run resumed inside a document counts the rest of its tokens,
    not the document again. Every dataset of the plan is present, 0 until it is handed out.

    ``tokenizer_engine`` names the engine that encoded and ``refused_engines`` why faster ones were not used.

    Under ``on_bad_document="skip"``, ``skipped`` counts skipped documents by reason (``SKIP_REASONS``) and
    ``skipped_by_shard`` by shard URI, then reason; a skipped document is in neither ``documents`` nor
    ``tokens``. It is counted when a batch handed out holds a later document of its packing lane, or at the
    end of the plan.

    With ``max_tokens`` and ``long_documents="truncate"``, ``truncated`` counts the documents cut to the limit
    and ``truncated_tokens`` the tokens cut from them, per dataset (present once one is cut), when the batch
    holding the document's first token is handed out (``zephon.executor.truncations``).
    """

    documents: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_by_shard: dict[str, dict[str, int]] = field(default_factory=dict)
    truncated: dict[str, int] = field(default_factory=dict)
    truncated_tokens: dict[str, int] = field(default_factory=dict)
    #: The tokenizer engine that encoded (``zephon.executor.engines``), set at the first batch handed out.
    tokenizer_engine: str = ""
    #: Faster engines refused for this tokenizer: name → reason (not installed, ids differ on a probe, ...).
    refused_engines: dict[str, str] = field(default_factory=dict)
    #: The spot check (``zephon.executor.engines.spot_check``): documents re-encoded with ``tokenizers`` and
    #: compared so far, and the CPU seconds that took (updated at the end of a run).
    spot_checked: int = 0
    spot_check_seconds: float = 0.0
    #: Estimated plans, ``drop_last=True``: rows shorter than ``max_length`` before ``num_steps()`` (a lane ran
    #: out before the estimated end; 0 when the estimate holds).
    short_rows: int = 0
    #: Estimated plans, ``drop_last=False``: this rank's lanes still holding tokens at ``num_steps()`` (the
    #: estimate fell short and those tokens were not handed out; 0 when it holds).
    lanes_cut: int = 0
    #: The tokens those lanes still held.
    tokens_cut: int = 0

    def skip(self, ref: ShardRef, row: int, reason: str) -> None:
        """Count one skipped document (the ``on_skip`` callback of ``ShardReader``)."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        shard = self.skipped_by_shard.setdefault(ref.uri, {})
        shard[reason] = shard.get(reason, 0) + 1

    def truncate(self, name: str, cut: int) -> None:
        """Count one document of dataset ``name`` that ``long_documents="truncate"`` cut by ``cut`` tokens."""
        self.truncated[name] = self.truncated.get(name, 0) + 1
        self.truncated_tokens[name] = self.truncated_tokens.get(name, 0) + cut

    def include(self, names: list[str]) -> None:
        """Make every dataset of the plan present (0 until counted)."""
        for name in names:
            self.documents.setdefault(name, 0)
            self.tokens.setdefault(name, 0)

    def handed_out(self, names: list[str], datasets: Counted, pieces: np.ndarray) -> None:
        """Count a batch handed out: its ``pieces`` (``PIECE_DTYPE``), piece ``k`` of dataset ``datasets[k]``
        (an index into ``names``) — or, ``datasets`` a pair, its documents and tokens per dataset counted
        already (``handed_counts``). Per batch, in numpy: no Python work per document."""
        if isinstance(datasets, tuple):
            documents, tokens = datasets
        elif not len(pieces):
            return
        else:
            docs, toks = handed_counts(datasets, pieces, np.zeros(len(pieces), dtype=np.int64), 1, len(names))
            documents, tokens = docs[0], toks[0]
        for name, d, t in zip(names, documents, tokens, strict=True):
            if d or t:
                self.documents[name] = self.documents.get(name, 0) + d
                self.tokens[name] = self.tokens.get(name, 0) + t

    def records_handed_out(self, names: list[str], datasets: np.ndarray) -> None:
        """Count a record batch handed out: one record of dataset ``datasets[k]`` each (record pipelines count
        ``documents`` only: records are never tokenized)."""
        counts = np.bincount(np.asarray(datasets, np.int64), minlength=len(names))
        for i in np.flatnonzero(counts).tolist():
            self.documents[names[i]] = self.documents.get(names[i], 0) + int(counts[i])

    def token_shares(self) -> dict[str, float]:
        total = sum(self.tokens.values())
        return {k: v / total for k, v in self.tokens.items()} if total else {}
