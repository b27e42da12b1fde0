"""Laying out the plan: which document sits at each position, and (exact plans) where its tokens go.

Sample mixtures interleave datasets by document counts (``zephon.planner.interleave``); token mixtures by
token counts (``zephon.planner.token_mix``). Either way each dataset reads its documents in its epoch order
(``zephon.planner.orders``). Exact plans then add each document's offset in the global token stream (wrap)
or best-fit rows (``zephon.planner.best_fit``).

Budget rules: ``num_documents`` plans exactly that many positions; ``num_tokens`` plans documents until
their tokens reach it; ``epochs=E`` (the default, E = 1) plans up to the point where the last dataset
completes its E-th pass. With ``on_exhaustion="stop"`` the plan also ends just before any dataset would
start a pass beyond E (1 when another budget is given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zephon.planner.best_fit import Bins, pack
from zephon.planner.interleave import exact_weights, interleave
from zephon.planner.lanes import deal
from zephon.planner.orders import epoch_order
from zephon.planner.prepare import PreparedPlan
from zephon.planner.token_mix import Stream, schedule


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
    lane: np.ndarray | None


def _epoch_fn(prepared: PreparedPlan, index: int):
    source = prepared.source
    refs = prepared.shards[index]
    ids = np.array([r.shard_id for r in refs], dtype=np.int32)
    counts = np.array([r.rows for r in refs], dtype=np.int64)
    first = int(ids[0])
    flat_tokens = np.concatenate(prepared.tokens[index]) if prepared.tokens is not None else None
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))

    def run(epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        shard, row = epoch_order(
            ids,
            counts,
            seed=source.seed,
            dataset_index=index,
            epoch=epoch,
            shuffle=source.shuffle.enabled,
            window_shards=source.shuffle.window_shards,
        )
        tokens = flat_tokens[starts[shard - first] + row] if flat_tokens is not None else np.zeros(len(row), np.int64)
        return shard, row, tokens

    return run, int(counts.sum())


def _sample_mixture(prepared: PreparedPlan) -> tuple[np.ndarray, ...]:
    source = prepared.source
    weights = [float(source.mixture.weights[ds.name]) for ds in source.datasets]
    fr = [float(f) for f in exact_weights(weights)]
    rows = [sum(r.rows for r in refs) for refs in prepared.shards]
    passes = source.epochs or 1
    if source.num_documents is not None and source.on_exhaustion == "new_epoch":
        bound = source.num_documents
    else:
        # Enough positions for every dataset to complete `passes` passes (|c_i(n) - w_i n| < 1).
        bound = max(math.ceil((passes * r + 1) / w) + 1 for r, w in zip(rows, fr, strict=True))
        if source.num_documents is not None:
            bound = min(bound, source.num_documents)
    choice = interleave(weights, bound)
    length = source.num_documents if source.num_documents is not None else 0
    for i, r in enumerate(rows):
        positions = np.flatnonzero(choice == i)
        if source.num_documents is None:
            length = max(length, int(positions[passes * r - 1]) + 1)
        if source.on_exhaustion == "stop" and len(positions) > passes * r:
            length = min(length, int(positions[passes * r]))
    choice = choice[:length]
    shard = np.empty(length, np.int32)
    row = np.empty(length, np.int32)
    epoch = np.empty(length, np.int32)
    tokens = np.zeros(length, np.int64)
    for index in range(len(prepared.shards)):
        run, total = _epoch_fn(prepared, index)
        positions = np.flatnonzero(choice == index)
        parts = [run(e) for e in range(-(-len(positions) // total))]
        if parts:
            shard[positions] = np.concatenate([p[0] for p in parts])[: len(positions)]
            row[positions] = np.concatenate([p[1] for p in parts])[: len(positions)]
            tokens[positions] = np.concatenate([p[2] for p in parts])[: len(positions)]
        epoch[positions] = (np.arange(len(positions)) // total).astype(np.int32)
    return choice.astype(np.int16), shard, row, epoch, tokens


def _token_mixture(prepared: PreparedPlan) -> tuple[np.ndarray, ...]:
    source = prepared.source
    assert prepared.tokens is not None
    streams = []
    for index in range(len(prepared.shards)):
        run, _ = _epoch_fn(prepared, index)
        epoch_tokens = int(sum(int(t.sum()) for t in prepared.tokens[index]))
        streams.append(Stream(next_epoch=run, epoch_tokens=max(1, epoch_tokens)))
    weights = [float(f) for f in exact_weights([float(source.mixture.weights[ds.name]) for ds in source.datasets])]
    merged = schedule(
        streams,
        weights,
        passes=source.epochs or 1,
        stop=source.on_exhaustion == "stop",
        num_documents=source.num_documents,
        num_tokens=source.num_tokens,
    )
    return merged.dataset, merged.shard, merged.row, merged.epoch, merged.tokens


def layout(prepared: PreparedPlan) -> Layout:
    """Lay out the plan described by ``prepared``."""
    mix = _token_mixture if prepared.unit == "tokens" else _sample_mixture
    dataset_id, shard, row, epoch, tokens = mix(prepared)
    known = prepared.tokens is not None
    token_offset = None
    bins = None
    if prepared.exact:
        token_offset = np.concatenate(([0], np.cumsum(tokens)[:-1])).astype(np.int64)
        assert prepared.pack is not None
        if prepared.pack.algorithm == "best_fit":
            bins = pack(tokens, prepared.pack.max_length, oversize=prepared.pack.oversize)
    lane = None if prepared.exact else deal(len(dataset_id), prepared.source.lanes, tokens if known else None)
    return Layout(
        dataset_id=dataset_id,
        shard_id=shard,
        row=row,
        epoch=epoch,
        tokens=tokens.astype(np.int32) if known else None,
        token_offset=token_offset,
        bins=bins,
        lane=lane,
    )
