"""A ``where`` alone, one query per range of shards (planner/selection/ranges.py), with its kept rows held in
memory or in an unnamed temporary file (planner/selection/selected.py).

Expected rows are recomputed without DuckDB (every shard read with pyarrow, the predicate applied in NumPy);
plans are compared byte for byte between the rows in memory in one range and in a file over ranges of one shard.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import selection_under_full_disk

from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.planner.prepare import shard_refs
from zephon.planner.selection import evaluate, ranges, selected
from zephon.planner.selection.evaluate import select_rows
from zephon.planner.selection.ranges import shard_ranges
from zephon.planner.selection.selected import RowColumnWriter
from zephon.work import MixtureSpec, StaticMixtureWorkSource

SIZES = [40, 0, 75, 13, 1, 60, 33]  # rows per shard: an empty shard, a one-row shard


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """web/: 7 shards of ``SIZES`` rows (row groups of 9) with score 0-9 and text."""
    root = tmp_path_factory.mktemp("ranges") / "web"
    root.mkdir()
    rng = np.random.default_rng(11)
    for s, n in enumerate(SIZES):
        score = rng.integers(0, 10, n).astype(np.int16)
        table = pa.table({"score": pa.array(score, pa.int16()), "text": [f"d{s}-{r}" for r in range(n)]})
        pq.write_table(table, root / f"{s}.parquet", row_group_size=9)
    return root


def _source(ds: Dataset, **kw: object) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=3, **kw)  # type: ignore[arg-type]


def _expected(corpus: Path, keep) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """Counts per shard and the kept rows in (shard, row) order, recomputed with pyarrow and NumPy."""
    counts, rows = [], []
    for s in range(len(SIZES)):
        score = pq.read_table(corpus / f"{s}.parquet").column("score").to_numpy()
        picked = np.flatnonzero(keep(score))
        counts.append(len(picked))
        rows.append(picked)
    return np.array(counts), np.concatenate(rows).astype(np.int32)


def test_shard_ranges_hold_at_most_the_rows_asked_and_a_bigger_shard_alone() -> None:
    assert shard_ranges([4, 4, 4], 8) == [(0, 2), (2, 3)]  # the module docstring's example
    assert shard_ranges([40, 0, 75, 13, 1, 60, 33], 50) == [(0, 2), (2, 3), (3, 5), (5, 6), (6, 7)]
    assert shard_ranges([5, 5], 1) == [(0, 1), (1, 2)]
    assert shard_ranges([], 8) == []


@pytest.mark.parametrize("memory_bytes", [1 << 30, 8])
def test_a_row_column_reads_back_what_was_appended_in_memory_or_in_a_file(monkeypatch, memory_bytes) -> None:
    monkeypatch.setattr(selected, "MEMORY_BYTES", memory_bytes)
    monkeypatch.setattr(selected, "BLOCK_ROWS", 7)  # many blocks, the last one short
    rng = np.random.default_rng(2)
    pieces = [rng.integers(0, 2**31 - 1, n).astype(np.int32) for n in (3, 0, 50, 1, 19)]
    writer = RowColumnWriter()
    for p in pieces:
        writer.append(p)
    column = writer.finish()
    whole = np.concatenate(pieces)
    assert column.in_file == (memory_bytes == 8) and len(column) == len(whole)
    assert np.array_equal(column.array(), whole)
    for lo, hi in [(0, 73), (5, 6), (70, 73), (13, 13), (20, 50)]:
        assert np.array_equal(column.slice(lo, hi), whole[lo:hi]), (lo, hi)
    index = rng.integers(0, len(whole), 40)
    assert np.array_equal(column.take(index), whole[index])
    assert np.array_equal(column.take(np.array([72, 0, 72])), whole[[72, 0, 72]])
    assert len(column.take(np.zeros(0, np.int64))) == 0
    copy = pickle.loads(pickle.dumps(column))  # a file cannot cross processes: its values do
    assert not copy.in_file and np.array_equal(copy.array(), whole)


@pytest.mark.parametrize(("query_rows", "memory_bytes"), [(None, 1 << 30), (1, 1 << 30), (50, 16), (1, 4)])
def test_where_by_range_keeps_exactly_the_rows_the_predicate_keeps(corpus, monkeypatch, query_rows, memory_bytes):
    monkeypatch.setattr(selected, "MEMORY_BYTES", memory_bytes)
    ds = Dataset.from_path("web", corpus, where="score >= 4 AND score <> 7")
    assert ds.selection is not None
    refs = shard_refs(_source(ds), progress=False)[0]
    chosen = select_rows(ds.selection, refs, seed=3, dataset_index=0, query_rows=query_rows, threads=2)
    counts, rows = _expected(corpus, lambda s: (s >= 4) & (s != 7))
    assert chosen.rows.in_file == (memory_bytes < 1 << 30)
    assert np.array_equal(chosen.counts, counts) and np.array_equal(chosen.row, rows)
    assert np.array_equal(chosen.shard, np.repeat(np.arange(len(SIZES)), counts))
    for j, picked in chosen.by_shard():
        assert np.array_equal(picked, rows[counts[:j].sum() : counts[: j + 1].sum()])
    report = chosen.report
    assert (report.rows, report.selected, report.skipped_by_where) == (sum(SIZES), len(rows), sum(SIZES) - len(rows))


def test_a_range_out_of_order_is_detected_so_it_is_read_again_sorted(corpus) -> None:
    con = duckdb.connect()
    paths = [str(corpus / f"{s}.parquet") for s in range(3)]
    base = (
        "SELECT CAST(file_index AS INTEGER) AS shard, CAST(file_row_number AS INTEGER) AS row "
        "FROM read_parquet($paths, file_row_number = true)"
    )
    assert ranges._kept(con, f"{base} ORDER BY shard DESC, row", {"paths": paths}, 3) is None
    assert ranges._kept(con, f"{base} ORDER BY shard, row DESC", {"paths": paths}, 3) is None
    counts, pieces = ranges._kept(con, f"{base} ORDER BY shard, row", {"paths": paths}, 3) or (None, [])
    assert list(counts) == SIZES[:3] and np.array_equal(np.concatenate(pieces), np.r_[0:40, 0:75])


def _digest(plan: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(plan.rglob("*.parquet"))}


@pytest.mark.parametrize(
    "kw",
    [
        {"where": "score % 3 <> 1"},
        {"where": "score > 2", "order_by": "score DESC", "order_window": 7},  # streamed in key order, no rank
        {"order_by": "(score * 7) % 10"},
    ],
)
def test_plans_are_byte_identical_with_the_rows_in_a_file_and_one_shard_a_query(corpus, tmp_path, monkeypatch, kw):
    ds = Dataset.from_path("web", corpus, **kw)
    one = _source(ds, epochs=3).plan(tmp_path / "memory")
    monkeypatch.setattr(selected, "MEMORY_BYTES", 4)
    monkeypatch.setattr(selected, "BLOCK_ROWS", 5)
    monkeypatch.setattr(evaluate, "QUERY_ROWS", 1)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)
    other = _source(ds, epochs=3).plan(tmp_path / "file")
    assert _digest(one) == _digest(other) and len(_digest(one)) >= 2
    assert (one / "plan.json").read_text() == (other / "plan.json").read_text()
    assert os.listdir(tmp_path / "scratch") == []  # the rows' file has no name; the spill directory is removed


def test_a_bad_where_is_one_line_naming_the_column_on_the_range_path(corpus) -> None:
    ds = Dataset.from_path("web", corpus, where="quality > 0.5")
    assert ds.selection is not None
    refs = shard_refs(_source(ds), progress=False)[0]
    with pytest.raises(ConfigError, match=r"where names column 'quality', which the dataset lacks") as e:
        select_rows(ds.selection, refs, seed=3, dataset_index=0, query_rows=1)
    assert "\n" not in str(e.value)


def test_a_range_that_came_out_of_order_is_read_again_sorted_with_the_same_result(corpus, monkeypatch) -> None:
    real, queries = ranges._kept, []

    def unordered_first(con, query, params, shards):  # type: ignore[no-untyped-def]
        queries.append(query)
        return None if "ORDER BY" not in query else real(con, query, params, shards)  # as if DuckDB reordered it

    monkeypatch.setattr(ranges, "_kept", unordered_first)
    ds = Dataset.from_path("web", corpus, where="score < 5")
    assert ds.selection is not None
    refs = shard_refs(_source(ds), progress=False)[0]
    chosen = select_rows(ds.selection, refs, seed=3, dataset_index=0, query_rows=100)
    counts, rows = _expected(corpus, lambda s: s < 5)
    assert np.array_equal(chosen.counts, counts) and np.array_equal(chosen.row, rows)
    assert len(queries) == 2 * len(shard_ranges(SIZES, 100)) and all("ORDER BY" in q for q in queries[1::2])


def test_kept_rows_that_cannot_be_written_fail_in_one_line_and_leave_nothing(corpus, tmp_path) -> None:
    line, scratch = selection_under_full_disk(
        corpus,
        tmp_path,
        dataset='sys.argv[1], where="score >= 2"',
        setup="from zephon.planner.selection import selected\nselected.MEMORY_BYTES = 8",  # kept rows: file at once
        limit=100,  # 25 rows fit, the ~170 kept do not
        options="query_rows=50",
    )
    assert line.startswith(f"DatasetError dataset 'web': the selection's spill directory {scratch}/zephon-select-")
    assert "the kept rows take" in line and "File too large — free space there or point TMPDIR" in line
    assert "\n" not in line and list(scratch.iterdir()) == []


def test_jsonl_shards_are_read_into_arrow_one_range_at_a_time_with_the_same_rows(corpus, tmp_path, monkeypatch):
    """Shards read into Arrow first (JSONL here; remote Parquet the same way, tests/planner/test_selection_remote.py)
    are read and registered range by range: every read holds one range's shards, and the rows are the predicate's."""
    web = tmp_path / "jsonl"
    web.mkdir()
    for s in range(len(SIZES)):
        score = pq.read_table(corpus / f"{s}.parquet").column("score").to_pylist()
        (web / f"{s}.jsonl").write_text("".join(f'{{"score": {v}, "text": "d{s}-{r}"}}\n' for r, v in enumerate(score)))
    reads: list[int] = []
    real = ranges.read_documents

    def counted(dataset, refs, wanted):  # type: ignore[no-untyped-def]
        reads.append(len(refs))
        return real(dataset, refs, wanted)

    monkeypatch.setattr(ranges, "read_documents", counted)
    monkeypatch.setattr(selected, "MEMORY_BYTES", 16)
    ds = Dataset.from_path("web", web, where="score >= 4 AND score <> 7")
    assert ds.selection is not None
    refs = shard_refs(_source(ds), progress=False)[0]
    chosen = select_rows(ds.selection, refs, seed=3, dataset_index=0, query_rows=50)
    counts, rows = _expected(corpus, lambda s: (s >= 4) & (s != 7))
    assert np.array_equal(chosen.counts, counts) and np.array_equal(chosen.row, rows) and chosen.rows.in_file
    assert reads == [hi - lo for lo, hi in shard_ranges(SIZES, 50)]  # [2, 1, 2, 1, 1]: never the whole dataset
    with pytest.raises(ConfigError, match=r"where names column 'quality', which the dataset lacks — it has score, "):
        bad = Dataset.from_path("web", web, where="quality > 1")
        assert bad.selection is not None
        select_rows(bad.selection, refs, seed=3, dataset_index=0, query_rows=50)
