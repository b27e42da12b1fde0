"""The computed cost pass: each sample's cost from a Python function, cached per shard (``zephon count`` style).

A dataset with ``cost=computed_cost("mypkg.costs:image_cost")`` (``zephon.recipe.computed_cost``) has its costs
computed before the plan is laid out: ``zephon count CONFIG`` computes them ahead, ``zephon plan`` (and
``Pipeline(source)``) computes the shards whose costs are missing. The shard's samples are read as a record
pipeline reads them before operators and the function is called on each (``zephon.planner.counts.cost_worker``).

Where the work runs (``engine``, ``workers``; the same as the count pass): in this process when one worker is
enough, else in ``workers`` subprocesses (``python -m zephon.planner.counts.cost_worker``; shards split longest
first to the least loaded), or as Ray tasks (``engine="ray"``; each task returns the array and the driver saves
it). Every path writes the same array to the same cache entry, so the plan cannot tell how its costs were made.

Cache: ``$ZEPHON_CACHE_DIR/computed-costs/<key>.npy`` (int64, one value per row), ``key`` = blake2b of the
shard's fingerprint, size and — for fingerprints that digest a listing rather than the bytes (a local tar's
``tarindex:``, an MDS shard's ``mdsindex:``) — its URI, and the function's identity: its import path and the
SHA-256 of its source. An edited function has another key, so it is computed again; a removed entry is computed
again when the plan needs it.

Worked example: 3 shards, 1 cached, ``workers=2``: the two others go one to each worker process; the report is
``ComputedReport(computed=2, cached=1)`` and the arrays of the three are loaded for the layout.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from zephon.errors import ConfigError, DatasetError, ZephonError
from zephon.plan.records import ShardRef
from zephon.planner.counts.cost_worker import CostFunction, compute_shard, resolve, save_atomic
from zephon.planner.counts.lengths import load_cached, start_workers, worker_lines
from zephon.planner.ray_cluster import check_engine
from zephon.recipe.computed_cost import ComputedCost
from zephon.recipe.dataset import Dataset
from zephon.storage.files import cache_dir
from zephon.storage.progress import progress_bar

__all__ = ["ComputedReport", "computed_costs", "describe", "source_costs"]

#: The dtype of a cached cost array (any other is computed again).
COSTS_DTYPE = np.dtype(np.int64)

#: Fingerprints that digest a shard's listing, not its bytes: the cache key adds the URI.
_LISTING_PRINTS = ("tarindex:", "mdsindex:")


@dataclass(frozen=True, kw_only=True, slots=True)
class ComputedReport:
    """What a computed cost pass did: shards computed now, shards found in the cache."""

    computed: int
    cached: int


def describe(function: CostFunction) -> dict[str, str]:
    """What plan.json's ``config.datasets[].cost`` records of the function: its path and source hash."""
    return {"function": function.path, "source": function.source}


def cost_path(ref: ShardRef, function: CostFunction) -> Path:
    """The cache entry of ``ref``'s costs under ``function``."""
    where = ref.uri if ref.fingerprint.startswith(_LISTING_PRINTS) else ""
    text = "\0".join((ref.fingerprint, str(ref.bytes), where, function.path, function.source))
    return cache_dir() / "computed-costs" / f"{hashlib.blake2b(text.encode(), digest_size=20).hexdigest()}.npy"


