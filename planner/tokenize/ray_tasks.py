"""``zephon tokenize --engine ray``: one Ray task per shard, each writing its own store (``zephon[ray]``).

A task runs exactly what a local worker runs (``zephon.planner.tokenize.shard.write_shard_store``, on one
thread) and returns the finished record to the driver, so the stores are byte-identical to the local engine's.
The tasks write ``OUT_DIR`` themselves: on a cluster it must be storage every node mounts at the same path, and
the shards must be readable from every node (shared storage, the Hub, an object store). ``ray.init()`` joins
``RAY_ADDRESS`` when set, else starts a local instance with ``workers`` CPUs (as the count pass does:
``zephon.planner.counts.ray_pass``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict

from zephon.errors import ZephonError
from zephon.planner.counts.ray_pass import ray_session, worker_encoder
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
    with ray_session(workers) as ray:
        remote = ray.remote(_tokenize_remote)
        spec_dict = asdict(spec)
        pending = {remote.remote(asdict(t.ref), t.prefix, spec_dict, dtype): i for i, t in enumerate(tasks)}
        records: list[StoreRecord | None] = [None] * len(tasks)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except Exception as exc:  # a task's ZephonError arrives wrapped (RayTaskError): raise its one line
                cause = getattr(exc, "cause", None)
                if isinstance(cause, ZephonError):
                    raise cause from None
                raise
            records[i] = record = StoreRecord(**result)
            if on_done is not None:
                on_done(record)
        return [r for r in records if r is not None]


def _tokenize_remote(ref: dict, prefix: str, spec: dict, dtype: str) -> dict:
    """Runs in a Ray worker: the local worker's function, with the tokenizer loaded once per worker."""
    import numpy as np

    from zephon.plan.records import ShardRef
    from zephon.planner.tokenize.shard import write_shard_store

    task = ShardTask(ref=ShardRef(**ref), prefix=prefix)
    return write_shard_store(task, worker_encoder(spec), np.dtype(dtype), split=False).to_dict()  # type: ignore[arg-type]
