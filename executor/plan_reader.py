"""Reading a plan bundle on a training node (pyarrow only; never Polars or DuckDB), opened through the one
door that checks it (``zephon.plan.bundle.open_bundle``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zephon.errors import PlanFormatError
from zephon.executor.sorted_sets import non_decreasing
from zephon.plan.bundle import CheckedBundle, CheckedFile, open_bundle, read_row_group
from zephon.plan.format import COPIES_DIR, deal_column
from zephon.plan.manifest import Manifest, plan_dir_path
from zephon.plan.records import ShardRef, shard_refs
from zephon.plan.row_groups import RowGroups

#: Documents in the first chunk ``PlanBundle.chunks`` yields (then doubling up to the chunk size).
FIRST_CHUNK = 64


@dataclass(frozen=True, kw_only=True, slots=True)
class SampleChunk:
    """Consecutive plan positions ``[start, start + len)`` with where each document lives."""

    start: int
    dataset_id: np.ndarray
    shard_id: np.ndarray
    row: np.ndarray
    #: Estimated plans read with ``lanes``: each document's packing lane, its deal modulo the lanes (int64).
    lane: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.shard_id)


def bundle_stamp(plan_dir: str | Path) -> tuple[tuple[str, int, int], ...]:
    """Every file under the bundle with its size and modification time (a stat each: cheap next to the check)."""
    root = Path(plan_dir)
    out = []
    for path in sorted(root.rglob("*")):
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_file():
            out.append((str(path.relative_to(root)), st.st_size, st.st_mtime_ns))
    return tuple(out)


class PlanBundle:
    """A checked plan bundle (``zephon.plan.bundle.open_bundle``): manifest, shard table and chunked samples.

    Opening it checks plan.json (its integrity record and config_hash) and the footer, schema, row count and
    fingerprint of every Parquet file, so a damaged bundle is one ``PlanFormatError`` naming the file.
    """

    def __init__(self, plan_dir: str | Path) -> None:
        #: the bundle's files as they were when it was checked (``stamp``): a holder of the bundle checks it
        #: again when they change (``changed``)
        self.stamp = bundle_stamp(plan_dir_path(plan_dir))
        self.checked: CheckedBundle = open_bundle(plan_dir)
        self.path = self.checked.path
        self.manifest: Manifest = self.checked.manifest
        self.shards: list[ShardRef] = shard_refs(self.checked.shards.read())
        self.sample_files = [f.path for f in self.checked.samples]
        #: Shard id → the compact copy of its planned rows (``materialize_selections``), read instead of it.
        self.copies: dict[int, ShardRef] = copy_refs(self.path, self.checked.copies, self.shards)

    def changed(self) -> bool:
        """Whether a file of the bundle was changed, added or removed since it was checked."""
        return bundle_stamp(self.path) != self.stamp

    @property
    def num_documents(self) -> int:
        return self.manifest.totals.documents

    @property
    def dataset_names(self) -> list[str]:
        return self.manifest.dataset_names

    def chunks(
        self,
        chunk_size: int,
        start: int = 0,
        *,
        ramp: int = FIRST_CHUNK,
        lanes: int | None = None,
        units: np.ndarray | None = None,
        budget: int = 0,
        grow: int = 1,
    ) -> Iterator[SampleChunk]:
        """Yield the samples in plan order from position ``start``, ``chunk_size`` documents at a time.

        The first chunks are smaller — ``ramp`` documents, doubling up to ``chunk_size`` — so the first batch
        waits for a few documents, not a whole chunk (chunk sizes change speed only, never the data). With
        ``units`` (a document's size by shard id, ``zephon.executor.chunk_sizes``) every chunk after the first of
        ``chunk_size`` takes more documents while their units add up to at most ``budget``, up to ``grow ×
        chunk_size``: sizes that follow the plan alone. Seeking to ``start`` skips whole row groups by their row
        counts (footer metadata): no data before the row group holding ``start`` is read. With ``lanes`` (an
        estimated plan) each chunk carries the packing lane of its documents among ``lanes``
        (``zephon.planner.lane_dealing``).
        """
        columns = ["dataset_id", "shard_id", "row"]
        if lanes is not None:
            columns.append(deal_column(self.manifest.format_version))
        first_row = 0
        size = max(1, min(ramp, chunk_size))
        grows = False  # a chunk of ``chunk_size`` was read: the later ones may grow (never the first)
        for file in self.checked.samples:
            if first_row + file.rows <= start:  # a part before the start: its footer is not read
                first_row += file.rows
                continue
            reader = file.open()
            meta = reader.metadata
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                if first_row + n <= start:
                    first_row += n
                    continue
                table = read_row_group(reader, file.path, g, columns)
                lo = max(0, start - first_row)
                cum = None if units is None else np.cumsum(units[table.column(1).to_numpy()])
                while lo < n:
                    take = size
                    if cum is not None and grows:
                        fit = int(np.searchsorted(cum, (cum[lo - 1] if lo else 0) + budget, side="right")) - lo
                        take = max(size, min(grow * chunk_size, fit))
                    grows = grows or size == chunk_size
                    part = table.slice(lo, take)
                    lane = None
                    if lanes is not None:
                        lane = part.column(3).to_numpy() % lanes
                    yield SampleChunk(
                        start=first_row + lo,
                        dataset_id=part.column(0).to_numpy(),
                        shard_id=part.column(1).to_numpy(),
                        row=part.column(2).to_numpy(),
                        lane=lane,
                    )
                    lo += len(part)
                    size = min(2 * size, chunk_size)
                first_row += n


class RowGroupIndex:
    """Random access to a sorted Parquet file (or the consecutive parts of a big plan's samples) by row number or
    by a sorted key column, a row group at a time (``zephon.plan.row_groups``).

    The first value of ``key`` in a row group comes from the footer statistics, found by a binary search over the
    groups that reads only the footers it probes, so a lookup reads one row group (the last few are cached):
    seeking to any plan position or token offset costs one decode, and one part's footer in a plan of parts.
    """

    def __init__(self, files: Sequence[CheckedFile], columns: list[str], cache_groups: int = 4) -> None:
        self._groups = RowGroups(files)
        self._columns = columns
        self.first_row = self._groups.first_row
        self.num_rows = self._groups.num_rows
        self._cache: dict[int, dict[str, np.ndarray]] = {}
        self._order: list[int] = []
        self._cache_groups = cache_groups

    def group(self, g: int) -> dict[str, np.ndarray]:
        hit = self._cache.get(g)
        if hit is not None:
            return hit
        table = self._groups.read(g, self._columns)
        data = {name: table.column(name).to_numpy() for name in self._columns}
        self._cache[g] = data
        self._order.append(g)
        if len(self._order) > self._cache_groups:
            self._cache.pop(self._order.pop(0), None)
        return data

    def rows(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Columns at the given row numbers."""
        out = {name: np.empty(len(indices), dtype=np.int64) for name in self._columns}
        groups = np.searchsorted(self.first_row, indices, side="right") - 1
        for g in np.unique(groups).tolist():
            sel = np.flatnonzero(groups == g)
            data = self.group(g)
            local = indices[sel] - self.first_row[g]
            for name in self._columns:
                out[name][sel] = data[name][local]
        return out

    def find(self, key_column: str, value: int, side: str = "right") -> int:
        """Row number of the last row whose ``key_column`` ≤ value (``side="right"``) in the sorted file."""
        return int(self.find_many(key_column, np.array([value], dtype=np.int64), side)[0])

    def find_many(self, key_column: str, values: np.ndarray, side: str = "right") -> np.ndarray:
        """``find`` for many values at once: one binary search per row group the values fall in, not per value.

        Ascending values (the executor's calls: a window's token offsets, its sequences) go by runs: the run's
        group is the last whose minimum is ≤ its first value (``RowGroups.last_at_most``: footers only), and the
        run ends at the first value ≥ the next group's minimum (one ``searchsorted``) — a few Python steps per
        group, none per value (an exact plan's 24 M tokens: 4-8 ms of the training thread's CPU in all, against
        22-46 ms checking each value). Values in another order are sorted first and their rows put back: the
        row of a value never depends on the others.

        Example: groups starting at key 0, 100, 200; values [5, 7, 150, 150, 230] → runs (0: [5, 7]),
        (1: [150, 150]), (2: [230]), each searched in its group's column once."""
        values = np.asarray(values, dtype=np.int64)
        if not non_decreasing(values):
            order = np.argsort(values, kind="stable")
            out = np.empty(len(values), dtype=np.int64)
            out[order] = self.find_many(key_column, values[order], side)
            return out
        out = np.empty(len(values), dtype=np.int64)
        count, minimum, lo = self._groups.count, self._groups.minimum, 0
        while lo < len(values):
            g = self._groups.last_at_most(key_column, int(values[lo]))
            hi = len(values) if g + 1 == count else int(np.searchsorted(values, minimum(g + 1, key_column)))
            hi = max(hi, lo + 1)  # a guard only: the key is sorted, so the next group's minimum exceeds values[lo]
            local = np.searchsorted(self.group(g)[key_column], values[lo:hi], side=side) - 1  # type: ignore[call-overload]
            out[lo:hi] = self.first_row[g] + local
            lo = hi
        return out


def copy_refs(plan_dir: Path, copies: CheckedFile | None, shards: list[ShardRef]) -> dict[int, ShardRef]:
    """Source shard id → its copy as a shard (uri: the copy's path; rows, bytes, fingerprint: the copy's)."""
    if copies is None:
        return {}
    table = copies.read().to_pydict()
    by_id = {s.shard_id: s for s in shards}
    out: dict[int, ShardRef] = {}
    for i, shard_id in enumerate(table["shard_id"]):
        source = by_id.get(shard_id)
        if source is None:
            raise PlanFormatError(
                f"{copies.path} row {i} must name a shard of the plan, got shard_id {shard_id} — "
                "restore the plan bundle's selected/ directory, or re-plan"
            )
        out[shard_id] = ShardRef(
            shard_id=shard_id,
            dataset_id=source.dataset_id,
            dataset=source.dataset,
            uri=str(plan_dir / COPIES_DIR / table["file"][i]),
            format="parquet",
            rows=table["rows"][i],
            bytes=table["bytes"][i],
            row_groups=table["row_groups"][i],
            fingerprint=table["fingerprint"][i],
        )
    return out
