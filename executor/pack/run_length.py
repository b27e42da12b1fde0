"""How many global steps a run of an estimated plan has: one number, known before the first batch, the same
on every rank and at every data-parallel size.

An exact plan knows its sequences. An estimated plan packs at train time, and lane ``ℓ``'s real tokens are
known only to the rank that tokenizes them; ranks that each stopped when their own lanes ran out would end on
different steps (and a collective per step to agree is what a data loader must not cost). So the end is
computed from what every rank can read alike:

* ``U_ℓ``, the planned units of lane ``ℓ`` (``zephon.planner.lane_dealing``: estimated tokens, or a shard's
  bytes per row), and ``n_ℓ`` its documents — one pass over two columns of samples.parquet;
* ``r``, tokens per unit, measured by tokenizing the plan's first ``CALIBRATION`` documents (of the shards a
  run opens first: ``(shuffle window + 1) × datasets``) — the same
  documents on every rank, so the same numbers (a bounded overhead: at most ``CALIBRATION`` documents per rank
  beyond its own lanes', whatever the plan's size) — and ``σ``, the spread of a document's real tokens about
  ``r·units`` (small when the plan has per-document token estimates, large when it only knows a shard's bytes
  per row);
* the margin of lane ``ℓ``: three standard deviations of its real tokens, from the lane's own documents and
  the calibration's error, ``m_ℓ = max(MIN_MARGIN, 3·√(n_ℓ·σ² / (r·U_ℓ)² + K·σ² / (r·U_K)²))`` (``K``
  calibration documents of ``U_K`` units).

Then, with ``T_ℓ = r·U_ℓ``, rows of ``W`` tokens, ``L`` lanes and a global batch of ``G`` (sequence ``j`` is row
``j // L`` of lane ``j % L``; with the default ``L = G`` a step is one row of every lane):

* ``drop_last=False`` (the default, no data lost): ``steps = ⌈L·R / G⌉`` with ``R = max_ℓ ⌈(1 + m_ℓ)·T_ℓ / W⌉``
  — every lane is used up by then; a lane that runs out earlier yields padded rows (length 0, labels
  ignored), as before;
* ``drop_last=True`` (full rows only): ``steps = ⌊L·R / G⌋`` with ``R = min_ℓ ⌊(1 − m_ℓ)·T_ℓ / W⌋`` — every lane
  still fills its rows.

When the calibration's documents are every document of the plan (``Calibration.whole``: a plan of at most
``CALIBRATION`` documents in the shards a run opens first), each lane's real tokens are known and the end is
exact, with no margin (``whole_steps``).

Every rank yields exactly ``steps`` steps. The bound is a measured estimate, not a proof: a lane whose real
tokens fall outside it gives a short row before the end (``drop_last=True``) or keeps tokens past the end
(``drop_last=False``); either is counted in ``RunStats.short_rows`` / ``lanes_cut``, never silent.

Example: 2 lanes (G = 2) of 400 and 360 documents with 100 000 and 95 000 estimated tokens (r·U), W = 1 000,
σ = 20 tokens, K = 512 calibration documents of 50 000 tokens: the calibration term is 512·400 / (5·10^4)² =
8.2·10^-5, lane 0's own 400·400 / 10^10 = 1.6·10^-5, so m_0 = 3·√(9.8·10^-5) = 0.030 and lane 0 needs
⌈1.030 · 100⌉ = 103 rows (lane 1: ⌈1.030 · 95⌉ = 98): ``drop_last=False`` runs 103 steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephon.errors import DatasetError
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.step_arithmetic import steps_in
from zephon.plan.bundle import read_row_group
from zephon.plan.format import deal_column

#: Documents at the start of the plan that every rank tokenizes to measure tokens per unit.
CALIBRATION = 2048
#: The smallest margin (1 %), whatever the measured spread.
MIN_MARGIN = 0.01


@dataclass(frozen=True, kw_only=True, slots=True)
class TokensPerUnit:
    """What the calibration measured: ``ratio`` (r), the spread ``residual`` (σ, tokens) of a document's real
    tokens about ``ratio × units``, and the ``documents`` (K) and ``units`` (U_K) it measured them on."""

    ratio: float
    residual: float
    documents: int
    units: float

    @classmethod
    def measure(cls, real: np.ndarray, units: np.ndarray, *, field: str = "text") -> TokensPerUnit:
        """From each calibration document's real tokens and planned units; documents that all tokenized to
        nothing are refused (``nothing_to_measure``, naming the text ``field``)."""
        real, units = real.astype(np.float64), units.astype(np.float64)
        if len(real) and not real.any():
            raise nothing_to_measure(len(real), field)
        if not len(real) or not units.sum():
            return cls(ratio=0.0, residual=0.0, documents=0, units=0.0)
        ratio = float(real.sum()) / float(units.sum())
        residual = float(np.sqrt(np.mean((real - ratio * units) ** 2)))
        return cls(ratio=ratio, residual=residual, documents=len(real), units=float(units.sum()))


def nothing_to_measure(documents: int, field: str) -> DatasetError:
    """The calibration's ``documents`` all tokenized to nothing (empty texts, no BOS or EOS): ``r`` would be 0 and
    the run 0 steps — nothing handed out, silently; refused instead."""
    return DatasetError(
        f"an estimated plan's first {documents} documents must hold tokens to measure the run's length on, got 0 "
        "tokens (empty texts with no BOS or EOS added, or a token store's documents of no id) — check the text field "
        f"{field!r} and the data, or plan with exact_tokens=True (its documents are counted, not measured)"
    )


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
            table = read_row_group(
                reader, file.path, g, [deal_column(plan.manifest.format_version), "tokens", "shard_id"]
            )
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
    """The plan's first documents: where they live (``shard_id``, ``row``), their planned ``units`` and ``deal``;
    ``whole``: they are every document of the plan (none left out), so the calibration knows each lane's tokens."""

    shard_id: np.ndarray
    row: np.ndarray
    units: np.ndarray
    deal: np.ndarray
    whole: bool = False


