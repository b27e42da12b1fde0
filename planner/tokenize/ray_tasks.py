"""``zephon tokenize --engine ray``: one Ray task per shard, each writing its own store (``zephon[ray]``).

A task runs exactly what a local worker runs (``zephon.planner.tokenize.shard.write_shard_store``, on one
thread) and returns the finished record to the driver, so the stores are byte-identical to the local engine's.
The tasks write ``OUT_DIR`` themselves: on a cluster it must be storage every node mounts at the same path, and
the shards must be readable from every node (shared storage, the Hub, an object store); a task refuses, naming
its node, a shard or an ``OUT_DIR`` it cannot see. Ray is joined as every Ray step of the planner joins it
(``zephon.planner.ray_cluster``); a task whose worker dies is run again, and its store is written through
temporaries renamed into place, so a retry writes the same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict

from zephon.planner.counts.ray_pass import SHARED_FIX, worker_encoder
from zephon.planner.ray_cluster import (
    TaskAccess,
    adopt_credentials,
    driver_credentials,
    failpoint,
    ray_session,
    require_visible,
    run_tasks,
)
from zephon.planner.tokenize.records import StoreRecord
from zephon.planner.tokenize.shard import ShardTask
from zephon.specs import TokenizeSpec

__all__ = ["tokenize_with_ray"]


def tokenize_with_ray(
    tasks: Sequence[ShardTask],
    spec: TokenizeSpec,
    dtype: str,
    *,
    workers: int | None = None,
    on_done: Callable[[StoreRecord], None] | None = None,
) -> list[StoreRecord]:
    """Write every task's store as a Ray task; the records in ``tasks``' order."""
    spec_dict = asdict(spec)
    for folder in sorted({os.path.dirname(t.prefix) for t in tasks}):  # made here: a task then checks it can see it
        os.makedirs(folder, exist_ok=True)

    def finished(_i: int, result: dict) -> None:
        if on_done is not None:
            on_done(StoreRecord(**result))

    with ray_session(workers) as ray:
        credentials = driver_credentials(t.ref.uri for t in tasks)
        arguments = [(asdict(t.ref), t.prefix, spec_dict, dtype, credentials) for t in tasks]
        results = run_tasks(ray, _tokenize_remote, arguments, on_result=finished)
    return [StoreRecord(**r) for r in results]


def _tokenize_remote(ref: dict, prefix: str, spec: dict, dtype: str, credentials: TaskAccess) -> dict:
    """Runs in a Ray worker: the local worker's function, with the tokenizer loaded once per worker."""
    import numpy as np

    from zephon.plan.records import ShardRef
    from zephon.planner.tokenize.shard import write_shard_store

    failpoint()
    task = ShardTask(ref=ShardRef(**ref), prefix=prefix)
    require_visible([task.ref.uri], f"dataset {task.ref.dataset!r}: shard", SHARED_FIX)
    require_visible(
        [os.path.dirname(prefix)], "the output folder", "write OUT_DIR on storage every node mounts at the same path"
    )
    adopt_credentials(credentials)
    return write_shard_store(task, worker_encoder(spec), np.dtype(dtype), split=False).to_dict()  # type: ignore[arg-type]
