"""How many global steps a run of an estimated plan has: one number, known before the first batch, the same
on every rank and at every data-parallel size.

An exact plan knows its sequences. An estimated plan packs at train time, and lane ``ℓ``'s real tokens are
known only to the rank that tokenizes them; ranks that each stopped when their own lanes ran out would end on
different steps (and a collective per step to agree is what a data loader must not cost). So the end is
computed from what every rank can read alike:

* ``U_ℓ``, the planned units of lane ``ℓ`` (``zephon.planner.lane_dealing``: estimated tokens, or a shard's
  bytes per row), and ``n_ℓ`` its documents — one pass over two columns of samples.parquet;
* ``r``, tokens per unit, measured by tokenizing the plan's first ``CALIBRATION`` documents — the same
  documents on every rank, so the same ``r`` (a bounded overhead: at most ``CALIBRATION`` documents per rank
  beyond its own lanes', whatever the plan's size);
* the margin ``m = max(MIN_MARGIN, 3 / sqrt(min n_ℓ))``: three standard deviations of a lane's length when
  document lengths vary about as much as their mean (coefficient of variation 1).

Then, with ``T_ℓ = r·U_ℓ`` and rows of ``W`` tokens:

* ``drop_last=False`` (the default, no data lost): ``steps = ⌈(1 + m)·max_ℓ T_ℓ / W⌉`` — every lane is used up
  by then; a lane that runs out earlier yields padded rows (length 0, labels ignored), as before;
* ``drop_last=True`` (full rows only): ``steps = ⌊(1 − m)·min_ℓ T_ℓ / W⌋`` — every lane still fills its row.

Every rank yields exactly ``steps`` steps. The bound is a measured estimate, not a proof: a lane whose real
tokens fall outside the margin gives a short row before the end (``drop_last=True``) or keeps tokens past the
end (``drop_last=False``); either is counted in ``RunStats.lanes_cut`` / ``short_rows``, never silent.

Example: 2 lanes of 400 and 360 documents, 400 000 and 380 000 units, r = 0.25 tokens per unit, W = 1 000:
T = 100 000 and 95 000 tokens, m = max(0.02, 3/√360) = 0.158, so ``drop_last=False`` runs ⌈1.158 · 100⌉ = 116
steps and ``drop_last=True`` ⌊0.842 · 95⌋ = 79.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zephon.executor.plan_reader import PlanBundle
from zephon.plan.bundle import read_row_group

#: Documents at the start of the plan that every rank tokenizes to measure tokens per unit.
CALIBRATION = 512
#: The smallest margin: the calibration's own error on large plans.
MIN_MARGIN = 0.02


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneUnits:
    """Per lane (index ``ℓ``): planned units and documents of an estimated plan run with ``len(units)`` lanes."""

    units: np.ndarray
    documents: np.ndarray


def document_units(plan: PlanBundle) -> np.ndarray:
    """Units of a document of each shard when the plan has no token counts, by global shard id:
    ``ceil(bytes / rows)``, at least 1 (the planner deals by the same units)."""
    by_id = sorted(plan.shards, key=lambda s: s.shard_id)
    return np.array([max(1, -(-s.bytes // s.rows)) if s.rows else 1 for s in by_id], dtype=np.int64)


def lane_units(plan: PlanBundle, lanes: int) -> LaneUnits:
    """``LaneUnits`` of ``plan`` with ``lanes`` lanes: one pass over ``deal``, ``tokens`` and ``shard_id``."""
    units = np.zeros(lanes, dtype=np.float64)
    documents = np.zeros(lanes, dtype=np.int64)
    per_shard = document_units(plan)
    for file in plan.checked.samples:
        reader = file.open()
        for g in range(reader.metadata.num_row_groups):
            table = read_row_group(reader, file.path, g, ["deal", "tokens", "shard_id"])
            lane = table.column(0).to_numpy() % lanes
            tokens = table.column(1)
            if tokens.null_count == 0:
                size = tokens.to_numpy().astype(np.int64)
            else:
                size = per_shard[table.column(2).to_numpy()]
            units += np.bincount(lane, weights=size, minlength=lanes)
            documents += np.bincount(lane, minlength=lanes)
    return LaneUnits(units=units, documents=documents)


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """The plan's first documents: where they live (``shard_id``, ``row``) and their planned ``units``."""

    shard_id: np.ndarray
    row: np.ndarray
    units: np.ndarray


def calibration_documents(plan: PlanBundle, count: int = CALIBRATION) -> Calibration:
    """The plan's first ``count`` documents (fewer in a smaller plan)."""
    per_shard = document_units(plan)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    got = 0
    for file in plan.checked.samples:
        reader = file.open()
        for g in range(reader.metadata.num_row_groups):
            if got >= count:
                break
            table = read_row_group(reader, file.path, g, ["shard_id", "row", "tokens"]).slice(0, count - got)
            sid, tokens = table.column(0).to_numpy(), table.column(2)
            units = tokens.to_numpy().astype(np.int64) if tokens.null_count == 0 else per_shard[sid]
            parts.append((sid, table.column(1).to_numpy(), units))
            got += len(table)
    if not parts:
        return Calibration(shard_id=np.zeros(0, np.int32), row=np.zeros(0, np.int32), units=np.zeros(0, np.int64))
    return Calibration(
        shard_id=np.concatenate([p[0] for p in parts]),
        row=np.concatenate([p[1] for p in parts]),
        units=np.concatenate([p[2] for p in parts]),
    )


def estimated_steps(lanes: LaneUnits, tokens_per_unit: float, max_length: int, *, drop_last: bool) -> int:
    """Global steps of the run (see the module docstring)."""
    if not len(lanes.units) or tokens_per_unit <= 0:
        return 0
    tokens = lanes.units * tokens_per_unit
    fewest = int(lanes.documents.min())
    margin = max(MIN_MARGIN, 3 / math.sqrt(fewest)) if fewest else 1.0
    if drop_last:
        return max(0, math.floor((1 - margin) * float(tokens.min()) / max_length))
    return math.ceil((1 + margin) * float(tokens.max()) / max_length)
