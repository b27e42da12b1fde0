"""Where a rank stands in training, and which of its microbatches a DataLoader worker yields.

A rank hands out microbatch ``(step, index)`` for ``index`` in ``[0, A)`` of every step, in order
(``zephon.executor.geometry``; ``A`` is the gradient accumulation). ``Progress`` counts what was handed out:
``step`` global steps done and ``microbatch`` microbatches into the current one — the two numbers a checkpoint
records (``zephon.executor.state``). It moves past a microbatch when handing it out, so a state taken after a
batch is yielded resumes at the next one.

Under a ``DataLoader`` with ``N`` workers, each worker runs its own rank runner and yields only the
microbatches whose running number ``step · A + index`` is ``≡ w (mod N)``; the DataLoader's in-order fetching
restores the rank's order. Every worker still advances through all microbatches (an estimated plan must pack
every row to reach the next one).

Example, ``A`` = 2, 2 workers: microbatches (0, 0), (0, 1), (1, 0), (1, 1) have running numbers 0, 1, 2, 3, so
worker 0 yields (0, 0) and (1, 0), worker 1 yields (0, 1) and (1, 1). After (0, 1) is handed out, the state is
``step`` 1, ``microbatch`` 0.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class MicrobatchAt:
    """A microbatch's place in training: ``index`` (0 ≤ index < A) of global ``step`` on this rank."""

    step: int
    index: int


@dataclass(kw_only=True, slots=True)
class Progress:
    """Microbatches handed out so far (``step``, ``microbatch``) and this DataLoader worker's share of them.

    Attributes:
        accumulation: microbatches per step on this rank (A).
        step: global steps done.
        microbatch: microbatches handed out in the current step.
        worker: this DataLoader worker's index (0 without a DataLoader).
        workers: DataLoader workers of this rank (1 without a DataLoader).
    """

    accumulation: int
    step: int = 0
    microbatch: int = 0
    worker: int = 0
    workers: int = 1

    def advance(self) -> MicrobatchAt:
        """The microbatch to hand out now; moves past it (the state reflects what was handed out)."""
        at = MicrobatchAt(step=self.step, index=self.microbatch)
        self.microbatch += 1
        if self.microbatch == self.accumulation:
            self.step, self.microbatch = self.step + 1, 0
        return at

    def mine(self, at: MicrobatchAt) -> bool:
        """Whether this DataLoader worker yields the microbatch ``at``."""
        return (at.step * self.accumulation + at.index) % self.workers == self.worker
