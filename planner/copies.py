"""Compact copies of the rows a plan reads from its selections' shards (``materialize_selections``).

Why: a selection keeps documents scattered through its shards' row groups, and a Parquet row group is decoded
whole. A selection keeping 30 % of rows therefore decodes ~3.3× the text bytes per token of a plan over the same
documents stored alone (docs/performance.md, "Selections by metadata"). With ``materialize_selections`` the
planner writes, for every shard of a dataset with a selection, the rows the plan reads from it into
``PLAN_DIR/selected/`` (``zephon.plan.format``: ``COPIES_DIR``, ``COPIES_FILE``), and the executor reads those
instead of the source (``zephon.executor.read.selected_copy``): per token it decodes what a plan without selection
decodes.

What a copy holds: every column of the source shard, the same types, for the distinct rows of that shard in
samples.parquet, in row order, plus ``COPY_ROW_COLUMN`` (the source row, int64) last. Row groups hold as many rows
as the source's largest row group, compressed with the codec of the source's largest column (``_codec``: its text,
as a rule), so a copied row costs what it cost in the source to decode. Written with pyarrow in a fixed way, so the
same plan writes the same bytes.

Invariant: row ``i`` of shard ``s``'s copy is row ``source_row[i]`` of ``s`` with its values unchanged, and
``source_row`` is the sorted distinct rows of ``s`` in samples.parquet. The plan itself — samples, shards,
``config`` and ``config_hash`` — is the same with or without copies: inspection, audits, provenance and
continuations name the source; a run yields the same batches, byte for byte.

Example: shard 3 has 1,000 rows; the plan reads rows 950, 7, 2, 7 (row 7 in two epochs).
``selected/0000000003.parquet`` holds 3 rows with ``__zephon_source_row`` = [2, 7, 950]; the executor asked for
(shard 3, row 950) reads row 2 of the copy.

Sources: Parquet shards, local or remote (hf:// and object stores are downloaded whole into the planning cache,
``$ZEPHON_CACHE_DIR/shards``, verified against the plan's size and etag). A JSONL dataset with a selection is
refused: its rows have no column types to copy.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import ConfigError, DatasetError, one_line
from zephon.executor.cores import usable_cores
from zephon.plan.footer import read_footer
from zephon.plan.format import (
    COPIES_DIR,
    COPIES_FILE,
    COPIES_SCHEMA,
    COPY_ROW_COLUMN,
    STORE_SHARD_PREFIX,
    copy_name,
)
from zephon.plan.manifest import PlanCopies
from zephon.plan.records import ShardRef
from zephon.planner.distinct import sorted_distinct
from zephon.planner.prepare import PreparedPlan

__all__ = ["copied_datasets", "write_copies"]


def copied_datasets(prepared: PreparedPlan) -> list[int]:
    """The datasets with a selection, each checked to be copyable (before the plan is laid out)."""
    names = [ds.name for ds in prepared.source.datasets]
    chosen = [i for i in range(len(names)) if prepared.selection(i) is not None]
    if not chosen:
        raise ConfigError(
            "materialize_selections copies the rows of datasets with a selection (where, metadata or dedup_on), "
            "got a plan without any — leave the option out"
        )
    for i in chosen:
        store = prepared.source.datasets[i].token_store
        if store is not None:
            fmt = prepared.shards[i][0].format.removeprefix(STORE_SHARD_PREFIX)
            raise ConfigError(
                f"materialize_selections copies raw text shards, got dataset {names[i]!r}, a {fmt} token store — "
                "leave the option out (the plan reads the selected documents by index, no copy needed)"
            )
        jsonl = [r.uri for r in prepared.shards[i] if r.format != "parquet"]
        if jsonl:
            raise ConfigError(
                f"materialize_selections copies Parquet shards, got dataset {names[i]!r} with shard {jsonl[0]} in "
                f"{prepared.shards[i][0].format} — convert the dataset to Parquet, or leave the option out"
            )
    return chosen


def _planned_rows(samples: list[Path], datasets: list[int]) -> Iterator[tuple[int, np.ndarray]]:
    """(shard id, its sorted distinct planned rows) for the shards of ``datasets``, by shard id.

    One int64 key per planned document of those datasets (shard id × 2^32 + row), made distinct
    (``sorted_distinct``): 3 × 10^7 planned documents take 5.5 s and ~1 GB at the peak."""
    keys = []
    wanted = np.asarray(datasets, dtype=np.int64)
    for file in map(pq.ParquetFile, samples):
        for g in range(file.metadata.num_row_groups):
            part = file.read_row_group(g, columns=["dataset_id", "shard_id", "row"])
            keep = np.isin(part.column(0).to_numpy(), wanted)
            shard = part.column(1).to_numpy()[keep].astype(np.int64)
            keys.append((shard << 32) | part.column(2).to_numpy()[keep].astype(np.int64))
    key = sorted_distinct(np.concatenate(keys)) if keys else np.empty(0, np.int64)
    shard, row = key >> 32, key & 0xFFFFFFFF
    starts = np.flatnonzero(np.diff(shard, prepend=-1))
    ids = shard[starts]
    ends = np.append(starts[1:], len(shard))
    for s, a, b in zip(ids.tolist(), starts.tolist(), ends.tolist(), strict=True):
        yield s, row[a:b]


@contextmanager
def _source(ref: ShardRef) -> Iterator[pq.ParquetFile]:
    """The source shard as planned (size and rows checked; remote: downloaded into the planning cache)."""
    from zephon.executor.read.shard_reader import planning_cache, remote_spec
    from zephon.storage.remote import is_remote_uri

    where = f"dataset {ref.dataset!r}: shard {ref.uri}"
    handle = planning_cache().acquire(remote_spec(ref)) if is_remote_uri(ref.uri) else None
    try:
        path = str(handle.path) if handle is not None else ref.uri
        try:
            size = os.path.getsize(path)
            file = pq.ParquetFile(path, pre_buffer=False)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise DatasetError(
                f"{where} must be a readable Parquet file to copy, got {one_line(exc)} — restore it or re-plan"
            ) from exc
        if size != ref.bytes or file.metadata.num_rows != ref.rows:
            raise DatasetError(
                f"{where} changed since it was scanned: must be {ref.bytes} bytes and {ref.rows} rows, got {size} "
                f"bytes and {file.metadata.num_rows} rows — restore the data and plan again"
            )
        if COPY_ROW_COLUMN in file.schema_arrow.names:
            raise DatasetError(
                f"{where} must not have a column named {COPY_ROW_COLUMN!r} (the copies' source row), got one — "
                "rename it, or leave materialize_selections out"
            )
        try:
            yield file
        finally:
            file.close()
    finally:
        if handle is not None:
            handle.close()


#: Parquet codecs as the footer names them → pyarrow's writer names (LZO cannot be written: snappy instead).
_CODECS = {"UNCOMPRESSED": "none", "SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd",
           "LZ4": "lz4", "LZ4_RAW": "lz4", "LZO": "snappy"}  # fmt: skip


def _codec(meta: pq.FileMetaData) -> str:
    """The codec of the source's largest column chunk in its first row group (snappy for an empty file)."""
    if meta.num_row_groups == 0 or meta.num_columns == 0:
        return "snappy"
    group = meta.row_group(0)
    largest = max(range(meta.num_columns), key=lambda i: group.column(i).total_uncompressed_size)
    return _CODECS.get(group.column(largest).compression.upper(), "snappy")


