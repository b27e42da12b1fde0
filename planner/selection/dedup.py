"""``dedup_on`` out of core: one document per key, decided partition by partition of the key's hash.

The rule (docs/curricula.md): among a key's documents the one with the smallest seeded draw is kept — draw
``i`` is the ``i``-th output of PCG64 seeded ``(seed, dataset_index, DEDUP_STREAM)`` and belongs to the
``i``-th selected document in (shard, row) order (a tie, all but impossible with 64-bit draws: the first);
every document whose key is NULL is kept. Only "which document of each key has the smallest draw" matters, so
a key's group id need only be equal for equal keys and unequal otherwise: not dense, not ordered, not computed
over all keys at once. One ``dense_rank() OVER (ORDER BY key)`` over all kept rows — a window DuckDB holds
whole, past its memory limit — took 16.5 GB at 10^9 documents (2.5 × 10^8 kept rows).

Steps, over the kept rows' table ``zephon_selected`` (shard, row, [``zephon_order``], ``zephon_dedup``):

1. the rows with a non-NULL key are written once to Parquet under the selection's spill directory, Hive-
   partitioned by ``hash(key) % P`` (``partitions_for``: one partition per ``PARTITION_BYTES`` bytes of DuckDB's
   memory limit a row, 10^7 rows at 2 GB);
2. the final query streams every kept row in (shard, row) order with its partition (-1: a NULL key); as the
   batches arrive, row ``i`` gets draw ``i`` (the generator runs once, in order) and the pair ``(i, draw)`` of a
   row of partition ``p`` is appended to ``p``'s file of pairs — so each file lists its rows in (shard, row)
   order;
3. partition by partition, DuckDB ranks that partition's keys alone (``dense_rank``) and returns the ranks in
   (shard, row) order — the order of its pairs; ``results.dedup_keep`` over (rank, draw) says which rows stay,
   and the others' ``i`` are cleared in one keep flag a row;
4. the kept rows (and their order ranks) are moved to the front of their arrays, in place.

Memory: beside the (shard, row) arrays the plan keeps, one byte a kept row (the keep flags) and one partition at
a time: its pairs, ranks and masks (about 40 bytes a row: 0.4 GB at 10^7) and DuckDB's window under its limit.
Disk (the spill directory, removed with it): the keyed rows' (shard, row, key) in Parquet and 16 bytes a keyed
row of pairs.

Invariant: the keep mask is the one of a single ``dense_rank`` over all kept rows, so the plan's bytes are too:
equal keys hash alike (the partition is one expression over one column), so a key's rows lie in one partition,
where equal keys get equal ranks and unequal keys unequal ones; each row's draw is its global one (by ``i``),
whatever its partition; within a partition ``i`` increases with (shard, row), so of tied draws the same row is
first. The partition count changes nothing but memory and disk (tests force several).

Worked example, P = 2: kept rows (shard, row, key) a0 x, a1 y, a2 NULL, b0 x, b1 y; draws 5 2 9 7 1 for
i = 0..4; say x hashes to partition 0 and y to 1. The stream writes (0, 5) and (3, 7) to file 0, (1, 2) and
(4, 1) to file 1; i = 2 (NULL) stays. Partition 0: ranks [0, 0] (a0, b0), draws [5, 7]: i = 3 dropped.
Partition 1: ranks [0, 0] (a1, b1), draws [2, 1]: i = 1 dropped. Keep flags T F T F T: a0, a2, b1 — what one
rank over all rows (x = 0, y = 1) gives.
"""

from __future__ import annotations

import glob
import math
import os
import shutil
from dataclasses import dataclass
from typing import BinaryIO

import duckdb
import numpy as np
import pyarrow as pa

from zephon.errors import ConfigError
from zephon.planner.selection.results import (
    SELECTED,
    dedup_keep,
    fetch_columns,
    fetch_selected,
    key_order,
    memory_bytes,
)

__all__ = ["DEDUP_STREAM", "PARTITION_BYTES", "DedupRun", "dedup_draws", "fetch_final", "partitions_for"]

