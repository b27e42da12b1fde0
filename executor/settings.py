"""The executor's own settings (``ExecutorSpec``) and what a run reports (``RunStats``).

The stage settings it is built from (``TokenizeSpec``, ``PackSpec``, ``BatchSpec``, ``StoreOptions``) are in
``zephon.specs``, which the planner reads too; the loop itself is ``zephon.executor.runner``.

The executor follows the plan and decides nothing about *what* is read: the documents, their order and
therefore every batch are fixed by the plan bundle and the tokenize/pack settings. ``read_chunk`` (documents
read and tokenized together) and the tokenizer's thread count change speed only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zephon.errors import ConfigError
from zephon.executor.shard_reader import ON_BAD_DOCUMENT
from zephon.plan.records import ShardRef
from zephon.specs import BatchSpec, PackSpec, StoreOptions, TokenizeSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutorSpec:
    """Everything the executor needs besides the plan.

    Attributes:
        on_bad_document: ``"raise"`` (default) stops at a bad document with an error naming dataset, shard and
            row; ``"skip"`` (estimated plans only) skips it — no tokens — and counts it in ``RunStats.skipped``.
            See docs/reliability.md.
    """

    tokenize: TokenizeSpec
    pack: PackSpec
    batch: BatchSpec
    io: StoreOptions = field(default_factory=StoreOptions)
    read_chunk: int = 1024
    on_bad_document: str = "raise"

    def __post_init__(self) -> None:
        if self.on_bad_document not in ON_BAD_DOCUMENT:
            raise ConfigError(f'on_bad_document must be "raise" or "skip", got {self.on_bad_document!r}')


@dataclass(slots=True)
class RunStats:
    """What an executor run has read so far, per dataset name: documents and (realized) tokens.

    Under ``on_bad_document="skip"``, ``skipped`` counts skipped documents by reason (``SKIP_REASONS``) and
    ``skipped_by_shard`` by shard URI, then reason; a skipped document is in neither ``documents`` nor
    ``tokens``.
    """

    documents: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_by_shard: dict[str, dict[str, int]] = field(default_factory=dict)

    def skip(self, ref: ShardRef, row: int, reason: str) -> None:
        """Count one skipped document (the ``on_skip`` callback of ``ShardReader``)."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        shard = self.skipped_by_shard.setdefault(ref.uri, {})
        shard[reason] = shard.get(reason, 0) + 1

    def add(self, names: list[str], dataset_ids: np.ndarray, lengths: np.ndarray) -> None:
        docs = np.bincount(dataset_ids, minlength=len(names))
        toks = np.bincount(dataset_ids, weights=lengths, minlength=len(names))
        for i, name in enumerate(names):
            self.documents[name] = self.documents.get(name, 0) + int(docs[i])
            self.tokens[name] = self.tokens.get(name, 0) + int(toks[i])

    def token_shares(self) -> dict[str, float]:
        total = sum(self.tokens.values())
        return {k: v / total for k, v in self.tokens.items()} if total else {}