def _copy_shard(ref: ShardRef, rows: np.ndarray, out: Path) -> None:
    """Write the copy of ``rows`` of shard ``ref`` to ``out`` (see the module docstring)."""
    with _source(ref) as file:
        meta = file.metadata
        counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        per_group = max(1, max(counts, default=1))
        groups = np.searchsorted(starts, rows, side="right") - 1
        schema = file.schema_arrow.append(pa.field(COPY_ROW_COLUMN, pa.int64(), nullable=False))
        pending: list[pa.Table] = []
        held = 0
        codec = _codec(meta)
        with pq.ParquetWriter(out, schema, compression=codec, write_statistics=[COPY_ROW_COLUMN]) as writer:
            for g in np.unique(groups).tolist():
                picked = rows[groups == g]
                try:
                    table = file.read_row_group(g, use_threads=False)
                except (OSError, ValueError, pa.ArrowException) as exc:
                    raise DatasetError(
                        f"dataset {ref.dataset!r}: shard {ref.uri} row group {g} must decode to be copied, got "
                        f"{one_line(exc)} — the file is corrupt: restore it from its source, then re-plan"
                    ) from exc
                part = table.take(pa.array(picked - starts[g])).append_column(
                    schema.field(COPY_ROW_COLUMN), pa.array(picked, pa.int64())
                )
                pending.append(part)
                held += len(part)
                if held >= per_group:  # whole row groups of per_group rows; the rest waits for the next
                    joined = pa.concat_tables(pending)
                    full = held // per_group * per_group
                    writer.write_table(joined.slice(0, full), row_group_size=per_group)
                    pending, held = [joined.slice(full)], held - full
            if held:
                writer.write_table(pa.concat_tables(pending), row_group_size=per_group)