#: Third word of the dedup draws' seed: keeps them apart from the epoch orders' ``(seed, dataset, epoch)``.
DEDUP_STREAM = 0x6465_6475_70  # "dedup"

#: Bytes of DuckDB's memory limit per keyed row of one partition: 10^7 rows at 2 GB (about 40 bytes a row in
#: NumPy while the partition is decided, DuckDB's window over it well under its limit).
PARTITION_BYTES = 200

#: One row of a partition's file of pairs: its place among all kept rows, and its draw.
PAIR = np.dtype([("i", "<i8"), ("draw", "<u8")])

#: Kept rows per compaction step (step 4).
_STEP = 1 << 22


@dataclass(frozen=True, kw_only=True, slots=True)
class DedupRun:
    """What the draws derive from, and where and how finely the dedup runs — never what it keeps."""

    seed: int
    dataset_index: int
    #: The selection's own spill directory (the partitioned keys and the files of pairs).
    spill: str
    #: Key-hash partitions (None: ``partitions_for`` the keyed rows).
    partitions: int | None = None

    def __post_init__(self) -> None:
        if self.partitions is not None and (isinstance(self.partitions, bool) or self.partitions < 1):
            raise ConfigError(f"dedup_partitions must be an integer ≥ 1, got {self.partitions!r} — pass one, or None")


def dedup_draws(seed: int, dataset_index: int) -> np.random.PCG64:
    """The generator of the dedup draws: its ``i``-th ``random_raw`` output is the ``i``-th kept row's draw."""
    return np.random.PCG64(np.random.SeedSequence([seed, dataset_index, DEDUP_STREAM]))


def partitions_for(rows: int, limit: str) -> int:
    """Key-hash partitions for ``rows`` keyed rows under DuckDB's memory ``limit`` (at least one)."""
    return max(1, math.ceil(rows * PARTITION_BYTES / memory_bytes(limit)))


def fetch_final(
    con: duckdb.DuckDBPyConnection, *, order: str | None, dedup: DedupRun, memory_limit: str
) -> tuple[dict[str, np.ndarray], int]:
    """A ``dedup_on`` selection's rows out of ``zephon_selected`` (without one: ``results.stream_kept``): shard
    and row in (shard, row) order, with ``order`` their ``rank`` (the place in ``results.key_order``), one row per
    ``zephon_dedup`` key (module docstring); and how many rows there were before the dedup. ``memory_limit``:
    DuckDB's (``ZEPHON_SELECT_MEMORY``), which sizes the partitions and the final fetch
    (``results.fetch_selected``). The table is dropped."""
    rank = f", row_number() OVER (ORDER BY {key_order(order)}) - 1 AS rank" if order else ""
    keyed = int(con.execute(f"SELECT count(zephon_dedup) FROM {SELECTED}").fetchall()[0][0])
    count = dedup.partitions if dedup.partitions is not None else partitions_for(keyed, memory_limit)
    part = f"CAST(hash(zephon_dedup) % {count} AS INTEGER)"
    home = os.path.join(dedup.spill, "dedup")
    keys = os.path.join(home, "keys")
    os.makedirs(home, exist_ok=True)
    if keyed:
        con.execute(
            f"COPY (SELECT shard, row, zephon_dedup, {part} AS zephon_part FROM {SELECTED} WHERE zephon_dedup IS NOT "
            f"NULL) TO '{keys.replace(chr(39), chr(39) * 2)}' (FORMAT parquet, PARTITION_BY (zephon_part))"
        )
    pairs = [os.path.join(home, f"pairs-{p}.bin") for p in range(count)]
    query = (
        f"SELECT shard, row{rank}, CASE WHEN zephon_dedup IS NULL THEN -1 ELSE {part} END AS zephon_part "
        f"FROM {SELECTED} ORDER BY shard, row"
    )
    with _PairWriter(pairs, dedup_draws(dedup.seed, dedup.dataset_index)) as writer:
        result = fetch_selected(con, query, {}, ranked=rank != "", memory_limit=memory_limit, each=writer.add)
    before = len(result["shard"])
    keep = np.ones(before, dtype=bool)
    for p in range(count):
        _decide(con, p, keys, pairs[p], keep)
    shutil.rmtree(home, ignore_errors=True)
    return _compact(result, keep), before


