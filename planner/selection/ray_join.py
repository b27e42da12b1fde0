"""A partitioned sidecar join's partitions joined as Ray tasks (``engine="ray"``), DuckDB in each task.

``zephon.planner.selection.join`` writes both sides, Hive-partitioned by the key's hash, under the selection's
spill directory; here partition ``p`` becomes one Ray task that opens its own DuckDB (one thread, the
selection's memory limit, a temporary directory of its own under the spill directory), runs exactly the
statements the local loop runs (``joined_table``, ``COUNTS_SQL``, ``kept_rows``) and writes the kept rows to
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
from zephon.planner.selection.join import COUNTS_SQL, JoinPlan, Relation, joined_table, kept_rows, memory_bytes
from zephon.recipe.selection import Selection

__all__ = ["join_on_ray"]

#: How to make the spill directory visible to every node (one-line refusals).
SPILL_FIX = "set TMPDIR on the driver to a directory every node mounts at the same path"


def join_on_ray(
    selection: Selection,
    pairs: Sequence[tuple[Relation, Relation]],
    plan: JoinPlan,
    *,
    spill: str,
    memory_limit: str,
) -> tuple[list[str], list[int]]:
    """Join each partition pair as a Ray task; the kept rows' files in partition order, and the summed counts."""
    assert selection.key is not None
    kept_dir = os.path.join(spill, "kept")
    os.makedirs(kept_dir, exist_ok=True)
    outs = [os.path.join(kept_dir, f"part-{p}.parquet") for p in range(len(pairs))]
    arguments = [
        (selection.dataset, selection.key, docs, meta, plan, out, memory_limit, spill)
        for (docs, meta), out in zip(pairs, outs, strict=True)
    ]
    with ray_session() as ray:
        try:
            counts = run_tasks(ray, _join_remote, arguments, memory=memory_bytes(memory_limit))
        except Exception as exc:  # DuckDB's own errors (memory, disk) are told as the local join tells them
            cause = getattr(exc, "cause", None)
            if isinstance(cause, duckdb.Error):
                raise cause from None
            raise
    totals = [sum(c[i] for c in counts) for i in range(5)]
    return outs, totals


def _join_remote(
    dataset: str,
    key: str,
    documents: Relation,
    meta: Relation,
    plan: JoinPlan,
    out: str,
    memory_limit: str,
    spill: str,
) -> list[int]:
    """Runs in a Ray worker: one partition joined as the local loop joins it; its kept rows written to ``out``."""
    failpoint()
    files = [f for relation in (documents, meta) for value in relation.params.values() for f in value]
    require_visible(files, f"dataset {dataset!r}: the sidecar join's partition file", SPILL_FIX)
    temp = os.path.join(spill, f"task-{os.path.basename(out)}-{os.getpid()}")
    con = duckdb.connect()
    try:
        con.execute("SET threads = 1")
        con.execute("SET preserve_insertion_order = false")
        con.execute(f"SET memory_limit = '{memory_limit}'")
        con.execute("SET temp_directory = ?", [temp])
        con.execute(*joined_table(key, documents, meta, plan))
        counts: Any = con.execute(COUNTS_SQL).fetchone()
        partial = f"{out}.tmp-{os.getpid()}"
        con.execute(f"COPY ({kept_rows(plan)}) TO '{partial.replace(chr(39), chr(39) * 2)}' (FORMAT parquet)")
        os.replace(partial, out)
    finally:
        con.close()
        shutil.rmtree(temp, ignore_errors=True)
    return [int(n) for n in counts]