def computed_costs(
    jobs: Sequence[tuple[ShardRef, CostFunction]],
    *,
    workers: int | None = None,
    progress: bool | None = None,
    engine: str = "local",
) -> tuple[list[np.ndarray], ComputedReport]:
    """The costs (int64 per row) of each ``(shard, function)`` of ``jobs``, computing only what is not cached."""
    check_engine(engine)
    paths = [cost_path(ref, fn) for ref, fn in jobs]
    todo = [
        i for i, (r, _) in enumerate(jobs) if load_cached(paths[i], r.rows, header_only=True, dtype=COSTS_DTYPE) is None
    ]
    processes = max(1, min(workers or os.cpu_count() or 1, len(todo)))
    if todo:
        with progress_bar(total=len(todo), desc="computing costs", unit="shard", progress=progress) as bar:
            if engine == "ray":
                from zephon.planner.counts.ray_costs import compute_with_ray

                compute_with_ray([jobs[i] for i in todo], [paths[i] for i in todo], workers=workers, on_done=bar.update)
            elif processes == 1:
                for i in todo:
                    save_atomic(paths[i], compute_shard(*jobs[i]))
                    bar.update(1)
            else:
                _run_workers([jobs[i] for i in todo], [paths[i] for i in todo], processes, bar.update)
    out = []
    for (ref, fn), path in zip(jobs, paths, strict=True):
        array = load_cached(path, ref.rows, dtype=COSTS_DTYPE)
        if array is None:  # removed from the cache since: computed here
            array = compute_shard(ref, fn)
            save_atomic(path, array)
        out.append(array)
    return out, ComputedReport(computed=len(todo), cached=len(jobs) - len(todo))


def _run_workers(
    jobs: Sequence[tuple[ShardRef, CostFunction]], paths: Sequence[Path], workers: int, done: Callable[[int], object]
) -> None:
    """Compute in ``workers`` subprocesses: shards longest first, each to the least loaded worker."""
    loads = [0] * workers
    tasks: list[list[dict]] = [[] for _ in range(workers)]
    for i in sorted(range(len(jobs)), key=lambda i: (-jobs[i][0].bytes, i)):
        w = loads.index(min(loads))
        loads[w] += jobs[i][0].bytes
        ref, fn = jobs[i]
        tasks[w].append({"ref": asdict(ref), "out": str(paths[i]), "function": fn.path, "source": fn.source})
    payloads = [{"sys_path": [p for p in sys.path if p], "tasks": t} for t in tasks if t]
    procs = start_workers("zephon.planner.counts.cost_worker", payloads)
    failure: ZephonError | None = None
    try:
        for message in worker_lines(procs):
            if "error" in message and failure is None:
                kind = {"DatasetError": DatasetError, "ConfigError": ConfigError}.get(message["kind"], ZephonError)
                failure = kind(message["error"])
                for proc in procs:  # the first error ends the pass
                    proc.kill()
            elif "error" not in message:
                done(1)
    finally:
        for proc in procs:
            assert proc.stderr is not None
            err = proc.stderr.read()
            if proc.wait() != 0 and failure is None:
                last = err.strip().splitlines()[-1] if err.strip() else f"exit code {proc.returncode}"
                failure = ZephonError(f"the computed cost pass must finish every shard, got a worker failure: {last}")
    if failure is not None:
        raise failure


def source_costs(
    datasets: Sequence[Dataset],
    shards: Sequence[Sequence[ShardRef]],
    *,
    workers: int | None = None,
    progress: bool | None = None,
    engine: str = "local",
) -> tuple[dict[int, list[np.ndarray]], ComputedReport]:
    """The computed pass over every dataset whose ``cost`` is a ``ComputedCost``: its arrays per shard, by the
    dataset's index, and what the pass did (one pool of workers for all of them)."""
    jobs: list[tuple[ShardRef, CostFunction]] = []
    owners: list[int] = []
    for index, (ds, refs) in enumerate(zip(datasets, shards, strict=True)):
        if isinstance(ds.cost, ComputedCost):
            function = resolve(ds.name, ds.cost.function)
            jobs += [(ref, function) for ref in refs]
            owners += [index] * len(refs)
    arrays, report = computed_costs(jobs, workers=workers, progress=progress, engine=engine)
    out: dict[int, list[np.ndarray]] = {}
    for index, array in zip(owners, arrays, strict=True):
        out.setdefault(index, []).append(array)
    return out, report
