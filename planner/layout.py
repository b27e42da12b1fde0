"""Laying out the plan: which document sits at each position, and (exact plans) where its tokens go.

Sample mixtures interleave datasets by document counts (``zephon.planner.interleave``); token mixtures by
token counts (``zephon.planner.token_mix``). Either way each dataset reads its documents in its epoch order
(``zephon.planner.orders``). Exact plans then add each document's offset in the global token stream (wrap)
or best-fit rows (``zephon.planner.best_fit``).

Budget rules: ``num_documents`` plans exactly that many positions; ``num_tokens`` plans documents until
their tokens reach it; ``epochs=E`` (the default, E = 1) plans up to the point where the last dataset
completes its E-th pass. With ``on_exhaustion="stop"`` the plan also ends just before any dataset would
start a pass beyond E (1 when another budget is given).

The plan is produced in chunks of consecutive positions (``chunks``), so memory does not grow with its
length: ``CHUNK`` positions at a time, plus a few shuffle windows per dataset. The mixtures hand over each
run of positions as a ``Placement`` (``zephon.planner.placement``); ``chunks`` turns it into a ``Chunk`` of
samples.parquet's columns. ``layout`` collects the chunks into whole columns for callers that want them.

Invariant: chunk boundaries never change the result — the plan is a function of the prepared work source
alone, and the same at any ``CHUNK``.

Worked example, a sample mixture a 0.5 / b 0.5 over a (2 documents) and b (3 documents), no budget (so
``epochs=1``): the interleaving is ``a b a b a b …``; b's last document of pass 1 is at position 5, so the
plan has 6 positions — ``dataset_id = [0 1 0 1 0 1]``, ``epoch = [0 0 0 0 1 0]`` (a starts its second
pass at position 4). With ``on_exhaustion="stop"`` (and no budget, or ``num_documents=6``) it ends just
before that: 4 positions, and b has read 2 of its 3 documents — a budget not met, which plan.json
``warnings`` records (``zephon.planner.shortfalls``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from zephon.errors import ConfigError
from zephon.plan.format import SAMPLES_ROW_GROUP
from zephon.planner.best_fit import Bins, pack
from zephon.planner.homogeneous import homogeneous
from zephon.planner.interleave import Interleaving, exact_weights
from zephon.planner.lane_dealing import Dealer, row_bytes
from zephon.planner.orders import Documents, Reader
from zephon.planner.phases import Stage
from zephon.planner.placement import Placement
from zephon.planner.prepare import PreparedPlan
from zephon.planner.token_mix import schedule

#: Positions per chunk: a multiple of the samples row group, so chunks are written as whole row groups.
CHUNK = 8 * SAMPLES_ROW_GROUP


#: Bumped whenever the layout of the same config changes (2: on_exhaustion="stop" ends an epochs-budget plan
#: before any dataset's extra pass, whatever the dataset order; 3: estimated plans record each document's
#: deal, not a lane among 8, so a run packs one lane per row of its global batch). ``Pipeline(work_source)``
#: keys its plan cache by config hash *and* this version, so a plan cached by an older layout is never reused.
LAYOUT_VERSION = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class Chunk:
    """Columns of samples.parquet for positions ``[start, start + len)``; ``tokens``/``token_offset``/``deal``
    None when the plan has none."""

    #: The plan position of the chunk's first document.
    start: int
    #: The phase of every position in the chunk (0 without phases).
    stage: int
    #: The dataset of each document (int16).
    dataset_id: np.ndarray
    #: Its global shard id (int32).
    shard_id: np.ndarray
    #: Its row within that shard (int32).
    row: np.ndarray
    #: The epoch (pass of its dataset, from 0) that reads it (int32).
    epoch: np.ndarray
    #: Its tokens, estimated or exact (int32).
    tokens: np.ndarray | None
    #: Exact plans: the offset of its first token in the plan's token stream (int64).
    token_offset: np.ndarray | None
    #: Estimated plans: its deal, whose residue modulo the lanes is its packing lane (int64;
    #: ``zephon.planner.lane_dealing``).
    deal: np.ndarray | None

    def __len__(self) -> int:
        return len(self.dataset_id)


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """Columns of samples.parquet (``tokens``/``token_offset`` None when unknown) and best-fit bins."""

    dataset_id: np.ndarray
    shard_id: np.ndarray
    row: np.ndarray
    epoch: np.ndarray
    tokens: np.ndarray | None
    token_offset: np.ndarray | None
    bins: Bins | None
    deal: np.ndarray | None


def dataset_reader(prepared: PreparedPlan, index: int, max_epochs: int | None = None) -> Reader:
    """Dataset ``index``'s documents in reading order (after those a continued plan's prefix read)."""
    refs = prepared.shards[index]
    source = prepared.source
    reader = Reader(
        shard_ids=np.array([r.shard_id for r in refs], dtype=np.int32),
        shard_rows=np.array([r.rows for r in refs], dtype=np.int64),
        tokens=prepared.tokens[index] if prepared.tokens is not None else None,
        seed=source.seed,
        dataset_index=index,
        shuffle=source.shuffle.enabled,
        window_shards=source.shuffle.window_shards,
        max_epochs=max_epochs,
        selection=prepared.selection(index),
    )
    if prepared.segment is not None:  # a continued plan: skip what the parent's prefix read
        skip = prepared.segment.documents[index]
        while skip:
            skip -= len(reader.take(min(skip, CHUNK)).row)
    return reader


def _done(prepared: PreparedPlan) -> tuple[int, int, list[int]]:
    """Positions and tokens already placed, and documents per dataset (a continued plan's prefix; else 0)."""
    segment = prepared.segment
    if segment is None:
        return 0, 0, [0] * len(prepared.shards)
    return segment.position, segment.tokens, list(segment.documents)


def _less(budget: int | None, done: int, what: str) -> int | None:
    """A whole-run budget less what a continued plan's prefix placed (None stays None)."""
    if budget is None:
        return None
    if budget <= done:
        raise ConfigError(
            f"the new config's {what} budget must exceed the {done} {what} the parent placed before the branch, "
            f"got {budget} — raise the budget (it counts the whole run) or branch earlier"
        )
    return budget - done


def _sample_mixture(prepared: PreparedPlan, stages: tuple[Stage, ...]) -> Iterator[Placement]:
    """The plan, a chunk of positions at a time, by document counts."""
    source = prepared.source
    weights = list(stages[0].raw)
    rows = [prepared.dataset_rows(i) for i in range(len(prepared.shards))]
    passes = source.epochs or 1
    placed, _, read = _done(prepared)
    budget = _less(source.num_documents, placed, "documents")
    stop = source.on_exhaustion == "stop"
    if len(stages) > 1 or (not all(weights) and budget is not None):
        # Phases come with a num_documents budget; the stop rule is applied stage by stage below. (A continued
        # plan whose segment starts inside a phase that leaves datasets out has one stage with zero weights.)
        assert budget is not None, "phases are validated to come with a budget"
        starts = [s.start_position for s in stages]
        assert all(p is not None for p in starts), "sample mixtures start phases at positions"
        bounds = [min(int(p), budget) for p in starts if p is not None] + [budget]
        yield from _stages(prepared, stages, bounds, passes=passes, rows=rows, stop=stop)
        return
    # The datasets read: all of them, but for a continued plan's left-out datasets (weight 0; an epochs budget
    # counts the passes of the datasets read).
    active = stages[0].active
    weights, rows, read = [weights[i] for i in active], [rows[i] for i in active], [read[i] for i in active]
    fr = [float(f) for f in exact_weights(weights)]
    # Documents each dataset has left in its `passes` passes (a continued plan's prefix read some).
    left = [max(0, passes * r - d) for r, d in zip(rows, read, strict=True)]
    if budget is not None and not stop:
        bound = budget
    else:
        # Enough positions for every dataset to complete `passes` passes (|c_i(n) - w_i n| < 1).
        bound = max(math.ceil((c + 1) / w) + 1 for c, w in zip(left, fr, strict=True))
        if budget is not None:
            bound = min(bound, budget)
    schedule_ = Interleaving(weights, bound)
    length = budget if budget is not None else 0
    if budget is None or stop:
        # Per dataset: the position of its last document of pass E, and of its first of pass E + 1 (a dataset
        # whose passes the prefix completed: none, and its next document).
        found = [
            (last, beyond) if c else (-1, beyond)
            for c, (last, beyond) in zip(left, schedule_.positions([[max(c - 1, 0), c] for c in left]), strict=True)
        ]
        if budget is None:  # the epochs budget: up to the last dataset's E-th pass
            assert all(last is not None for last, _ in found), "the bound leaves room for every dataset's passes"
            length = max(last + 1 for last, _ in found if last is not None)
        if stop:  # and never past the first dataset's pass E + 1 (all overruns, after all completions)
            length = min([length, *(beyond for _, beyond in found if beyond is not None)])
    length = min(length, bound)
    readers = [dataset_reader(prepared, i) for i in range(len(prepared.shards))]
    yield from _blocks(schedule_, readers, active, length, stage=stages[0].index)


def _blocks(
    schedule_: Interleaving, readers: list[Reader], active: list[int], length: int, *, stage: int
) -> Iterator[Placement]:
    """Positions ``[0, length)`` of ``schedule_`` over the ``active`` datasets' readers, CHUNK at a time."""
    ids = np.asarray(active, dtype=np.int16)
    for start in range(0, length, CHUNK):
        block = schedule_.block(start, min(length, start + CHUNK))
        # Each dataset's run, one after another; ``block.order`` scatters them back to plan order.
        runs = Documents.concat([readers[i].take(int(k)) for i, k in zip(active, block.counts, strict=True)])
        yield Placement(
            stage=stage,
            dataset_id=ids[block.choice],
            shard_id=_scatter(runs.shard_id, block.order),
            row=_scatter(runs.row, block.order),
            epoch=_scatter(runs.epoch, block.order),
            tokens=_scatter(runs.tokens, block.order) if runs.tokens is not None else None,
        )


def _scatter(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``column`` with ``column[order] = values``."""
    column = np.empty(len(order), dtype=values.dtype)
    column[order] = values
    return column


def _stages(
    prepared: PreparedPlan,
    stages: tuple[Stage, ...],
    bounds: list[int],
    *,
    passes: int,
    rows: list[int],
    stop: bool,
) -> Iterator[Placement]:
    """A phased sample mixture: stage ``k`` interleaves its datasets over positions ``[bounds[k], bounds[k+1])``,
    each dataset reading on from where the previous stages left it. With ``stop``, the plan ends just before
    any dataset would start pass ``passes + 1``."""
    readers = [dataset_reader(prepared, i) for i in range(len(prepared.shards))]
    read = _done(prepared)[2]  # documents taken per dataset (a continued plan's prefix counts)
    for k, stage in enumerate(stages):
        lo, hi = bounds[k], max(bounds[k], bounds[k + 1])
        if hi == lo:
            continue
        active = stage.active
        schedule_ = Interleaving([stage.raw[i] for i in active], hi - lo)
        length, ended = hi - lo, False
        if stop:
            found = schedule_.positions([[passes * rows[i] - read[i]] for i in active])
            beyond = min((p for (p,) in found if p is not None), default=None)
            if beyond is not None:
                length, ended = beyond, True
        for placement in _blocks(schedule_, readers, active, length, stage=stage.index):
            counts = np.bincount(placement.dataset_id, minlength=len(readers))[active].tolist()
            for i, n in zip(active, counts, strict=True):
                read[i] += n
            yield placement
        if ended:
            return


def _token_mixture(prepared: PreparedPlan, stages: tuple[Stage, ...]) -> Iterator[Placement]:
    """The plan, a chunk of positions at a time, by token counts."""
    source = prepared.source
    assert prepared.tokens is not None
    epoch_tokens = [prepared.epoch_tokens(i) for i in range(len(prepared.tokens))]
    placed, tokens, _ = _done(prepared)
    segment = prepared.segment
    return schedule(
        lambda i, cap: dataset_reader(prepared, i, cap),
        epoch_tokens,
        stages,
        passes=source.epochs or 1,
        stop=source.on_exhaustion == "stop",
        num_documents=_less(source.num_documents, placed, "documents"),
        num_tokens=_less(source.num_cost if prepared.unit == "cost" else source.num_tokens, tokens, prepared.unit),
        consumed=list(segment.dataset_tokens) if segment is not None else None,
    )


def chunks(prepared: PreparedPlan) -> Iterator[Chunk]:
    """The plan described by ``prepared``, in chunks of consecutive positions."""
    stages = prepared.stages
    by_amount = prepared.unit in ("tokens", "cost")  # token shares, or cost shares by the same machinery
    placements = _token_mixture(prepared, stages) if by_amount else _sample_mixture(prepared, stages)
    dealer = None if prepared.exact else Dealer(prepared.segment.units if prepared.segment is not None else 0)
    sizes = None if prepared.tokens is not None else row_bytes(prepared.shards)
    start, offset, _ = _done(prepared)
    for placement in placements:
        tokens = placement.tokens
        token_offset = None
        if prepared.exact:
            assert tokens is not None
            token_offset = np.empty(len(tokens), np.int64)
            token_offset[0] = offset
            np.cumsum(tokens[:-1], out=token_offset[1:])
            token_offset[1:] += offset
            offset += int(tokens.sum())
        yield Chunk(
            start=start,
            stage=placement.stage,
            dataset_id=placement.dataset_id.astype(np.int16, copy=False),
            shard_id=placement.shard_id.astype(np.int32, copy=False),
            row=placement.row.astype(np.int32, copy=False),
            epoch=placement.epoch.astype(np.int32, copy=False),
            tokens=tokens.astype(np.int32) if tokens is not None else None,
            token_offset=token_offset,
            deal=dealer.deal(tokens if sizes is None else sizes[placement.shard_id]) if dealer is not None else None,
        )
        start += len(placement.dataset_id)


def best_fit(
    prepared: PreparedPlan,
    tokens: np.ndarray,
    dataset_id: np.ndarray | None = None,
    closes: tuple[tuple[int, int | None], ...] = (),
) -> Bins | None:
    """The planned rows of an exact best-fit or homogeneous plan over its documents' ``tokens`` (and, for
    homogeneous packing, ``dataset_id``) in plan order, else None. A plan that packs samples
    (``Pipeline.pack_samples``): rows of at most ``max_cost`` over its samples' costs (``tokens``), every sample
    placed, zero-cost ones too, but those ``oversize="drop"`` leaves out (``prepare`` refused them otherwise); rows
    closed at ``closes`` (``(position, rows_below)``: phase boundaries and a continuation's seam,
    ``zephon.planner.best_fit``)."""
    if prepared.sample_pack is not None:
        max_cost = prepared.sample_pack.max_cost
        return pack(tokens.astype(np.int64), max_cost, oversize="drop", keep_empty=True, closes=closes)
    if not prepared.exact or prepared.pack is None or prepared.pack.algorithm == "wrap":
        return None
    if prepared.pack.algorithm == "homogeneous":
        assert dataset_id is not None, "homogeneous packing needs each document's dataset"
        return homogeneous(tokens, dataset_id, prepared.pack.max_length)
    return pack(tokens.astype(np.int64), prepared.pack.max_length, oversize=prepared.pack.oversize)


def layout(prepared: PreparedPlan) -> Layout:
    """Lay out the whole plan in memory (for small plans and tests; ``chunks`` streams it)."""
    parts = list(chunks(prepared))

    def column(name: str, dtype: type) -> np.ndarray:
        return np.concatenate([getattr(c, name) for c in parts]) if parts else np.empty(0, dtype)

    known = prepared.tokens is not None
    tokens = column("tokens", np.int32) if known else None
    return Layout(
        dataset_id=column("dataset_id", np.int16),
        shard_id=column("shard_id", np.int32),
        row=column("row", np.int32),
        epoch=column("epoch", np.int32),
        tokens=tokens,
        token_offset=column("token_offset", np.int64) if prepared.exact else None,
        bins=best_fit(prepared, tokens, column("dataset_id", np.int16)) if tokens is not None else None,
        deal=column("deal", np.int64) if not prepared.exact else None,
    )
