"""The computed cost pass on Ray (``zephon count --engine ray``, ``zephon plan --engine ray``).

Each shard to compute becomes one Ray task running exactly what a local worker runs
(``zephon.planner.counts.cost_worker.compute_shard``) and returning the array; the driver saves it into the same
cache entry with the same atomic write, so the arrays — and the plans — are byte-identical to the local pass's.
A task imports the cost function by its path with the driver's ``sys.path`` added, and refuses a function whose
source differs from the driver's. A task whose worker dies runs again (``zephon.planner.ray_cluster``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from zephon.plan.records import ShardRef
from zephon.planner.counts.cost_worker import CostFunction, save_atomic
from zephon.planner.ray_cluster import (
    TaskAccess,
    adopt_credentials,
    driver_credentials,
    failpoint,
    ray_session,
    require_visible,
    run_tasks,
)

__all__ = ["compute_with_ray"]


def compute_with_ray(
    jobs: Sequence[tuple[ShardRef, CostFunction]],
    paths: Sequence[Path],
    *,
    workers: int | None = None,
    on_done: Callable[[int], object] | None = None,
) -> None:
    """Compute each ``(shard, function)`` as a Ray task and save its array to ``paths[i]`` as it arrives."""

    def saved(i: int, costs: np.ndarray) -> None:
        save_atomic(paths[i], costs)
        if on_done is not None:
            on_done(1)

    with ray_session(workers) as ray:
        credentials = driver_credentials(ref.uri for ref, _ in jobs)
        search = [p for p in sys.path if p]
        arguments = [(asdict(ref), fn.path, fn.source, search, credentials) for ref, fn in jobs]
        run_tasks(ray, _compute_remote, arguments, on_result=saved)


def _compute_remote(
    ref: dict, path: str, source: str, search: list[str], credentials: TaskAccess
) -> np.ndarray:
    """Runs in a Ray worker: the local worker's computation of one shard."""
    from zephon.planner.counts.cost_worker import add_paths, checked_function, compute_shard

    failpoint()
    from zephon.planner.counts.ray_pass import SHARED_FIX

    shard = ShardRef(**ref)
    require_visible([shard.uri], f"dataset {shard.dataset!r}: shard", SHARED_FIX)
    adopt_credentials(credentials)
    add_paths(search)
    return compute_shard(shard, checked_function(shard, path, source))