def _copy_one(plan_dir: Path, ref: ShardRef, rows: np.ndarray) -> tuple[int, int, str]:
    """Copy one shard; its copy's (row groups, bytes, fingerprint), from one read of its footer."""
    out = plan_dir / COPIES_DIR / copy_name(ref.shard_id)
    _copy_shard(ref, rows, out)
    footer = read_footer(out)
    return footer.metadata().num_row_groups, footer.size, footer.fingerprint


def write_copies(
    prepared: PreparedPlan, datasets: list[int], plan_dir: Path, samples: list[Path]
) -> dict[str, PlanCopies]:
    """Copy the planned rows of the shards of ``datasets`` (``copied_datasets``) into ``plan_dir`` (``samples``:
    its written samples files) and write ``COPIES_FILE``; plan.json's ``selected_copies`` per dataset name.

    Shards are copied side by side, one per usable core (pyarrow decodes and encodes without the GIL); each copy is
    its own file, so the bytes do not depend on the order they finish in."""
    refs = {r.shard_id: r for i in datasets for r in prepared.shards[i]}
    (plan_dir / COPIES_DIR).mkdir()
    work = [(refs[shard_id], rows) for shard_id, rows in _planned_rows(samples, datasets)]
    index: dict[str, list[Any]] = {f.name: [] for f in COPIES_SCHEMA}
    totals: dict[int, list[int]] = {i: [0, 0, 0, 0] for i in datasets}
    with ThreadPoolExecutor(max(1, min(len(work), usable_cores())), thread_name_prefix="zephon-copy") as pool:
        done = pool.map(lambda item: _copy_one(plan_dir, *item), work)
        for (ref, rows), (row_groups, size, fingerprint) in zip(work, done, strict=True):
            index["shard_id"].append(ref.shard_id)
            index["file"].append(copy_name(ref.shard_id))
            index["rows"].append(len(rows))
            index["bytes"].append(size)
            index["row_groups"].append(row_groups)
            index["fingerprint"].append(fingerprint)
            for k, v in enumerate((1, len(rows), size, ref.bytes)):
                totals[ref.dataset_id][k] += v
    pq.write_table(pa.table(index, schema=COPIES_SCHEMA), plan_dir / COPIES_FILE, compression="zstd")
    names = [ds.name for ds in prepared.source.datasets]
    return {names[i]: PlanCopies(shards=t[0], rows=t[1], bytes=t[2], source_bytes=t[3]) for i, t in totals.items()}
