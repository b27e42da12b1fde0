"""Where a rank stands in training: the microbatches it has handed out.

A rank hands out microbatch ``(step, index)`` for ``index`` in ``[0, A)`` of every step, in order
(``zephon.executor.geometry``; ``A`` is the gradient accumulation). ``Progress`` counts what was handed out:
``step`` global steps done and ``microbatch`` microbatches into the current one — the two numbers a checkpoint
records (``zephon.executor.state``). It moves past a microbatch when handing it out, so a state taken after a
batch is yielded resumes at the next one.

A microbatch's *running number* is ``step · A + index``. Under a ``DataLoader`` each worker runs its own rank
runner and advances through every microbatch; which rows of which microbatches it builds and yields is its
``WorkerShare`` (``zephon.executor.worker_share``).

Example, ``A`` = 2: microbatches (0, 0), (0, 1), (1, 0), (1, 1) have running numbers 0, 1, 2, 3. After (0, 1) is
handed out, the state is ``step`` 1, ``microbatch`` 0 (running number 2).
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
    """Microbatches handed out so far: ``step`` global steps done, ``microbatch`` microbatches into the current one.

    Attributes:
        accumulation: microbatches per step on this rank (A).
        step: global steps done.
        microbatch: microbatches handed out in the current step.
    """

    accumulation: int
    step: int = 0
    microbatch: int = 0

    @property
    def running(self) -> int:
        """The running number of the next microbatch: ``step · A + microbatch``."""
        return self.step * self.accumulation + self.microbatch

    def advance(self) -> MicrobatchAt:
        """The microbatch to hand out now; moves past it (the state reflects what was handed out)."""
        at = MicrobatchAt(step=self.step, index=self.microbatch)
        self.microbatch += 1
        if self.microbatch == self.accumulation:
            self.step, self.microbatch = self.step + 1, 0
        return at
