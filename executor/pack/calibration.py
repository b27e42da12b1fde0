"""Which documents an estimated run's calibration tokenizes to measure its length (``run_length``): the same on
every rank and at every data-parallel size, from the plan alone.

The plan's first documents of the shards a run opens first (``(shuffle window + 1) × datasets``, so a bounded shard
cache holds them and the run reads them again from it, never downloading a shard twice), until they number
``CALIBRATION`` and hold ``CALIBRATION_UNITS`` planned units, or hold ``CALIBRATION_MAX_UNITS``; and, unless that is
the whole plan, the first ``LATE_DOCUMENTS`` documents of each dataset the plan's first rows (as many, in any shard)
hold fewer than ``MIN_STRATUM`` of — a later phase's, a small weight's — wherever they are in the plan, so its ratio
is measured rather than borrowed from datasets that tokenize otherwise (their shards are opened early: a remote one
is downloaded then).

A plan of local files the calibration would take whole is read whole, whatever shards hold it (nothing to
download): an exact end.

Invariant: the selection is a function of the plan's rows in order, never of its row groups or of the run.
Example: a plan of 3,000 one-unit documents, ``CALIBRATION`` 2,048, ``CALIBRATION_UNITS`` 2^23: the whole plan
(``whole``, an exact end); 10^6 documents of 10 units: the first 838,861 (2^23 units); a dataset ``cjk`` that
first appears in a phase at 80 % of the plan adds its first 256 documents from there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephon.executor.pack.run_length import MIN_STRATUM, plan_rows
from zephon.executor.plan_reader import PlanBundle
from zephon.storage.remote import is_remote_uri

#: Documents at the start of the plan that every rank tokenizes, at least, to measure tokens per unit...
CALIBRATION = 2048
#: ... and planned units (about tokens) they hold at least, when the shards a run opens first hold them;
CALIBRATION_UNITS = 1 << 23
#: or this many units, however few documents hold them (2,048 books of 10^5 tokens would be 2·10^8 tokens a rank).
CALIBRATION_MAX_UNITS = 1 << 25
#: Rows of the plan looked at for the calibration's documents, at most.
CALIBRATION_SCAN = 1 << 20
#: A dataset the first documents hold fewer than ``MIN_STRATUM`` of is measured on its first this many, wherever.
LATE_DOCUMENTS = 256


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """The plan's first documents: where they live (``shard_id``, ``row``), their ``dataset``, planned ``units`` and
    ``deal``; ``whole``: they are every document of the plan (none left out), so the calibration knows each lane's
    tokens."""

    shard_id: np.ndarray
    row: np.ndarray
    dataset: np.ndarray
    units: np.ndarray
    deal: np.ndarray
    whole: bool = False


def _prefix_end(sizes: np.ndarray, count: int, budget: int) -> int:
    """Documents of the shortest prefix of ``sizes`` holding ``count`` documents and ``budget`` units, or
    ``CALIBRATION_MAX_UNITS`` units; all of them if none does."""
    cumulative = np.cumsum(sizes)
    enough = ((np.arange(1, len(sizes) + 1) >= count) & (cumulative >= budget)) | (cumulative >= CALIBRATION_MAX_UNITS)
    return int(np.argmax(enough)) + 1 if enough.any() else len(sizes)


def calibration_documents(
    plan: PlanBundle, count: int | None = None, *, max_shards: int, units: int | None = None
) -> Calibration:
    """The plan's first documents of its first ``max_shards`` distinct shards (the shards a run opens first, so a
    bounded shard cache holds them and the run reads them again from it, never downloading a shard twice): the
    shortest such prefix with at least ``count`` documents (``CALIBRATION``) and ``units`` planned units
    (``CALIBRATION_UNITS``), or with ``CALIBRATION_MAX_UNITS`` units, among the plan's first ``CALIBRATION_SCAN``
    rows — or all of them. Which documents they are depends on the plan alone, never on its row groups.
    ``whole``: they are every document of the plan. Unless whole, a dataset the prefix holds fewer than
    ``MIN_STRATUM`` documents of (a later phase's, a small weight's) adds its first ``LATE_DOCUMENTS`` in the plan,
    wherever they are (``late_documents``): its ratio is measured, not borrowed from datasets that tokenize
    otherwise."""
    count = CALIBRATION if count is None else count
    budget = CALIBRATION_UNITS if units is None else units
    local = not any(is_remote_uri(s.uri) for s in plan.shards)  # no shard to download: any may be read
    parts: list[tuple[np.ndarray, ...]] = []
    scanned: list[np.ndarray] = []  # every row's dataset and units, kept or not
    every: list[tuple[np.ndarray, ...]] = []  # and, of local files, every row (a small plan is read whole)
    opened, kept, kept_units, looked, looked_units = np.zeros(0, np.int64), 0, 0, 0, 0
    for seen, sid, row, dataset, size, deal in plan_rows(plan):
        enough = (kept >= count and kept_units >= budget) or kept_units >= CALIBRATION_MAX_UNITS
        if seen >= CALIBRATION_SCAN or enough:
            break
        if len(opened) < max_shards:  # shards in order of first appearance: a prefix of them stays the same
            _, first = np.unique(np.concatenate([opened, sid]), return_index=True)
            opened = np.concatenate([opened, sid])[np.sort(first)][:max_shards]
        keep = np.isin(sid, opened) & (np.arange(seen, seen + len(sid)) < CALIBRATION_SCAN)
        index = np.arange(seen, seen + len(sid))[keep]
        parts.append((index, sid[keep], row[keep], dataset[keep], size[keep], deal[keep]))
        scanned.append(np.stack([dataset, size])[:, : max(0, CALIBRATION_SCAN - seen)])
        kept, kept_units = kept + int(keep.sum()), kept_units + int(size[keep].sum())
        looked, looked_units = looked + len(sid), looked_units + int(size.sum())
        wants_less = (looked >= count and looked_units >= budget) or looked_units >= CALIBRATION_MAX_UNITS
        local = local and (looked >= plan.num_documents or not wants_less)  # the plan may still be read whole:
        if local:  # every row kept while it may
            every.append((sid, row, dataset, size, deal))
        else:
            every.clear()
    if not parts:
        empty = np.zeros(0, np.int64)
        return Calibration(shard_id=empty, row=empty, dataset=empty, units=empty, deal=empty, whole=True)
    rows = np.concatenate(scanned, axis=1)  # which datasets the rows it wants hold few of, counted on every row
    wanted = _prefix_end(rows[1], count, budget)
    if local and wanted == plan.num_documents:  # a small plan of local files: read whole, whatever shards hold it
        sid, row, dataset, size, deal = (np.concatenate([p[k] for p in every]) for k in range(5))
        return Calibration(shard_id=sid, row=row, dataset=dataset, units=size, deal=deal, whole=True)
    index, sid, row, dataset, size, deal = (np.concatenate([p[k] for p in parts]) for k in range(6))
    end = _prefix_end(size, count, budget)
    whole = end == plan.num_documents  # every document of the plan: each lane's tokens are known
    first = (sid[:end], row[:end], dataset[:end], size[:end], deal[:end])
    rare = np.bincount(rows[0, :wanted], minlength=len(plan.dataset_names))  # in any shard
    late = late_documents(plan, index[:end], dataset[:end], rare) if not whole else tuple(f[:0] for f in first)
    sid, row, dataset, size, deal = (np.concatenate([f, extra]) for f, extra in zip(first, late, strict=True))
    return Calibration(shard_id=sid, row=row, dataset=dataset, units=size, deal=deal, whole=whole)


def late_documents(
    plan: PlanBundle, taken: np.ndarray, datasets: np.ndarray, looked_at: np.ndarray
) -> tuple[np.ndarray, ...]:
    """The first documents in the plan, up to ``LATE_DOCUMENTS`` with those of the calibration's ``taken`` rows (plan
    indices, with their ``datasets``), of each dataset the plan's rows looked at (``looked_at`` of each) hold fewer than
    ``MIN_STRATUM`` of — not one the shards a run opens first only left out: shard ids,
    rows, dataset ids, units and deals. One pass over the plan, until each has them or the plan ends."""
    have = np.bincount(datasets, minlength=len(plan.dataset_names))
    planned = {d.id: d.planned_documents for d in plan.manifest.datasets}  # a dataset the plan never schedules: none
    short = np.flatnonzero((looked_at < MIN_STRATUM) & (have < MIN_STRATUM)).tolist()
    need = {d: n for d in short if (n := min(LATE_DOCUMENTS, planned.get(d, 0)) - int(have[d])) > 0}
    parts: list[tuple[np.ndarray, ...]] = []
    taken_set = np.sort(taken)
    for seen, sid, row, dataset, size, deal in plan_rows(plan) if need else ():
        index = np.arange(seen, seen + len(sid))
        pick = np.isin(dataset, list(need)) & ~np.isin(index, taken_set, assume_unique=True)
        for d in np.unique(dataset[pick]).tolist():
            rows = np.flatnonzero(pick & (dataset == d))[: need[d]]
            parts.append((index[rows], sid[rows], row[rows], dataset[rows], size[rows], deal[rows]))
            need[d] -= len(rows)
        need = {d: n for d, n in need.items() if n > 0}
        if not need:
            break
    if not parts:
        return tuple(np.zeros(0, np.int64) for _ in range(5))
    order = np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")  # plan order
    return tuple(np.concatenate([p[k] for p in parts])[order] for k in range(1, 6))
