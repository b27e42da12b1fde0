"""``dedup_on`` partitioned by the key's hash (planner/selection/dedup.py) keeps what one rank over all rows keeps.

The expected rows are recomputed here without DuckDB: every document read with pyarrow, ``where`` applied in
NumPy, one draw per kept document in (shard, row) order, and each key's smallest draw kept (NULL keys all kept).
Keys repeat across every shard, so each key's documents lie in many shards and (with several partitions) the
rows of one shard are decided in several partitions.
"""

from __future__ import annotations

import os
import subprocess
import sys
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
from zephon.planner.selection import dedup as dedup_module
from zephon.planner.selection import results
from zephon.planner.selection.dedup import DedupRun, dedup_draws, fetch_final, partitions_for
from zephon.planner.selection.evaluate import select_rows
from zephon.work import MixtureSpec, StaticMixtureWorkSource

SHARDS, ROWS = 6, 50


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """web/: id (int64), score 0-5, topic (a string key shared by documents of every shard; NULL for one row in
    eleven), near (int key: ``id // 3`` — runs of three within a shard); side/: a ``cluster`` per id (NULL for
    one id in seven), clusters spread over every shard."""
    root = tmp_path_factory.mktemp("dedup")
    (root / "web").mkdir()
    (root / "side").mkdir()
    rng = np.random.default_rng(5)
    for s in range(SHARDS):
        ids = np.arange(s * ROWS, (s + 1) * ROWS, dtype=np.int64)
        topic = [None if i % 11 == 3 else f"t{(i * 7) % 13}" for i in ids.tolist()]
        table = pa.table({"id": ids, "score": rng.integers(0, 6, ROWS).astype(np.int8), "topic": topic,
                          "near": ids // 3, "text": [f"doc {i}" for i in ids.tolist()]})  # fmt: skip
        pq.write_table(table, root / "web" / f"{s}.parquet", row_group_size=16)
    keys = rng.permutation(SHARDS * ROWS)
    cluster = [None if k % 7 == 2 else int(k % 17) for k in keys.tolist()]
    pq.write_table(pa.table({"id": pa.array(keys, pa.int64()), "cluster": pa.array(cluster, pa.int32())}),
                   root / "side" / "c.parquet")  # fmt: skip
    return root


def _expected(corpus: Path, key: str, keep_where: np.ndarray | None, seed: int) -> list[tuple[int, int]]:
    """The rule of docs/curricula.md, recomputed: (shard, row) pairs kept, in (shard, row) order."""
    docs = pa.concat_tables(pq.read_table(corpus / "web" / f"{s}.parquet") for s in range(SHARDS)).to_pydict()
    if key == "cluster":
        side = pq.read_table(corpus / "side" / "c.parquet").to_pydict()
        by_id = dict(zip(side["id"], side["cluster"], strict=True))
        values = [by_id.get(i) for i in docs["id"]]
    else:
        values = docs[key]
    pairs = [(s, r) for s in range(SHARDS) for r in range(ROWS)]
    kept = [i for i in range(len(pairs)) if keep_where is None or keep_where[i]]
    draws = dedup_draws(seed, 0).random_raw(len(kept))
    best: dict[object, tuple[int, int]] = {}
    for n, i in enumerate(kept):
        if values[i] is not None and (values[i] not in best or draws[n] < best[values[i]][0]):
            best[values[i]] = (int(draws[n]), i)
    chosen = {i for _, i in best.values()} | {i for i in kept if values[i] is None}
    return [pairs[i] for i in sorted(chosen)]


def _refs(ds: Dataset):
    return shard_refs(StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=3),
                      progress=False)[0]  # fmt: skip


def _pairs(chosen) -> list[tuple[int, int]]:
    return list(zip(chosen.shard.tolist(), chosen.row.tolist(), strict=True))


@pytest.mark.parametrize("key", ["topic", "near"])
def test_every_dedup_partition_count_keeps_each_keys_smallest_draw(corpus, key) -> None:
    ds = Dataset.from_path("web", corpus / "web", where="score >= 1", dedup_on=key)
    assert ds.selection is not None
    refs = _refs(ds)
    scores = np.concatenate([pq.read_table(corpus / "web" / f"{s}.parquet")["score"].to_numpy() for s in range(6)])
    expected = _expected(corpus, key, scores >= 1, seed=3)
    for partitions in (1, 2, 3, 7, 40):  # 40 partitions: more than the 13 topics, many empty
        chosen = select_rows(ds.selection, refs, seed=3, dataset_index=0, dedup_partitions=partitions)
        assert _pairs(chosen) == expected, partitions
        assert chosen.report.skipped_by_dedup == int((scores >= 1).sum()) - len(expected)
    nulls = [p for p in expected if p[0] * ROWS + p[1] in {i for i in range(300) if i % 11 == 3}]
    if key == "topic":  # every NULL-key document that passed where is kept; 13 topics keep one each
        assert len(nulls) == sum(1 for i in range(300) if i % 11 == 3 and scores[i] >= 1)
        assert len(expected) == len(nulls) + 13


def test_a_sidecar_key_deduplicates_alike_in_join_and_dedup_partitions(corpus) -> None:
    ds = Dataset.from_path("web", corpus / "web", metadata=corpus / "side", key="id", dedup_on="cluster")
    assert ds.selection is not None
    refs = _refs(ds)
    expected = _expected(corpus, "cluster", None, seed=9)
    assert len(expected) == 17 + sum(1 for k in range(300) if k % 7 == 2)  # 17 clusters + the NULL ones
    for join, parts in ((1, 1), (1, 5), (4, 1), (4, 6), (3, 64)):
        chosen = select_rows(ds.selection, refs, seed=9, dataset_index=0, partitions=join, dedup_partitions=parts)
        assert _pairs(chosen) == expected, (join, parts)


def test_an_ordered_selection_keeps_its_order_ranks_through_the_partitioned_dedup(corpus) -> None:
    ds = Dataset.from_path("web", corpus / "web", order_by="score DESC", order_window=1, dedup_on="topic")
    assert ds.selection is not None
    refs = _refs(ds)
    one = select_rows(ds.selection, refs, seed=4, dataset_index=0, dedup_partitions=1)
    many = select_rows(ds.selection, refs, seed=4, dataset_index=0, dedup_partitions=5)
    assert _pairs(many) == _pairs(one) and many.ordered
    assert sorted(_pairs(one)) == _expected(corpus, "topic", None, seed=4)
    scores = {(s, r): sc for s in range(SHARDS) for r, sc in enumerate(pq.read_table(corpus / "web" / f"{s}.parquet")
              ["score"].to_pylist())}  # fmt: skip
    got = [scores[p] for p in _pairs(many)]
    assert got == sorted(got, reverse=True)  # by score descending; ties in (shard, row) order
    ties = [p for p in _pairs(many) if scores[p] == got[0]]
    assert ties == sorted(ties)


def _table_rows(con: duckdb.DuckDBPyConnection) -> None:
    """``zephon_selected`` of 2,000 rows in 20 shards: keys ``(shard * 37 + row) % 23`` (every key in every
    shard), NULL for one row in nine, rows 0..99 of each shard in a scrambled insertion order."""
    con.execute(
        "CREATE TEMP TABLE zephon_selected AS SELECT s AS shard, r AS row, CASE WHEN (s * 100 + r) % 9 = 4 THEN NULL "
        "ELSE (s * 37 + r) % 23 END AS zephon_dedup FROM range(20) a(s), range(100) b(r) ORDER BY hash(s * 100 + r)"
    )


@pytest.mark.parametrize("batch", [1 << 20, 97])  # 97: the rows stream in 21 batches, the draws continue across
def test_fetch_final_keeps_what_one_rank_over_all_rows_keeps_and_cleans_up(tmp_path, monkeypatch, batch) -> None:
    monkeypatch.setattr(results, "BATCH_ROWS", batch)
    shard = np.repeat(np.arange(20), 100)
    row = np.tile(np.arange(100), 20)
    key = np.where((shard * 100 + row) % 9 == 4, -1, (shard * 37 + row) % 23)  # its dense rank: the key itself
    expected = dedup_module.dedup_keep(key, dedup_draws(8, 2).random_raw(2000))
    assert 23 < expected.sum() < 2000
    for partitions in (1, 2, 3, 4, 23, 100):
        con = duckdb.connect()
        _table_rows(con)
        run = DedupRun(seed=8, dataset_index=2, spill=str(tmp_path), partitions=partitions)
        got, before = fetch_final(con, order=None, dedup=run, memory_limit="2GB")
        assert before == 2000
        assert got["shard"].tolist() == shard[expected].tolist(), partitions
        assert got["row"].tolist() == row[expected].tolist(), partitions
        assert os.listdir(tmp_path) == []  # the partitioned keys and the pairs' files are removed
        assert not con.execute("SELECT * FROM duckdb_tables() WHERE table_name = 'zephon_selected'").fetchall()
        con.close()


def test_the_partition_size_constant_forces_partitions_and_the_plan_bytes_stay(corpus, tmp_path, monkeypatch) -> None:
    ds = Dataset.from_path("web", corpus / "web", metadata=corpus / "side", key="id", dedup_on="cluster",
                           where="score >= 2")  # fmt: skip
    source = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=3, epochs=2)
    one = source.plan(tmp_path / "one")
    seen: list[int] = []
    real = dedup_module._decide
    monkeypatch.setattr(dedup_module, "_decide", lambda con, p, *a: (seen.append(p), real(con, p, *a)))
    monkeypatch.setattr(dedup_module, "PARTITION_BYTES", 10**8)  # 2 GB / 10^8: 20 keyed rows a partition
    many = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=3, epochs=2).plan(
        tmp_path / "many"
    )
    side = pq.read_table(corpus / "side" / "c.parquet").to_pydict()
    cluster = dict(zip(side["id"], side["cluster"], strict=True))
    web = pa.concat_tables(pq.read_table(corpus / "web" / f"{s}.parquet") for s in range(SHARDS)).to_pydict()
    keyed = sum(1 for i, sc in zip(web["id"], web["score"], strict=True) if sc >= 2 and cluster[i] is not None)
    assert seen == list(range(-(-keyed // 20))) and len(seen) >= 6  # ceil(keyed / 20) partitions, each decided
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in many.iterdir()) and "samples.parquet" in names
    for name in names:
        assert (many / name).read_bytes() == (one / name).read_bytes(), name


def test_partitions_follow_the_keyed_rows_and_the_memory_limit() -> None:
    for bad in (0, -2):
        with pytest.raises(ConfigError, match=rf"^dedup_partitions must be an integer ≥ 1, got {bad} — pass one"):
            DedupRun(seed=1, dataset_index=0, spill="/tmp", partitions=bad)
    assert partitions_for(0, "2GB") == 1
    assert partitions_for(10**7, "2GB") == 1  # 200 bytes of the limit a row
    assert partitions_for(250_000_000, "2GB") == 25  # 10^9 documents, where + sidecar keeping a quarter
    assert partitions_for(250_000_000, "8GB") == 7


def test_a_dedup_whose_pairs_cannot_be_written_fails_in_one_line_and_leaves_nothing(corpus, tmp_path) -> None:
    line, scratch = selection_under_full_disk(
        corpus,
        tmp_path,
        dataset='sys.argv[1] + "/web", dedup_on="near"',
        limit=3000,  # the keys' Parquet fits; 300 pairs (4,800 bytes) do not
        options="dedup_partitions=1",
    )
    assert line.startswith(f"DatasetError dataset 'web': the selection's spill directory {scratch}/zephon-select-")
    assert "[Errno 27] File too large — free space there or point TMPDIR at a larger disk" in line  # Python's write
    assert "\n" not in line and list(scratch.iterdir()) == []


def test_the_open_file_limit_is_raised_for_many_partitions_or_refused_in_one_line(tmp_path) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1000:
        pytest.skip("this machine's hard open-file limit is below the test's")
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))  # below 100 partitions + the margin
    try:
        con = duckdb.connect()
        _table_rows(con)
        run = DedupRun(seed=8, dataset_index=2, spill=str(tmp_path), partitions=100)
        got, before = fetch_final(con, order=None, dedup=run, memory_limit="2GB")
        assert before == 2000 and 23 < len(got["shard"]) < 2000
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 100 + dedup_module.FILE_MARGIN  # raised, no further
        con.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    child = (  # a hard limit can only be lowered for good: in a process of its own
        "import resource, sys\n"
        "from zephon.planner.selection.dedup import allow_open_files\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (200, 300))\n"
        "try:\n    allow_open_files(100)\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout.strip()
    assert out == (
        "ConfigError dedup_on must keep its 100 key-hash partitions' files open at once (and 256 more), got an "
        "open-file limit of 300 — raise it (ulimit -n 356) or ZEPHON_SELECT_MEMORY (fewer, larger partitions)"
    )
