"""A selection's kept rows fetched in batches into arrays of their known length, and dedup_on's keep mask."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from zephon.planner.selection import results
from zephon.planner.selection.results import dedup_keep, fetch_columns


def _lexsort_keep(group: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """The mask the selection computed before: a stable lexsort by (group, draw), each group's first kept."""
    order = np.lexsort((draws, group))
    ordered = group[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    keep = np.zeros(len(group), dtype=bool)
    keep[order[first]] = True
    keep[group < 0] = True
    return keep


def test_dedup_keep_is_the_worked_example() -> None:
    keep = dedup_keep(np.array([0, 0, -1, 1, 0]), np.array([5, 2, 9, 7, 2], dtype=np.uint64))
    assert keep.tolist() == [False, True, True, True, False]


def test_dedup_keep_is_the_lexsort_choice_with_ties_and_null_keys() -> None:
    rng = np.random.default_rng(30)
    for case in range(300):
        n = int(rng.integers(0, 400))
        group = rng.integers(-1, int(rng.integers(1, 60)), n).astype(np.int64)
        # Every third case draws from 8 values, so that groups hold equal smallest draws (ties: the first wins).
        high = 8 if case % 3 == 0 else 2**63
        draws = rng.integers(0, high, n).astype(np.uint64)
        assert dedup_keep(group, draws).tolist() == _lexsort_keep(group, draws).tolist(), case
    assert dedup_keep(np.array([-1, -1]), np.array([3, 1], dtype=np.uint64)).tolist() == [True, True]
    assert dedup_keep(np.array([], dtype=np.int64), np.array([], dtype=np.uint64)).tolist() == []


def test_fetch_columns_reads_the_query_in_batches_in_its_order(monkeypatch) -> None:
    monkeypatch.setattr(results, "BATCH_ROWS", 3)
    con = duckdb.connect()
    query = "SELECT CAST(9 - range AS INTEGER) AS shard, range * 10 AS grp FROM range(10) WHERE range <> $skip ORDER BY shard"
    got = fetch_columns(con, query, {"skip": 4}, rows=9, dtypes={"shard": np.int32, "grp": np.int64})
    assert got["shard"].dtype == np.int32 and got["grp"].dtype == np.int64
    assert got["shard"].tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert got["grp"].tolist() == [90, 80, 70, 60, 50, 30, 20, 10, 0]


@pytest.mark.parametrize("rows", [8, 10])
def test_fetch_columns_refuses_a_result_of_another_length(rows) -> None:
    con = duckdb.connect()
    with pytest.raises(AssertionError, match=r"9 rows|more than its 8"):
        fetch_columns(con, "SELECT range AS shard FROM range(9)", {}, rows=rows, dtypes={"shard": np.int64})


@pytest.mark.parametrize("ranked", [False, True])
def test_fetch_selected_lowers_duckdbs_limit_while_the_arrays_fill_and_restores_it(tmp_path, monkeypatch, ranked):
    monkeypatch.setattr(results, "BATCH_ROWS", 1 << 16)
    con = duckdb.connect()
    con.execute("SET temp_directory = ?", [str(tmp_path)])
    con.execute("SET threads = 1")
    con.execute("CREATE TEMP TABLE zephon_selected AS SELECT CAST(range // 1000 AS INTEGER) AS shard, CAST(range % "
                "1000 AS INTEGER) AS row FROM range(200000) ORDER BY hash(range)")  # fmt: skip
    limit = "16MB" if ranked else "4MB"  # the rank's window does not spill: 4 MB is too little for it
    con.execute(f"SET memory_limit = '{limit}'")
    rank = ", 199999 - (shard * 1000 + row) AS rank" if ranked else ""
    seen: list[str] = []

    def each(batch) -> None:  # the limit the fetch runs under, read from a second cursor
        seen.append(con.cursor().execute("SELECT current_setting('memory_limit')").fetchall()[0][0])

    query = f"SELECT shard, row{rank} FROM zephon_selected ORDER BY shard, row"
    got = results.fetch_selected(con, query, {}, ranked=ranked, memory_limit=limit, each=each)
    assert got["shard"].tolist() == np.repeat(np.arange(200), 1000).tolist()
    assert got["row"].tolist() == np.tile(np.arange(1000), 200).tolist()
    if ranked:
        assert got["rank"].tolist() == list(range(199_999, -1, -1))
    # unranked: 4 MB less 200,000 rows of 8 bytes = 2.4 MB (2.2 MiB); ranked: the whole 16 MB (15.2 MiB)
    assert seen == ["15.2 MiB" if ranked else "2.2 MiB"] * 4
    after = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    assert after == ("15.2 MiB" if ranked else "3.8 MiB")
    assert not con.execute("SELECT * FROM duckdb_tables() WHERE table_name = 'zephon_selected'").fetchall()
