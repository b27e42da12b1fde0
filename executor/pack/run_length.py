"""How many global steps a run of an estimated plan has: one number, known before the first batch, the same
on every rank and at every data-parallel size.

An exact plan knows its sequences. An estimated plan packs at train time, and lane ``ℓ``'s real tokens are
known only to the rank that tokenizes them; ranks that each stopped when their own lanes ran out would end on
different steps (and a collective per step to agree is what a data loader must not cost). So the end is
computed from what every rank can read alike:

* ``U_ℓd``, the planned units of lane ``ℓ`` from dataset ``d`` (``zephon.planner.lane_dealing``: estimated
  tokens, or a shard's bytes per row), ``Q_ℓd`` the sum of its documents' units squared — one pass over four
  columns of samples.parquet;
* ``r_d``, tokens per unit, measured by tokenizing the calibration's documents
  (``zephon.executor.pack.calibration``: the plan's first 2^23 planned units or more, of the shards a run opens
  first, and the first documents of any dataset those hold few of) — the same documents on every rank, so the same
  numbers (a bounded overhead: at most about 2^25 tokens per rank beyond its own lanes', whatever the plan's size) —
  and ``s_d``, the spread of a document's real tokens about ``r_d·units`` relative to that estimate (small when the
  plan has per-document token estimates, large when it only knows a shard's bytes per row). A document's spread is
  taken to grow with its size: a lane holding one file of 10^5 tokens may be off by a fifth of it, which a spread
  averaged over mostly short documents missed (a lane cut at 64 lanes on real text). A dataset with fewer than
  ``MIN_STRATUM`` calibration documents (one the plan holds fewer of) takes the pooled ratio and spread of all of
  them. Measured per dataset because the first shards' mix is not the plan's (long documents are few documents), and
  one pooled ratio carries that mix;
* the margin of lane ``ℓ``: ``z_L`` standard deviations of its own documents' spread about ``T_ℓ = Σ_d r_d·U_ℓd``
  and three of the calibration's error, ``m_ℓ = max(MIN_MARGIN, √(z_L²·Σ_d s_d²·r_d²·Q_ℓd + 9·Σ_s (Σ_{d∈s}
  r_d·U_ℓd)²·K_s·σ_s² / (r_s·U_Ks)²) / T_ℓ)``, where ``s`` runs over the ratios measured (one a dataset, and the
  pooled one shared by the datasets that took it; ``K_s`` documents of ``U_Ks`` units and RMS spread ``σ_s``).
  The calibration's error moves every lane alike, so 3σ covers it once; the lanes' own spreads are ``L``
  chances to fall outside, so ``z_L = Φ⁻¹(1 − 0.00135 / L)`` (``lanes_quantile``): all ``L`` lanes stay under it
  as often as one lane stays under 3σ. With 3σ each, one lane of 256 fell outside on real text (a 96 M-token
  mixture at ``G = 256``).

Why the units: the calibration term is the ratio's own error and does not shrink with the plan, so on a long run
it is the margin. On real text (code files of 10^5 tokens among short documents; twenty-seventh session) 2,048
documents held 155 K tokens and measured the ratio to ±7 % (3σ: 21 %): a 96 M-token mixture ran 7,246 steps where
its longest lane held 5,947 rows. On 2^23 units, ratios by dataset: ±1.4 %, 6,219 steps.

Then, with rows of ``W`` tokens, ``L`` lanes and a global batch of ``G`` (sequence ``j`` is row
``j // L`` of lane ``j % L``; with the default ``L = G`` a step is one row of every lane):

* ``drop_last=False`` (the default, no data lost): ``steps = ⌈L·R / G⌉`` with ``R = max_ℓ ⌈(1 + m_ℓ)·T_ℓ / W⌉``
  — every lane is used up by then; a lane that runs out earlier yields padded rows (length 0, labels
  ignored), as before;
* ``drop_last=True`` (full rows only): ``steps = ⌊L·R / G⌋`` with ``R = min_ℓ ⌊(1 − m_ℓ)·T_ℓ / W⌋`` — every lane
  still fills its rows.

When the calibration's documents are every document of the plan (``Calibration.whole``: a plan of at most
2,048 documents, or of fewer than 2^23 units, of local files or all in the shards a run opens first), each
lane's real tokens are known and the end is exact, with no margin (``whole_steps``).

Every rank yields exactly ``steps`` steps. The bound is a measured estimate, not a proof: a lane whose real
tokens fall outside it gives a short row before the end (``drop_last=True``) or keeps tokens past the end
(``drop_last=False``); either is counted in ``RunStats.short_rows`` / ``lanes_cut``, never silent.

Example, one dataset: 2 lanes (G = 2) of 400 and 380 documents of 250 estimated tokens (r·U = 100 000 and 95 000;
Q = 2.5·10^7 and 2.375·10^7), W = 1 000; the calibration's K = 512 documents of 50 000 units gave σ = 20 tokens,
s = 0.2048: its term is 512·400 / (5·10^4)² = 8.2·10^-5, lane 0's own 0.2048²·2.5·10^7 / 10^10 = 1.05·10^-4 and
z_2 = 3.21, so m_0 = √(3.21²·1.05·10^-4 + 9·8.2·10^-5) = 0.0426 and lane 0 needs ⌈104.26⌉ = 105 rows (lane 1:
⌈1.0433 · 95⌉ = 100): ``drop_last=False`` runs 105 steps; ``drop_last=True`` 90 (⌊0.9567 · 95⌋).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from zephon.errors import DatasetError, ShortRunWarning, warn
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.step_arithmetic import steps_in
from zephon.plan.bundle import read_row_group
from zephon.plan.format import deal_column

#: Calibration documents a dataset needs for a ratio of its own (fewer: the pooled ratio; ``calibration``).
MIN_STRATUM = 64
#: The smallest margin (1 %), whatever the measured spread.
MIN_MARGIN = 0.01
#: The chance that a normal variable exceeds its mean by 3σ: what the margin allows for all lanes together.
TAIL = 0.0013499
#: The share of a run's row slots expected to be padding past which ``warn_padding`` says so...
PADDING_WARNING = 0.25
#: ... and of its tokens expected left out with ``drop_last`` (which, on an exact plan, leaves out one step at most).
DROPPED_WARNING = 0.10
#: Set in a ``Pipeline.dataloader()`` worker process: its loader warns of the lanes cut, once for every worker.
LOADER_WARNS = False


@dataclass(frozen=True, kw_only=True, slots=True)
class TokensPerUnit:
    """What the calibration measured on some documents: ``ratio`` (r); ``residual`` (σ, tokens), the root mean
    square of a document's real tokens about ``r × units``; ``relative`` (s), that spread relative to each
    document's estimate, ``√(Σ (real − r·u)² / Σ (r·u)²)`` — a document's spread is taken to scale with its size;
    and the ``documents`` (K) and ``units`` (U_K) it measured them on."""

    ratio: float
    residual: float
    relative: float
    documents: int
    units: float

    @classmethod
    def measure(cls, real: np.ndarray, units: np.ndarray) -> TokensPerUnit:
        """From each calibration document's real tokens and planned units."""
        real, units = real.astype(np.float64), units.astype(np.float64)
        if not len(real) or not units.sum():
            return cls(ratio=0.0, residual=0.0, relative=0.0, documents=0, units=0.0)
        ratio = float(real.sum()) / float(units.sum())
        squares = float(np.sum((real - ratio * units) ** 2))
        relative = float(np.sqrt(squares / np.sum((ratio * units) ** 2))) if ratio > 0 else 0.0
        residual = float(np.sqrt(squares / len(real)))
        return cls(ratio=ratio, residual=residual, relative=relative, documents=len(real), units=float(units.sum()))

    @property
    def error(self) -> float:
        """The ratio's relative variance, ``K·σ² / (r·U_K)²`` (0 without documents)."""
        return self.documents * self.residual**2 / (self.ratio * self.units) ** 2 if self.ratio > 0 else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Ratios:
    """Tokens per unit by dataset (post-stratified): ``by_dataset[d]`` is dataset ``d``'s own measurement when the
    calibration held at least ``MIN_STRATUM`` of its documents, else ``pooled`` (every calibration document)."""

    pooled: TokensPerUnit
    by_dataset: tuple[TokensPerUnit, ...]

    @classmethod
    def measure(
        cls,
        real: np.ndarray,
        units: np.ndarray,
        datasets: np.ndarray,
        num_datasets: int,
        *,
        field: str = "text",
        kept: int | None = None,
    ) -> Ratios:
        """From each calibration document's real tokens (0 for one the run leaves out), planned units and dataset
        id; ``kept`` documents (default: all) that all tokenized to nothing are refused (``nothing_to_measure``,
        naming the text ``field``)."""
        kept = len(real) if kept is None else kept
        if kept and not real.any():
            raise nothing_to_measure(kept, field)
        pooled = TokensPerUnit.measure(real, units)
        counts = np.bincount(datasets, minlength=num_datasets) if len(datasets) else np.zeros(num_datasets, np.int64)
        own = [
            TokensPerUnit.measure(real[datasets == d], units[datasets == d]) if counts[d] >= MIN_STRATUM else pooled
            for d in range(num_datasets)
        ]
        return cls(pooled=pooled, by_dataset=tuple(m if m.ratio > 0 else pooled for m in own))

    @classmethod
    def single(cls, measured: TokensPerUnit, num_datasets: int = 1) -> Ratios:
        """One ratio for every dataset."""
        return cls(pooled=measured, by_dataset=(measured,) * num_datasets)


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
    """Per lane ``ℓ`` and dataset ``d`` (arrays of shape ``(lanes, datasets)``) of an estimated plan run with
    ``len(units)`` lanes: planned ``units``, ``documents``, and ``squares``, the sum of each document's units squared
    (what the lane's own spread grows with)."""

    units: np.ndarray
    documents: np.ndarray
    squares: np.ndarray


