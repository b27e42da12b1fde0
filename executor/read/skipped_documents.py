"""A document the skip policy left out: one record, from the shard reader's report to the stats and the log.

Under ``on_bad_document="skip"`` (estimated plans; docs/reliability.md) the shard reader reports each bad
document as it reads it — its shard, its row and why (``zephon.executor.read.bad_documents.SKIP_REASONS``) — through
its ``on_skip`` callback. Reading may run ahead on the read-ahead thread, so ``SkipReports`` holds the reports
until the chunk being read takes them; ``FetchTexts`` (``zephon.executor.estimated``) places each one at its plan
position and packing lane. ``DealLanes`` writes the placed record to the provenance log (its position and reason:
``skipped-*.parquet``, ``zephon.executor.provenance_log``) and holds it until a microbatch handed out passes its
position in its lane; ``RunStats.skip`` then counts it by reason and by shard URI (``skipped``,
``skipped_by_shard``).

Example: row 7 of shard ``web/p.jsonl`` is ``{"text": null}``. The reader reports
``SkippedDocument(ref=<web/p.jsonl>, row=7, reason="null_text")``; the chunk from position 4096 holds that row at
position 4101, dealt to lane 3, so it becomes ``SkippedDocument(..., position=4101, lane=3)``: the log gets
``(4101, "null_text")``, and ``RunStats.skipped["null_text"]`` counts it once lane 3 hands out a later document.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zephon.errors import DatasetError
from zephon.plan.records import ShardRef


@dataclass(frozen=True, kw_only=True, slots=True)
class SkippedDocument:
    """A document the skip policy left out (see the module docstring).

    Attributes:
        ref: its shard. row: its row in the shard.
        reason: why it was left out (a ``RunStats.skipped`` key).
        error: under ``on_bad_document="raise"`` (deferred), the error a run raises when its lane reaches it.
        position: its plan position; lane: the packing lane it was dealt to. ``None`` in the reader's report,
            set when the chunk being read places it (``placed``).
    """

    ref: ShardRef
    row: int
    reason: str
    position: int | None = None
    lane: int | None = None
    #: Under ``on_bad_document="raise"``: the error to raise when its lane reaches it (``BadDocuments.defer``);
    #: None for a document the skip policy left out.
    error: DatasetError | None = None

    def placed(self, *, position: int, lane: int) -> SkippedDocument:
        """This report at its plan ``position`` in packing ``lane``."""
        return replace(self, position=position, lane=lane)


class SkipReports:
    """The shard reader's ``on_skip`` callback: holds its reports until the chunk being read takes them."""

    def __init__(self) -> None:
        self._pending: list[SkippedDocument] = []

    def add(self, ref: ShardRef, row: int, reason: str, error: DatasetError | None = None) -> None:
        self._pending.append(SkippedDocument(ref=ref, row=row, reason=reason, error=error))

    def take(self) -> tuple[SkippedDocument, ...]:
        taken = tuple(self._pending)
        self._pending.clear()
        return taken
