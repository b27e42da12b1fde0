"""Plans of millions of documents keep their invariants: the synthetic shard tables of bench_planner.py.

A test, not a timing: ``benchmarks/bench_planner.py`` measures time and memory on the same helper.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from zephon.plan.format import SAMPLES_ROW_GROUP, SAMPLES_SCHEMA
from zephon.planner import layout, token_mix
from zephon.planner.build import write_bundle

DOCUMENTS = 2_000_000


def _bench():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_planner.py"
    spec = importlib.util.spec_from_file_location("bench_planner", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prepared = bench.synthetic_prepared(DOCUMENTS, shards=2_000)
    return write_bundle(prepared, tmp_path_factory.mktemp("scale") / "plan")


def test_every_prefix_of_millions_of_documents_holds_the_mixture_within_one(plan) -> None:
    dataset = pq.read_table(plan / "samples.parquet", columns=["dataset_id"]).column(0).to_numpy()
    assert len(dataset) == DOCUMENTS
    weights = np.array(list(bench.WEIGHTS.values()))
    n = np.arange(1, DOCUMENTS + 1)
    for i, w in enumerate(weights / weights.sum()):
        assert np.abs(np.cumsum(dataset == i) - w * n).max() < 1


def test_every_epoch_of_every_dataset_is_a_permutation_of_its_documents(plan) -> None:
    s = pq.read_table(plan / "samples.parquet", columns=["position", "dataset_id", "shard_id", "row", "epoch"])
    cols = {name: s.column(name).to_numpy() for name in s.column_names}
    shards = pq.read_table(plan / "shards.parquet").to_pydict()
    rows = np.array(shards["rows"])
    owner = np.array(shards["dataset_id"])
    assert np.array_equal(cols["position"], np.arange(DOCUMENTS))
    assert np.array_equal(owner[cols["shard_id"]], cols["dataset_id"])
    assert (cols["row"] >= 0).all() and (cols["row"] < rows[cols["shard_id"]]).all()
    key = cols["shard_id"].astype(np.int64) * int(rows.max()) + cols["row"]
    epochs_seen = 0
    for ds in range(len(bench.WEIGHTS)):
        mine = cols["dataset_id"] == ds
        total = int(rows[owner == ds].sum())
        epochs = cols["epoch"][mine]
        assert np.array_equal(epochs, np.arange(int(mine.sum())) // total)  # passes follow each other
        for e in np.unique(epochs).tolist():
            pairs = key[mine][epochs == e]
            assert len(np.unique(pairs)) == len(pairs)  # no document twice in a pass
            if e < epochs.max():
                assert len(pairs) == total  # completed passes hold every document
            epochs_seen += 1
    assert epochs_seen > len(bench.WEIGHTS)  # some dataset started another pass
    manifest = json.loads((plan / "plan.json").read_text())
    assert manifest["totals"]["documents"] == DOCUMENTS
    assert sum(d["planned_documents"] for d in manifest["datasets"]) == DOCUMENTS


def test_samples_have_exact_row_groups_statistics_and_under_8_bytes_per_document(plan) -> None:
    file = pq.ParquetFile(plan / "samples.parquet")
    assert file.schema_arrow.equals(SAMPLES_SCHEMA)
    meta = file.metadata
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert sizes[:-1] == [SAMPLES_ROW_GROUP] * (len(sizes) - 1) and 0 < sizes[-1] <= SAMPLES_ROW_GROUP
    position = file.schema_arrow.get_field_index("position")
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(position).statistics
        assert stats is not None and stats.has_min_max
        assert (stats.min, stats.max) == (g * SAMPLES_ROW_GROUP, g * SAMPLES_ROW_GROUP + sizes[g] - 1)
    # A seek reads the one row group the statistics point to.
    target = 1_234_567
    g = target // SAMPLES_ROW_GROUP
    assert file.read_row_group(g).column("position")[target - g * SAMPLES_ROW_GROUP].as_py() == target
    assert (plan / "samples.parquet").stat().st_size / DOCUMENTS <= 8


def test_exact_plans_have_token_offset_statistics_for_seeking(tmp_path) -> None:
    plan = write_bundle(bench.synthetic_prepared(300_000, shards=500, unit="exact"), tmp_path / "exact")
    file = pq.ParquetFile(plan / "samples.parquet")
    column = file.schema_arrow.get_field_index("token_offset")
    table = pq.read_table(plan / "samples.parquet", columns=["tokens", "token_offset"])
    tokens, offsets = table.column(0).to_numpy(), table.column(1).to_numpy()
    assert offsets[0] == 0 and np.array_equal(np.diff(offsets), tokens[:-1])
    for g in range(file.metadata.num_row_groups):
        stats = file.metadata.row_group(g).column(column).statistics
        assert stats is not None and stats.has_min_max and stats.min == offsets[g * SAMPLES_ROW_GROUP]
    assert (plan / "samples.parquet").stat().st_size / len(tokens) <= 8


@pytest.mark.parametrize("unit", ["samples", "tokens"])
def test_chunk_boundaries_never_change_the_plan(unit, tmp_path, monkeypatch) -> None:
    prepared = bench.synthetic_prepared(400_000, shards=300, unit=unit)
    whole = write_bundle(prepared, tmp_path / "whole")
    monkeypatch.setattr(layout, "CHUNK", 3 * SAMPLES_ROW_GROUP)
    monkeypatch.setattr(token_mix, "FILL", 5_000)
    chunked = write_bundle(prepared, tmp_path / "chunked")
    for name in ("samples.parquet", "plan.json"):
        assert (whole / name).read_bytes() == (chunked / name).read_bytes(), name
