"""Token counts stay on disk while planning: ``ShardTokens`` loads a shard's counts when the planner reads it.

Plans are byte-identical whether the counts are loaded lazily or held in memory, a token plan holds only the
shuffle window's arrays at once, and counts evicted from the cache between the count pass and the layout
are counted again rather than lost.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import weakref
from pathlib import Path

import numpy as np
import pytest

from zephon.errors import DatasetError
from zephon.io import Dataset
from zephon.planner.build import write_bundle
from zephon.planner.counts.shard_tokens import ShardTokens
from zephon.planner.orders import Reader
from zephon.planner.prepare import PreparedPlan, prepare
from zephon.specs import PackSpec, TokenizeSpec
from zephon.storage.files import cache_dir
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

_path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_planner.py"
_spec = importlib.util.spec_from_file_location("bench_planner", _path)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_shards_are_loaded_when_indexed_every_time() -> None:
    calls: list[int] = []

    def loader(j: int, values: list[int]):
        return lambda: (calls.append(j), np.array(values, dtype=np.int32))[1]

    tokens = ShardTokens([loader(0, [5, 7, 2]), loader(1, [4, 4])], rows=[3, 2], names=["a", "b"])
    assert calls == [] and len(tokens) == 2
    assert tokens[1].tolist() == [4, 4] and calls == [1]
    assert tokens[1].tolist() == [4, 4] and calls == [1, 1]  # nothing kept
    assert tokens.total() == 22 and calls == [1, 1, 0, 1]
    tail = tokens[1:]
    assert isinstance(tail, ShardTokens) and len(tail) == 1 and tail.total() == 8


def test_a_shard_whose_counts_have_the_wrong_length_is_named() -> None:
    tokens = ShardTokens([lambda: np.array([1, 2])], rows=[3], names=["s3://b/web/part-7.parquet (dataset 'web')"])
    with pytest.raises(DatasetError, match=r"part-7\.parquet \(dataset 'web'\) must have 3 rows, got 2 — .*re-plan"):
        tokens[0]
    with pytest.raises(ValueError, match="one entry per shard"):
        ShardTokens([lambda: np.array([1])], rows=[1, 2], names=["a"])


@pytest.mark.parametrize("unit", ["tokens", "exact"])
def test_lazy_counts_give_the_same_plan_bytes_as_counts_in_memory(unit: str, tmp_path: Path) -> None:
    lazy = bench.synthetic_prepared(200_000, shards=200, unit=unit)
    eager = bench.synthetic_prepared(200_000, shards=200, unit=unit, lazy=False)
    assert isinstance(lazy.tokens[0], ShardTokens) and isinstance(eager.tokens[0], tuple)
    a, b = write_bundle(lazy, tmp_path / "lazy"), write_bundle(eager, tmp_path / "eager")
    for name in ("samples.parquet", "shards.parquet", "plan.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _tracked(prepared: PreparedPlan) -> tuple[PreparedPlan, dict[str, int]]:
    """The same plan whose loaders count the shard arrays alive at once (CPython frees them at once)."""
    seen = {"live": 0, "max": 0, "loads": 0}

    def gone() -> None:
        seen["live"] -= 1

    def track(load):
        def tracked() -> np.ndarray:
            array = np.array(load())  # a fresh object per load, as np.load gives
            seen["live"] += 1
            seen["loads"] += 1
            seen["max"] = max(seen["max"], seen["live"])
            weakref.finalize(array, gone)
            return array

        return tracked

    assert prepared.tokens is not None
    groups = tuple(
        ShardTokens([track(g._loaders[j]) for j in range(len(g))], rows=g._rows, names=g._names)
        for g in prepared.tokens
    )
    return dataclasses.replace(prepared, tokens=groups), seen  # a fresh per-dataset tokens cache (_epochs)


@pytest.mark.parametrize("unit", ["tokens", "exact"])
def test_a_token_plan_holds_only_a_window_of_shard_counts(unit: str, tmp_path: Path) -> None:
    prepared, seen = _tracked(bench.synthetic_prepared(100_000, shards=300, unit=unit))
    write_bundle(prepared, tmp_path / "plan")
    window = prepared.source.shuffle.window_shards
    assert seen["loads"] >= 300  # every shard read at least once
    assert seen["max"] <= window, seen  # never more than one shuffle window's arrays alive


def test_counts_evicted_after_the_count_pass_are_counted_again(make_parquet, tokenizer_dir, tmp_path) -> None:
    datasets = [
        Dataset.from_path("web", make_parquet("web", [40, 25, 31], row_group_size=7)),
        Dataset.from_path("code", make_parquet("code", [30, 17])),
    ]
    source = StaticMixtureWorkSource(
        datasets=datasets, mixture=MixtureSpec({"web": 0.6, "code": 0.4}), seed=5,
        token_estimation=TokenEstimation(), num_tokens=4000, exact_tokens=True,
    )  # fmt: skip
    tok, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=32)
    kept = write_bundle(prepare(source, tokenize=tok, pack=pack, workers=1), tmp_path / "kept")
    prepared = prepare(source, tokenize=tok, pack=pack, workers=1)
    counts = cache_dir() / "token-counts"
    assert len(list(counts.glob("*.npy"))) == 5
    shutil.rmtree(counts)  # e.g. `zephon cache clean` between the count pass and the layout
    evicted = write_bundle(prepared, tmp_path / "evicted")
    assert len(list(counts.glob("*.npy"))) == 5  # counted again, and cached again
    for name in ("samples.parquet", "plan.json"):
        assert (kept / name).read_bytes() == (evicted / name).read_bytes(), name


def test_a_dataset_of_one_window_loads_each_shard_once_over_many_epochs() -> None:
    """Each epoch of a dataset of at most ``window_shards`` shards is one window of every shard: the reader keeps
    those arrays (a token mixture reads 2^18 documents ahead, thousands of epochs of a small dataset); a window
    of fewer shards loads them again every epoch, as a large dataset's windows do."""
    counts = {0: [5, 7, 2], 1: [4, 4]}
    for window, loads in ((2, [1, 1]), (1, [10, 10])):
        calls: list[int] = []

        def loader(j: int, calls: list[int] = calls):
            return lambda: (calls.append(j), np.array(counts[j], dtype=np.int32))[1]

        tokens = ShardTokens([loader(0), loader(1)], rows=[3, 2], names=["a", "b"])
        reader = Reader(
            shard_ids=np.array([10, 11]), shard_rows=np.array([3, 2]), tokens=tokens, seed=3, dataset_index=0,
            shuffle=True, window_shards=window, max_epochs=10,
        )  # fmt: skip
        docs = reader.take(100)
        assert len(docs.row) == 50 and docs.epoch.tolist() == [e for e in range(10) for _ in range(5)]
        assert docs.tokens.tolist() == [counts[s - 10][r] for s, r in zip(docs.shard_id, docs.row, strict=True)]
        assert [calls.count(j) for j in (0, 1)] == loads, window
