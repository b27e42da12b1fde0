"""One run's shard reader and remote access, opened once and shared by its calibration and its batches.

A run of an estimated plan measures tokens per unit on the plan's first documents before its first batch
(``zephon.executor.pack.run_length``): the documents of the shards the run opens first. Both read through one
``ShardAccess``, so each of those shards is opened, checked, fetched (range mode: its text column chunks) and
decoded once — the run takes the calibration's decoded row groups from the reader's LRU of open shards.

Skips: the calibration reads with counting off (``ShardReader.uncounted``), so a document the skip policy
leaves out is counted once, when the run reaches it, and its shard's warning is logged once (the reader's
``BadDocuments.warned`` is shared).

Lifetime: the runner opens it on first use (the calibration, or the first batch) and closes it when its
iteration ends, or when the runner is dropped without iterating (``Pipeline.num_steps()``): closing releases
the open shards, their pins in the shard cache and the cache's prefetch thread.

Example: a plan over 2 datasets with ``window_shards=1`` keeps 4 shards open; its first 2,048 documents lie in
shards A0, B0, A1. ``num_steps()`` decodes the row groups of A0, B0, A1 that hold them, and the first chunks
of the run find those row groups decoded: nothing is read twice.
"""

from __future__ import annotations

import numpy as np

from zephon.executor.encode.encoders import converter_of
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.read.remote import RemoteAccess
from zephon.executor.read.shard_reader import ShardReader
from zephon.executor.read.skipped_documents import SkipReports
from zephon.executor.settings import ExecutorSpec, RunStats
from zephon.executor.token_stores.shards import PlanStores


def vocab_size(encoder: object) -> int | None:
    """The run's tokenizer's vocabulary, added tokens included (``tokenizers``' ``get_vocab_size``), or None
    for an encoder without one (a test double)."""
    tokenizer = getattr(encoder, "tokenizer", None)
    size = getattr(tokenizer, "get_vocab_size", None)
    return int(size(with_added_tokens=True)) if size is not None else None


class ShardAccess:
    """The ``reader`` and ``remote`` access of one run (see the module docstring).

    ``reports``: estimated plans hold the reader's skip reports until the chunk being read takes them (reading may
    run ahead on a thread; ``zephon.executor.estimated``); exact plans count skips in ``stats`` directly.
    """

    def __init__(self, plan: PlanBundle, spec: ExecutorSpec, encoder: object, *, stats: RunStats | None) -> None:
        exact = plan.manifest.exact
        window = plan.manifest.shuffle.window_shards
        self.reports = SkipReports()
        on_skip = self.reports.add if not exact else (stats.skip if stats is not None else None)
        self.reader = ShardReader(
            plan.shards,
            spec.tokenize.field,
            capacity=(window + 1) * len(plan.dataset_names),
            per_dataset=window + 1,  # a dataset reads within a window of shards, and crosses into the next
            on_bad_document=spec.on_bad_document,  # "skip": estimated plans only (check_exact_plan)
            skippable=not exact,  # so only an estimated plan's errors suggest the skip policy
            on_skip=on_skip,
            convert=converter_of(encoder),  # chat and user operators: records rendered on the reader's thread
            copies=plan.copies,  # materialize_selections: selected shards read from the plan's copies
            # token stores: their documents' ids read by range, refused when ≥ the run's vocabulary
            stores=PlanStores(plan.manifest.datasets, vocab_size=vocab_size(encoder), credentials=spec.io.credentials),
        )
        self.remote = RemoteAccess(plan, spec.io, self.reader)

    def calibration_texts(self, shard_ids: np.ndarray, rows: np.ndarray) -> list[str | None]:
        """The calibration's texts (None: skipped), read without counting skips (the run counts them)."""
        with self.reader.uncounted():
            return self.reader.texts(shard_ids, rows)

    def close(self) -> None:
        """Release the open shards, their pins and the shard cache (idempotent)."""
        self.remote.close()
