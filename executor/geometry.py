"""Global batches and which sequences each data-parallel rank produces.

Sequences are numbered globally, ``j = 0, 1, 2, …``, in the order the plan fixes. A global step is ``G``
sequences: step ``s`` is ``j ∈ [s·G, (s+1)·G)`` (``zephon.executor.step_arithmetic``, the one definition of
steps, sequences, lanes and tokens). Rank ``r`` of ``D`` takes the sequences with ``j ≡ r (mod D)``,
in increasing order, and yields them as ``A = G / (B·D)`` microbatches of ``B`` (gradient accumulation).
The union over ranks of step ``s`` is the same ``G`` sequences, in the same order, for every ``D`` that
divides ``G`` — elastic determinism.

Estimated plans pack at train time inside ``L`` lanes (``zephon.planner.lane_dealing``): sequence ``j`` is row
``j // L`` of lane ``j % L`` (``step_arithmetic.lane_row``, ``lane_of``). Rank ``r`` then only packs the lanes
``ℓ ≡ r (mod D)``, which requires ``D | L``. By default ``L = G`` (``packing_lanes``): one lane per row of a
step, so every ``D`` dividing ``G`` owns ``G / D`` whole lanes and tokenizes only its own documents. A plan
made with ``lanes=N`` fixes ``L = N``. Exact plans fix every sequence, so any ``D`` dividing ``G`` works.

Example: G = 8, B = 2, D = 2 (A = 2). Step 1 is j = 8…15; rank 0 yields [8, 10] then [12, 14], rank 1
yields [9, 11] then [13, 15]. With D = 1 (A = 4) the single rank yields [8, 9], [10, 11], [12, 13], [14, 15]:
the same sequences in the same step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephon.errors import ConfigError
from zephon.executor.step_arithmetic import step_sequences


@dataclass(frozen=True, kw_only=True, slots=True)
class Geometry:
    """Batch sizes and this rank's place among the data-parallel ranks.

    Attributes:
        microbatch: sequences per yielded batch (B).
        global_batch: sequences per optimizer step over all ranks (G).
        dp_size: data-parallel ranks (D). dp_rank: this rank (r).
        lanes: packing lanes of an estimated plan (L), None for exact plans.
    """

    microbatch: int
    global_batch: int
    dp_size: int
    dp_rank: int
    lanes: int | None

    def __post_init__(self) -> None:
        if not 0 <= self.dp_rank < self.dp_size:
            raise ConfigError(f"dp_rank must be in [0, {self.dp_size}), got {self.dp_rank} — check RANK / dp_rank")
        if self.global_batch % self.dp_size:
            raise ConfigError(
                f"dp_size (WORLD_SIZE) must divide the global batch of {self.global_batch} sequences, got "
                f"{self.dp_size} — run on one of {divisors(self.global_batch)} ranks, or make the global batch a "
                f"multiple of {self.dp_size}: .batch(global_batch_size=...) in Python (and global_batch_size of "
                "the phases in a CONFIG file)"
            )
        if self.global_batch % (self.microbatch * self.dp_size):
            raise ConfigError(
                f"global batch must be a multiple of microbatch_size × dp_size = {self.microbatch} × "
                f"{self.dp_size}, got {self.global_batch} — pass .batch(global_batch_size=...) divisible by "
                f"{self.microbatch * self.dp_size}"
            )
        if self.lanes is not None and self.lanes % self.dp_size:
            raise ConfigError(
                f"dp_size must divide the plan's {self.lanes} packing lanes, got {self.dp_size} — re-plan without "
                "fixed lanes (leave StaticMixtureWorkSource(lanes=...) and the CONFIG key `lanes` unset: one lane "
                f"per row of the global batch), or with lanes a multiple of {self.dp_size}"
            )

    @classmethod
    def for_plan(
        cls, *, microbatch: int, global_batch: int, dp_size: int, dp_rank: int, exact: bool, plan_lanes: int | None
    ) -> Geometry:
        """The geometry of a run of a plan: its lanes by ``packing_lanes``."""
        lanes = packing_lanes(exact=exact, plan_lanes=plan_lanes, global_batch=global_batch)
        return cls(microbatch=microbatch, global_batch=global_batch, dp_size=dp_size, dp_rank=dp_rank, lanes=lanes)

    @property
    def accumulation(self) -> int:
        """Microbatches per rank per step (A)."""
        return self.global_batch // (self.microbatch * self.dp_size)

    @property
    def my_lanes(self) -> list[int]:
        assert self.lanes is not None
        return [lane for lane in range(self.lanes) if lane % self.dp_size == self.dp_rank]

    def microbatch_sequences(self, step: int, index: int) -> np.ndarray:
        """Global sequence ids of microbatch ``index`` (0 ≤ index < A) of ``step`` on this rank."""
        step_start, _ = step_sequences(step, self.global_batch)
        first = step_start + self.dp_rank + index * self.microbatch * self.dp_size
        return first + self.dp_size * np.arange(self.microbatch, dtype=np.int64)

    def block_sequences(self, running: int, count: int) -> np.ndarray:
        """``(count, B)``: row ``k`` is ``microbatch_sequences`` of this rank's microbatch ``running + k`` (``step·A +
        index``), all in one call."""
        step, index = np.divmod(np.arange(running, running + count, dtype=np.int64), self.accumulation)
        first = step * self.global_batch + self.dp_rank + index * (self.microbatch * self.dp_size)
        return first[:, None] + self.dp_size * np.arange(self.microbatch, dtype=np.int64)


def packing_lanes(*, exact: bool, plan_lanes: int | None, global_batch: int) -> int | None:
    """The lanes a run packs: None for an exact plan; the plan's fixed lanes; else one per row of a step (G)."""
    if exact:
        return None
    return plan_lanes if plan_lanes is not None else global_batch


def divisors(n: int, shown: int = 12) -> str:
    """The divisors of ``n``, at most ``shown`` of them (then "…"), for error messages."""
    found = [d for d in range(1, n + 1) if n % d == 0] if n <= 1 << 20 else [1, n]
    return ", ".join(map(str, found[:shown])) + (", …" if len(found) > shown else "")