#: Files a process may need open besides the pairs' (DuckDB's, the shards', the interpreter's).
FILE_MARGIN = 256


def allow_open_files(count: int) -> None:
    """Make room for ``count`` files open at once (one a partition: ~1,000 at 10^10 keyed rows and a 2 GB limit,
    past the 1,024 many systems allow by default): the soft ``RLIMIT_NOFILE`` is raised toward the hard one when it
    is lower than ``count + FILE_MARGIN`` — the one process setting the dedup changes; a hard limit too low is one
    line saying what to raise."""
    import resource

    need = count + FILE_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ConfigError(
            f"dedup_on must keep its {count} key-hash partitions' files open at once (and {FILE_MARGIN} more), got "
            f"an open-file limit of {hard} — raise it (ulimit -n {need}) or ZEPHON_SELECT_MEMORY (fewer, larger "
            "partitions)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


class _PairWriter:
    """Step 2: numbers the streamed rows, draws one number each, appends each keyed row's pair to its file."""

    def __init__(self, paths: list[str], bits: np.random.PCG64) -> None:
        self._paths, self._bits, self._at = paths, bits, 0
        self._files: list[BinaryIO] = []

    def __enter__(self) -> _PairWriter:
        allow_open_files(len(self._paths))
        self._files = [open(path, "wb") for path in self._paths]  # noqa: SIM115 - closed in __exit__
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._files:
            handle.close()

    def add(self, batch: pa.RecordBatch) -> None:
        part = batch.column("zephon_part").to_numpy(zero_copy_only=False)
        draws = self._bits.random_raw(len(part))  # one a row, NULL keys too: the draws stay in row order
        keyed = np.flatnonzero(part >= 0)
        if len(keyed):
            order = keyed[np.argsort(part[keyed], kind="stable")]  # by partition, in row order within each
            pairs = np.empty(len(order), dtype=PAIR)
            pairs["i"] = order + self._at
            pairs["draw"] = draws[order]
            cuts = np.cumsum(np.bincount(part[order], minlength=len(self._files)))
            for p, (lo, hi) in enumerate(zip([0, *cuts[:-1].tolist()], cuts.tolist(), strict=True)):
                if hi > lo:
                    self._files[p].write(memoryview(pairs[lo:hi]).cast("B"))
        self._at += len(part)


def _decide(con: duckdb.DuckDBPyConnection, p: int, keys: str, pairs_path: str, keep: np.ndarray) -> None:
    """Step 3 for partition ``p``: rank its keys, keep each key's smallest draw, clear the others' flags."""
    pairs = np.fromfile(pairs_path, dtype=PAIR)
    os.remove(pairs_path)
    files = sorted(glob.glob(os.path.join(keys, f"zephon_part={p}", "*.parquet")))
    if not files:
        if len(pairs):
            raise AssertionError(f"dedup partition {p}: {len(pairs)} streamed rows, no key file")
        return
    ids = np.int32 if len(pairs) < 2**31 else np.int64
    ranked = fetch_columns(
        con,
        "SELECT dense_rank() OVER (ORDER BY zephon_dedup) - 1 AS grp FROM read_parquet($files, hive_partitioning = "
        "false) ORDER BY shard, row",
        {"files": files},
        rows=len(pairs),
        dtypes={"grp": ids},
    )
    kept = dedup_keep(ranked["grp"], pairs["draw"])
    keep[pairs["i"][~kept]] = False


def _compact(result: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    """Step 4: each array's kept entries moved to its front in order, step by step (no second full-size copy)."""
    at = 0
    for lo in range(0, len(keep), _STEP):
        flags = keep[lo : lo + _STEP]
        n = int(flags.sum())
        for array in result.values():
            array[at : at + n] = array[lo : lo + _STEP][flags]  # a copy first: safe, as at <= lo
        at += n
    return {name: array[:at] for name, array in result.items()}
