"""A partitioned sidecar join's partitions joined as Ray tasks (``engine="ray"``), DuckDB in each task.

``zephon.planner.selection.join`` writes both sides, Hive-partitioned by the key's hash, under the selection's
spill directory; here partition ``p`` becomes one Ray task that opens its own DuckDB (one thread, the
selection's memory limit, a temporary directory of its own under the spill directory), runs exactly the
statements the local loop runs (``counts_query``, ``kept_rows``) and writes the kept rows to
``spill/kept/part-<p>.parquet`` (a temporary renamed into place: a retried task writes the same file). The
driver adds the counts up and reads the kept files back **in partition order**, then runs the final query
(window functions, sort by (shard, row)) as the local path does.

Invariant: the selected rows and counts are the single join's, byte for byte — each partition's kept rows and
counts are what the local loop computes for it, and nothing after depends on the order rows arrive in.

Worked example, P = 3 on 2 nodes: tasks 0 and 1 run at once, 2 when a CPU frees; they finish 1, 0, 2. Totals
(matched, without metadata, without document, side keys, distinct) are summed as they come; the driver reads
part-0, part-1, part-2 into ``zephon_selected`` and the result is the local path's.

The spill directory (``$TMPDIR`` on the driver) must be on storage every node mounts at the same path; a task
refuses, naming its node, a partition file it cannot see. Each task reserves the memory limit in Ray's
scheduler, so a node runs no more joins at once than its memory allows.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Any

import duckdb

from zephon.planner.ray_cluster import failpoint, ray_session, require_visible, run_tasks
from zephon.planner.selection.results import duckdb_limit

__all__ = ["join_on_ray"]

#: How to make the spill directory visible to every node (one-line refusals).
SPILL_FIX = "set TMPDIR on the driver to a directory every node mounts at the same path"


def join_on_ray(
    dataset: str,
    statements: Sequence[tuple[tuple[str, dict[str, Any]], tuple[str, dict[str, Any]]]],
    *,
    spill: str,
    memory_limit: str,
    memory: int,
) -> tuple[list[str], list[int]]:
    """Run each partition's ``statements[p]`` — its counts query and its kept rows' query, each with its
    parameters — as a Ray task reserving ``memory`` bytes; the kept rows' files in partition order, and the
    summed counts. (``join.py`` builds the SQL, so this module needs nothing of it.)"""
    kept_dir = os.path.join(spill, "kept")
    os.makedirs(kept_dir, exist_ok=True)
    outs = [os.path.join(kept_dir, f"part-{p}.parquet") for p in range(len(statements))]
    arguments = [
        (dataset, counts, kept, out, memory_limit, spill) for (counts, kept), out in zip(statements, outs, strict=True)
    ]
    with ray_session() as ray:
        try:
            results = run_tasks(ray, _join_remote, arguments, memory=memory)
        except Exception as exc:  # DuckDB's own errors (memory, disk) are told as the local join tells them
            cause = getattr(exc, "cause", None)
            if isinstance(cause, duckdb.Error):
                raise cause from None
            raise
    totals = [sum(r[i] for r in results) for i in range(len(results[0]))] if results else []
    return outs, totals


def _join_remote(
    dataset: str,
    counts: tuple[str, dict[str, Any]],
    kept: tuple[str, dict[str, Any]],
    out: str,
    memory_limit: str,
    spill: str,
) -> list[int]:
    """Runs in a Ray worker: one partition joined as the local loop joins it; its kept rows written to ``out``."""
    failpoint()
    files = [f for value in counts[1].values() for f in value]
    require_visible(files, f"dataset {dataset!r}: the sidecar join's partition file", SPILL_FIX)
    temp = os.path.join(spill, f"task-{os.path.basename(out)}-{os.getpid()}")
    con = duckdb.connect()
    try:
        con.execute("SET threads = 1")
        con.execute("SET preserve_insertion_order = false")
        con.execute(f"SET memory_limit = '{duckdb_limit(memory_limit)}'")
        con.execute("SET temp_directory = ?", [temp])
        found: Any = con.execute(*counts).fetchone()
        con.execute(f"CREATE TEMP TABLE zephon_kept AS {kept[0]}", kept[1])
        partial = f"{out}.tmp-{os.getpid()}"
        con.execute(f"COPY zephon_kept TO '{partial.replace(chr(39), chr(39) * 2)}' (FORMAT parquet)")
        os.replace(partial, out)
    finally:
        con.close()
        shutil.rmtree(temp, ignore_errors=True)
    return [int(n) for n in found]
