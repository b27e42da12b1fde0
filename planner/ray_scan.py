"""Footer scans as Ray tasks (``engine="ray"``): 10^5–10^6 shards scanned in batches across a cluster.

A dataset's files are cut into batches of ``SCAN_BATCH`` in listing order; each batch is one Ray task that runs
``zephon.storage.scan.scan_shards`` — the local scan, file by file: a Parquet footer read from local or shared
disk, an object-store footer by one range GET (the batch's footers read ahead, 16 at a time), a JSONL file
read whole. The driver takes the batches back by index and concatenates them, so the shard table (ids,
order, fingerprints) is the local scan's, byte for byte.

Invariant: ``scan_on_ray(ds)[i]`` is ``scan_shard(ds.name, ds.files[i])`` for every ``i``.

Worked example: 1,200 files, ``SCAN_BATCH`` = 512: tasks of files 0–511, 512–1023 and 1024–1199; if the second
finishes first, its 512 infos wait in slot 1 until slot 0's arrive, and the list handed back is slot 0 + 1 + 2.

Object stores: the driver's settings for each bucket travel with the tasks (``zephon.planner.ray_cluster``).
Local
paths must be on storage every node mounts at the same path: a task refuses, naming its node, a file it
cannot see. Scan caches (JSONL line indexes, object metadata) are written under each node's
``$ZEPHON_CACHE_DIR``.

At 10^6 shards that is about 2,000 tasks (measured costs: docs/ray.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from zephon.plan.records import ShardInfo
from zephon.planner.counts.ray_pass import SHARED_FIX
from zephon.planner.ray_cluster import (
    TaskAccess,
    adopt_credentials,
    driver_credentials,
    failpoint,
    ray_session,
    require_visible,
    run_tasks,
)
from zephon.storage.local import SourceFile

__all__ = ["SCAN_BATCH", "scan_on_ray"]

#: Shards a scan task reads: enough to amortize a task's round trip, few enough to spread 10^5 shards widely.
SCAN_BATCH = 512


def scan_on_ray(
    datasets: Sequence[tuple[str, Sequence[SourceFile]]],
    *,
    workers: int | None = None,
    batch: int = SCAN_BATCH,
    on_done: Callable[[int], None] | None = None,
) -> list[list[ShardInfo]]:
    """Scan each ``(dataset name, files)`` as Ray tasks of ``batch`` files; the infos per dataset, in file order.
    ``on_done(n)`` after each task with its number of shards (a progress bar)."""
    arguments: list[tuple[str, list[SourceFile], TaskAccess]] = []
    where: list[int] = []  # the dataset of each task
    for index, (name, files) in enumerate(datasets):
        for lo in range(0, len(files), batch):
            part = list(files[lo : lo + batch])
            arguments.append((name, part, driver_credentials(f.uri for f in part)))
            where.append(index)
    if not arguments:
        return [[] for _ in datasets]

    def advanced(i: int, infos: list[ShardInfo]) -> None:
        if on_done is not None:
            on_done(len(infos))

    with ray_session(workers) as ray:
        results = run_tasks(ray, _scan_remote, arguments, on_result=advanced)
    out: list[list[ShardInfo]] = [[] for _ in datasets]
    for index, infos in zip(where, results, strict=True):
        out[index].extend(infos)
    return out


def _scan_remote(dataset: str, files: list[SourceFile], credentials: TaskAccess) -> list[ShardInfo]:
    """Runs in a Ray worker: one batch scanned as the local scan scans it."""
    from zephon.storage.scan import scan_shards

    failpoint()
    require_visible([f.uri for f in files if f.remote is None], f"dataset {dataset!r}: shard", SHARED_FIX)
    adopt_credentials(credentials)
    return scan_shards(dataset, files)
