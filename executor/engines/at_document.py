"""Errors about one document of an encoded batch, which the caller locates.

The encoder sees a batch of texts, not where they come from; an error it finds about one of them carries the
document's ``index`` in the batch. Each caller that slices or reorders a batch re-indexes the error (``at``:
"document 5 of a batch"), and the one that knows the rows names it (``located``: dataset, shard and row), so the
user reads one line that points at the row. Two such errors exist: ``EngineMismatch`` (the spot check,
``zephon.executor.engines.spot_check``) and ``UnencodableText`` (a lone surrogate,
``zephon.executor.encode.surrogates``). Example: an ``EngineMismatch`` at document 3 of a slice that starts at
document 1,024 of the chunk → ``at(1027)`` → ``located(ref, 88_000)`` for the row the chunk's document 1,027 is.
"""

from __future__ import annotations

from typing import Self

from zephon.errors import ZephonError
from zephon.plan.records import ShardRef


class AtDocument(ZephonError):
    """An error about document ``index`` of a batch; ``relabel`` words it for another place (subclasses)."""

    index: int

    def relabel(self, where: str, index: int) -> Self:
        raise NotImplementedError

    def at(self, index: int) -> Self:
        """The same error at another index (the caller's order of the batch)."""
        return self.relabel(f"document {index} of a batch", index)

    def located(self, ref: ShardRef, row: int) -> Self:
        """The same error, its message naming the document: dataset, shard and row."""
        return self.relabel(f"dataset {ref.dataset!r}: shard {ref.uri} row {row}", self.index)
