"""The partitioned sidecar join (planner/selection/join.py) plans exactly what the single join plans.

Every selection here is planned once in one join and again in several key-hash partitions (forced with
``partitions=`` or ``ZEPHON_SELECT_PARTITIONS``, or chosen by a tiny memory limit); the selected rows, the reports
and the whole plan bundles must be identical byte for byte.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import selection_under_full_disk

from zephon.errors import ConfigError, DatasetError
from zephon.io import Dataset
from zephon.planner.prepare import shard_refs
from zephon.planner.selection.evaluate import select_rows
from zephon.planner.selection.join import partitions_for
from zephon.work import MixtureSpec, StaticMixtureWorkSource

SHARDS, ROWS = 5, 80


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """web/: int32 keys (a few NULL), score 0-5; side/ (two files): int64 keys for most documents plus keys no
    document has and a NULL key, quality with NULLs, clusters of three."""
    root = tmp_path_factory.mktemp("join")
    (root / "web").mkdir()
    (root / "side").mkdir()
    rng = np.random.default_rng(11)
    for s in range(SHARDS):
        ids = pa.array(
            [None if r % 37 == 5 else s * ROWS + r for r in range(ROWS)], type=pa.int32()
        )  # NULL keys never match
        text = [f"doc {s}-{r} " * (1 + r % 4) for r in range(ROWS)]
        table = pa.table({"id": ids, "text": text, "score": rng.integers(0, 6, ROWS).astype(np.int8)})
        pq.write_table(table, root / "web" / f"{s:02d}.parquet", row_group_size=16)
    keys = [k for k in rng.permutation(SHARDS * ROWS).tolist() if k % 9 != 4] + [10_000, 10_001, None]
    quality = [None if k is not None and k % 13 == 0 else float(rng.random()) for k in keys]
    cluster = [None if k is None or k % 11 == 0 else f"c{k // 3}" for k in keys]
    table = pa.table({"id": pa.array(keys, type=pa.int64()), "quality": quality, "cluster": cluster})
    half = len(keys) // 2
    pq.write_table(table.slice(0, half), root / "side" / "a.parquet")
    pq.write_table(table.slice(half), root / "side" / "b.parquet")
    return root


SELECTIONS = [
    {"where": "quality > 0.3 AND score >= 2"},
    {"where": "quality IS NULL OR score = 5"},
    {"order_by": "quality DESC", "order_window": 3},
    {"where": "score < 4", "order_by": "quality + score", "dedup_on": "cluster"},
    {"dedup_on": "cluster"},
]


def _dataset(corpus: Path, **kw) -> Dataset:
    return Dataset.from_path("web", corpus / "web", metadata=corpus / "side", key="id", **kw)


def _source(ds: Dataset) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=3, epochs=2)


@pytest.mark.parametrize("kw", SELECTIONS)
def test_every_partition_count_selects_the_same_rows_and_counts(corpus, kw) -> None:
    ds = _dataset(corpus, **kw)
    assert ds.selection is not None
    refs = shard_refs(_source(ds), progress=False)[0]
    one = select_rows(ds.selection, refs, seed=3, dataset_index=0, partitions=1)
    assert one.report.documents_without_metadata and one.report.metadata_without_document  # both sides counted
    for partitions in (2, 3, 7, 64):  # 64: many partitions empty on one side or both
        many = select_rows(ds.selection, refs, seed=3, dataset_index=0, partitions=partitions)
        assert np.array_equal(many.shard, one.shard) and np.array_equal(many.row, one.row), partitions
        assert many.report == one.report, partitions


@pytest.mark.parametrize("kw", SELECTIONS[:4])
def test_partitioned_plans_are_byte_identical_to_the_single_join(corpus, tmp_path, monkeypatch, kw) -> None:
    single = _source(_dataset(corpus, **kw)).plan(tmp_path / "single")
    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", "4")
    forced = _source(_dataset(corpus, **kw)).plan(tmp_path / "forced")
    import zephon.planner.selection.evaluate as selection

    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", "9")
    monkeypatch.setattr(selection, "MEMORY_LIMIT", "16MB")  # as ZEPHON_SELECT_MEMORY=16MB: DuckDB spills
    tiny = _source(_dataset(corpus, **kw)).plan(tmp_path / "tiny")
    names = sorted(p.name for p in single.iterdir())
    assert "samples.parquet" in names and "plan.json" in names
    for plan in (forced, tiny):
        assert sorted(p.name for p in plan.iterdir()) == names
        for name in names:
            assert (plan / name).read_bytes() == (single / name).read_bytes(), (plan.name, name)


def test_partitions_follow_the_memory_limit_and_can_be_forced(monkeypatch) -> None:
    assert partitions_for(2 * 10**8, "2GB") == 1  # 10^8 documents + 10^8 sidecar rows: one join (measured)
    assert partitions_for(2 * 10**9, "2GB") == 20
    assert partitions_for(2 * 10**9, "8GiB") == 5
    assert partitions_for(483, "300KB") == 1 and partitions_for(483, "3KB") == 4
    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", "6")
    assert partitions_for(10, "2GB") == 6
    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", "0")
    with pytest.raises(ConfigError, match=r"ZEPHON_SELECT_PARTITIONS must be an integer ≥ 1, got '0'"):
        partitions_for(10, "2GB")
    monkeypatch.delenv("ZEPHON_SELECT_PARTITIONS")
    with pytest.raises(ConfigError, match=r"ZEPHON_SELECT_MEMORY must be a size such as 2GB"):
        partitions_for(10, "lots")


def test_duplicate_keys_and_bad_expressions_fail_alike_when_partitioned(corpus, tmp_path) -> None:
    pq.write_table(pa.table({"id": pa.array([1, 2, 2], pa.int64()), "quality": [1.0, 2, 3]}), tmp_path / "d.parquet")
    for partitions in (1, 3):
        ds = Dataset.from_path("web", corpus / "web", metadata=tmp_path / "d.parquet", key="id", where="quality > 0")
        assert ds.selection is not None
        refs = shard_refs(_source(ds), progress=False)[0]
        with pytest.raises(DatasetError, match=r"sidecar key 'id' must be unique, got 2 rows for 2 "):
            select_rows(ds.selection, refs, seed=3, dataset_index=0, partitions=partitions)
        bad = _dataset(corpus, where="qualty > 0").selection
        assert bad is not None
        with pytest.raises(ConfigError, match=r"where names column 'qualty', which the dataset lacks"):
            select_rows(bad, refs, seed=3, dataset_index=0, partitions=partitions)


def test_the_spill_directory_is_the_planners_own_and_is_removed(corpus, tmp_path, monkeypatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "users-file").write_text("keep me")
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # as TMPDIR=scratch
    ds = _dataset(corpus, where="quality > 0.5")
    assert ds.selection is not None
    refs = shard_refs(_source(ds), progress=False)[0]
    select_rows(ds.selection, refs, seed=3, dataset_index=0, partitions=5)
    with pytest.raises(ConfigError):
        select_rows(_dataset(corpus, where="nope > 1").selection, refs, seed=3, dataset_index=0, partitions=5)
    assert [p.name for p in scratch.iterdir()] == ["users-file"]  # the selection's directories are gone


def test_a_full_spill_disk_fails_in_one_line_and_leaves_nothing(corpus, tmp_path) -> None:
    line, scratch = selection_under_full_disk(
        corpus,
        tmp_path,
        dataset='sys.argv[1] + "/web", metadata=sys.argv[1] + "/side", key="id", where="quality > 0.5"',
        limit=64,  # no file past 64 bytes: the spill writes fail like a full disk
        options="partitions=3",
    )
    assert line.startswith("DatasetError dataset 'web': the selection's spill directory "), line
    assert "must have room" in line and "point TMPDIR at a larger disk" in line and "\n" not in line
    assert list(scratch.iterdir()) == []


def test_a_join_whose_partitions_cannot_fit_the_spill_disk_is_refused_before_copying(
    corpus, tmp_path, monkeypatch
) -> None:
    from zephon.planner import room

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # as TMPDIR=scratch
    monkeypatch.setattr(room, "SPILL_BYTES_PER_ROW", 2**40)  # as if each row took 1 TiB: no disk has room
    ds = _dataset(corpus, where="quality > 0.5")
    assert ds.selection is not None
    refs = shard_refs(_source(ds), progress=False)[0]
    side_rows = (
        pq.read_metadata(corpus / "side" / "a.parquet").num_rows
        + pq.read_metadata(corpus / "side" / "b.parquet").num_rows
    )
    rows = SHARDS * ROWS + side_rows
    with pytest.raises(
        ConfigError,
        match=rf"^dataset 'web': the sidecar join's partitions must fit in the spill directory {scratch}/zephon-select-\w+, "
        rf"got about {rows * 1024:.1f} GiB needed for {rows} rows \(≥ {2**40} bytes each\) and [\d.]+ GiB free — point "
        "TMPDIR at a larger disk",
    ):
        select_rows(ds.selection, refs, seed=3, dataset_index=0, partitions=3)
    assert list(scratch.iterdir()) == []
    select_rows(ds.selection, refs, seed=3, dataset_index=0, partitions=1)  # one join writes no partitions