def calibration_documents(plan: PlanBundle, count: int | None = None, *, max_shards: int) -> Calibration:
    """The plan's first ``count`` documents (``CALIBRATION``; fewer in a smaller plan), keeping those of its
    first ``max_shards`` distinct shards only — the shards a run opens first, so a bounded shard cache holds
    them and the run reads them again from it, never downloading a shard twice. ``whole``: they are every
    document of the plan."""
    count = CALIBRATION if count is None else count
    per_shard = document_units(plan)
    parts: list[tuple[np.ndarray, ...]] = []
    got = 0
    deal = deal_column(plan.manifest.format_version)
    for file in plan.checked.samples:
        reader = file.open()
        for g in range(reader.metadata.num_row_groups):
            if got >= count:
                break
            table = read_row_group(reader, file.path, g, ["shard_id", "row", "tokens", deal]).slice(0, count - got)
            sid, tokens = table.column(0).to_numpy(), table.column(2)
            units = tokens.to_numpy().astype(np.int64) if tokens.null_count == 0 else per_shard[sid]
            parts.append((sid, table.column(1).to_numpy(), units, table.column(3).to_numpy()))
            got += len(table)
    if not parts:
        empty = np.zeros(0, np.int64)
        return Calibration(shard_id=empty, row=empty, units=empty, deal=empty, whole=True)
    shard_id, row, units, deals = (np.concatenate([p[k] for p in parts]) for k in range(4))
    _, first = np.unique(shard_id, return_index=True)
    opened = shard_id[np.sort(first)[:max_shards]]
    keep = np.flatnonzero(np.isin(shard_id, opened))
    whole = len(keep) == plan.num_documents  # every document of the plan: each lane's tokens are known
    return Calibration(shard_id=shard_id[keep], row=row[keep], units=units[keep], deal=deals[keep], whole=whole)


def whole_steps(lane_tokens: np.ndarray, max_length: int, *, global_batch: int, drop_last: bool) -> int:
    """Global steps when every lane's real tokens are known (the calibration read the whole plan: a plan of at
    most ``CALIBRATION`` documents): no margin — ``drop_last=False``, the rows that hold the longest lane;
    ``drop_last=True``, the full rows of the shortest. A small plan ran ``3σ`` of estimated steps past its data:
    the README's demo plan of 1,200 documents ended on 5 steps of padding alone. Example: lanes of 5,000 and 3,100
    tokens, rows of 1,000, G = 2: 5 steps (drop_last: 3)."""
    if not len(lane_tokens):
        return 0
    rows = int((lane_tokens // max_length).min()) if drop_last else int((-(-lane_tokens // max_length)).max())
    return steps_in(len(lane_tokens) * rows, global_batch, drop_last=drop_last)


def estimated_steps(
    lanes: LaneUnits,
    measured: TokensPerUnit,
    max_length: int,
    *,
    global_batch: int,
    drop_last: bool,
    known: np.ndarray | None = None,
) -> int:
    """Global steps of the run (see the module docstring); ``known``: each lane's real tokens, when the
    calibration read the whole plan (``whole_steps``)."""
    if known is not None:
        return whole_steps(known, max_length, global_batch=global_batch, drop_last=drop_last)
    if not len(lanes.units) or measured.ratio <= 0:
        return 0
    tokens = lanes.units * measured.ratio
    var = measured.residual**2
    own = np.divide(lanes.documents * var, tokens**2, out=np.zeros_like(tokens), where=tokens > 0)
    calibration = measured.documents * var / (measured.ratio * measured.units) ** 2
    margin = np.maximum(MIN_MARGIN, 3 * np.sqrt(own + calibration))
    num_lanes = len(lanes.units)
    if drop_last:  # sequences j < L·R are full rows (row j // L of lane j % L)
        rows = int(np.floor(np.maximum(0.0, 1 - margin) * tokens / max_length).min())
    else:
        rows = int(np.ceil((1 + margin) * tokens / max_length).max())  # every lane used up within R rows
    return steps_in(num_lanes * rows, global_batch, drop_last=drop_last)  # R rows of L lanes: L·R sequences