def document_units(plan: PlanBundle) -> np.ndarray:
    """Units of a document of each shard when the plan has no token counts, by global shard id:
    ``ceil(bytes / rows)``, at least 1 (the planner deals by the same units)."""
    by_id = sorted(plan.shards, key=lambda s: s.shard_id)
    return np.array([max(1, -(-s.bytes // s.rows)) if s.rows else 1 for s in by_id], dtype=np.int64)


class PlanRows(NamedTuple):
    """One row group of samples.parquet (``plan_rows``): the plan index of its first row, and per row the shard id,
    row in the shard (None when not asked for), dataset id, planned units and deal."""

    first: int
    shard_id: np.ndarray
    row: np.ndarray | None
    dataset: np.ndarray
    units: np.ndarray
    deal: np.ndarray


def plan_rows(plan: PlanBundle, *, rows: bool = True) -> Iterator[PlanRows]:
    """The plan's documents in order, a row group at a time, with their planned units: the ``tokens`` column where
    the plan has one, else their shard's ``document_units``; ``rows``: read each one's row in its shard too."""
    per_shard, seen = document_units(plan), 0
    columns = ["shard_id", "dataset_id", "tokens", deal_column(plan.manifest.format_version)] + (
        ["row"] if rows else []
    )
    for file in plan.checked.samples:
        reader = file.open()
        for g in range(reader.metadata.num_row_groups):
            table = read_row_group(reader, file.path, g, columns)
            sid, tokens = table.column(0).to_numpy().astype(np.int64), table.column(2)
            size = tokens.to_numpy().astype(np.int64) if tokens.null_count == 0 else per_shard[sid]
            row = table.column(4).to_numpy() if rows else None
            dataset = table.column(1).to_numpy().astype(np.int64)
            yield PlanRows(seen, sid, row, dataset, size, table.column(3).to_numpy())
            seen += len(table)


def lane_units(plan: PlanBundle, lanes: int) -> LaneUnits:
    """``LaneUnits`` of ``plan`` with ``lanes`` lanes: one pass over ``deal``, ``tokens``, ``shard_id`` and
    ``dataset_id`` (``plan_rows``)."""
    datasets = max(1, len(plan.dataset_names))
    units = np.zeros(lanes * datasets, dtype=np.float64)
    squares = np.zeros(lanes * datasets, dtype=np.float64)
    documents = np.zeros(lanes * datasets, dtype=np.int64)
    for group in plan_rows(plan, rows=False):
        cell = (group.deal % lanes) * datasets + group.dataset
        units += np.bincount(cell, weights=group.units, minlength=lanes * datasets)
        squares += np.bincount(cell, weights=group.units.astype(np.float64) ** 2, minlength=lanes * datasets)
        documents += np.bincount(cell, minlength=lanes * datasets)
    shape = (lanes, datasets)
    return LaneUnits(units=units.reshape(shape), documents=documents.reshape(shape), squares=squares.reshape(shape))


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


def lanes_quantile(lanes: int) -> float:
    """How many standard deviations of a lane's own spread the margin covers with ``lanes`` lanes: the quantile
    that every one of them stays under with the probability one lane stays under 3σ (``Φ⁻¹(1 − 0.00135 / L)``,
    a union bound): 3.0 for 1 lane, 3.58 for 8, 4.41 for 256, 4.70 for 1,024."""
    return NormalDist().inv_cdf(1 - TAIL / max(1, lanes))


def estimated_steps(
    lanes: LaneUnits,
    measured: Ratios,
    max_length: int,
    *,
    global_batch: int,
    drop_last: bool,
    known: np.ndarray | None = None,
) -> int:
    """Global steps of the run (see the module docstring); ``known``: each lane's real tokens, when the
    calibration read the whole plan (``whole_steps``). A run expected to be mostly margin — padding, or with
    ``drop_last`` tokens left out — is warned of (``warn_padding``)."""
    if known is not None:
        return whole_steps(known, max_length, global_batch=global_batch, drop_last=drop_last)
    if not len(lanes.units) or measured.pooled.ratio <= 0:
        return 0
    strata = measured.by_dataset
    by_dataset = lanes.units * np.array([m.ratio for m in strata])  # T_ℓd
    tokens = by_dataset.sum(axis=1)
    own = lanes.squares @ np.array([(m.relative * m.ratio) ** 2 for m in strata])  # Σ_d s_d²·r_d²·Σ u²
    # a ratio's error moves every dataset that uses it alike: the pooled ones' tokens add up before squaring
    pooled = [d for d, m in enumerate(strata) if m is measured.pooled]
    groups = [[d] for d, m in enumerate(strata) if m is not measured.pooled] + ([pooled] if pooled else [])
    calibration = sum((by_dataset[:, g].sum(axis=1) ** 2 * strata[g[0]].error for g in groups), np.zeros(len(tokens)))
    num_lanes = len(lanes.units)
    spread = lanes_quantile(num_lanes) ** 2 * own + 9 * calibration  # the calibration's error is every lane's
    relative = np.divide(spread, tokens**2, out=np.zeros_like(tokens), where=tokens > 0)
    margin = np.maximum(MIN_MARGIN, np.sqrt(relative))
    if drop_last:  # sequences j < L·R are full rows (row j // L of lane j % L)
        rows = int(np.floor(np.maximum(0.0, 1 - margin) * tokens / max_length).min())
    else:
        rows = int(np.ceil((1 + margin) * tokens / max_length).max())  # every lane used up within R rows
    steps = steps_in(num_lanes * rows, global_batch, drop_last=drop_last)  # R rows of L lanes: L·R sequences
    total = float(tokens.sum())
    warn_padding(total, steps, max_length, global_batch=global_batch, lanes=num_lanes, drop_last=drop_last)
    return steps


def warn_cut(left: dict[int, int], steps: int) -> None:
    """One ``ShortRunWarning`` for the lanes of a rank (lane → tokens buffered) that still hold tokens after the run's
    last step; nothing when none does, or in a ``Pipeline.dataloader()`` worker (``LOADER_WARNS``)."""
    cut = sorted(lane for lane, tokens in left.items() if tokens > 0)
    if cut and not LOADER_WARNS:
        shown = " (" + ", ".join(map(str, cut[:8])) + (", …" if len(cut) > 8 else "") + ")"
        warn_short_run(sum(left[k] for k in cut), len(cut), steps, shown)


def warn_short_run(tokens: int, lanes: int, steps: int, shown: str = "") -> None:
    """The ``ShortRunWarning`` of ``tokens`` left in ``lanes`` packing lanes after ``steps`` steps."""
    warn(
        f"an estimated run must end on its data, got {tokens:,} tokens left in {lanes} packing lane(s){shown} after "
        f"its {steps} steps, not trained on (stats().lanes_cut) — plan with exact_tokens=True for a run that ends "
        "exactly on its data",
        ShortRunWarning,
    )


def warn_padding(
    tokens: float, steps: int, max_length: int, *, global_batch: int, lanes: int, drop_last: bool = False
) -> None:
    """A ``ZephonWarning`` when more than ``PADDING_WARNING`` of the run's row slots are expected to be padding, or
    with ``drop_last`` more than ``DROPPED_WARNING`` of its tokens (``tokens``: all lanes' estimated ones) left
    out: a plan small for its global batch, few rows a lane, whose lanes' tokens the margin must cover one by
    one."""
    data = tokens / (global_batch * max_length)  # steps of tokens
    share = (1 - data / steps if steps else 0.0) if not drop_last else (1 - steps / data if data else 0.0)
    if share > (DROPPED_WARNING if drop_last else PADDING_WARNING):
        got = f"{share:.0%} expected padding" if not drop_last else f"{share:.0%} of its tokens expected left out"
        fix = "or use a smaller global batch" if not drop_last else "or drop_last=False (a padded tail instead)"
        warn(
            f"an estimated run's rows should be mostly data, got {got}: {steps} steps for about {data:,.0f} steps of "
            f"tokens ({lanes} lanes of {tokens / lanes / max_length:,.0f} rows on average, each known only within "
            f"its margin) — plan with exact_tokens=True for a run that ends on its data, {fix}"
        )
