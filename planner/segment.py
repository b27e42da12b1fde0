"""Where a continued plan's new segment starts: what its parent's prefix already placed.

A continuation (``zephon.planner.continuation.child``) keeps its parent's first ``position`` documents and lays out
the rest from the new configuration. The layout (``zephon.planner.layout``, ``zephon.planner.token_mix``) then
starts from ``SegmentStart`` instead of from nothing:

* each dataset's reader skips the ``documents[i]`` documents the prefix read (its epoch order continues, so
  epochs and repetition continue and nothing is read twice);
* positions, token offsets (exact plans) and the deal's unit count (estimated plans) continue from the prefix;
* the budget is the whole run's: ``num_documents`` / ``num_tokens`` less what the prefix placed, ``epochs=E``
  passes counted with the documents (tokens) the prefix read; phase starts stay positions/tokens of the run.

Example: a prefix of 100 documents, 60 of ``a`` and 40 of ``b``, 51,200 tokens; a new config with
``num_documents = 300`` lays out 200 more positions from 100, ``a``'s reader starting at its 61st document.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class SegmentStart:
    """What the kept prefix of a continued plan placed (all counts ≥ 0; tuples per dataset of the new config,
    0 for datasets the parent did not have)."""

    #: Documents of the prefix: the new segment's first position.
    position: int
    #: Tokens of the prefix (exact or estimated; 0 without token counts): the first new token offset.
    tokens: int
    #: Units the deal counted over the prefix (``zephon.planner.lane_dealing``; estimated plans).
    units: int
    #: Per dataset: documents the prefix read.
    documents: tuple[int, ...]
    #: Per dataset: tokens the prefix read (zeros without token counts).
    dataset_tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if min(self.position, self.tokens, self.units, *self.documents, *self.dataset_tokens, 0) < 0:
            raise ValueError(f"a segment start counts what was placed, so every count must be >= 0, got {self}")
        if sum(self.documents) != self.position:
            raise ValueError(f"a segment start's documents must add up to its position {self.position}, got {self}")
