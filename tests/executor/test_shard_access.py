"""A run and its calibration share one shard access (``zephon.executor.shard_access``): each shard is opened and
each row group decoded once, a skipped document is counted and warned about once, and a runner that only
computed ``num_steps()`` leaves no shard pinned in the shard cache."""

from __future__ import annotations

import gc
import logging
from collections import Counter
from pathlib import Path

import pytest
from conftest import write_jsonl_dataset, write_parquet_dataset
from test_stats import bad_jsonl

from zephon import Pipeline
from zephon.executor.read.jsonl import JsonlShard
from zephon.executor.read.parquet import ParquetShard
from zephon.executor.runner import RankRunner
from zephon.io import Dataset
from zephon.specs import CacheOptions, StoreOptions
from zephon.storage.shard_cache import ShardCache
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource


def plan_of(root: Path, datasets: dict[str, Path], window: int = 3, **kw) -> Path:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path(n, str(d)) for n, d in datasets.items()],
        mixture=MixtureSpec({n: 1.0 / len(datasets) for n in datasets}),
        seed=5,
        shuffle=ShuffleSpec(window_shards=window),
        lanes=2,
        **kw,
    )
    return source.plan(root / "plan")


def pipeline(plan: Path, tokenizer_dir: str, **options) -> Pipeline:
    pipe = Pipeline.from_plan(plan).options(**options) if options else Pipeline.from_plan(plan)
    return pipe.tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=33).batch(microbatch_size=2)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> tuple[Counter, Counter]:
    """Shard openings (by uri) and Parquet row group decodings (by uri, row group) of the real readers."""
    opened: Counter = Counter()
    decoded: Counter = Counter()
    parquet_init, jsonl_init, row_group = ParquetShard.__init__, JsonlShard.__init__, ParquetShard.row_group

    def open_parquet(self, ref, *args, **kw):
        opened[ref.uri] += 1
        parquet_init(self, ref, *args, **kw)

    def open_jsonl(self, ref, *args, **kw):
        opened[ref.uri] += 1
        jsonl_init(self, ref, *args, **kw)

    def decode(self, g):
        decoded[(self.ref.uri, g)] += 1
        return row_group(self, g)

    monkeypatch.setattr(ParquetShard, "__init__", open_parquet)
    monkeypatch.setattr(JsonlShard, "__init__", open_jsonl)
    monkeypatch.setattr(ParquetShard, "row_group", decode)
    return opened, decoded


@pytest.mark.parametrize("read_ahead", ["on", "off"])
def test_the_calibration_and_the_run_open_each_shard_and_decode_each_row_group_once(
    tmp_path, tokenizer_dir, monkeypatch, counted, read_ahead
) -> None:
    monkeypatch.setenv("ZEPHON_READ_AHEAD", read_ahead)
    web = write_parquet_dataset(tmp_path / "data", "web", [13, 9, 11], row_group_size=4)
    books = write_jsonl_dataset(tmp_path / "data", "books", [7, 12])
    plan = plan_of(tmp_path, {"web": web, "books": books})  # window 3: every shard stays open, none is evicted
    opened, decoded = counted
    baseline = [b.tokens.tobytes() for b in pipeline(plan, tokenizer_dir)]
    assert sorted(opened.values()) == [1] * 5  # all 5 shards, each opened once
    assert len(decoded) == 4 + 3 + 3 and set(decoded.values()) == {1}  # web: 13, 9, 11 rows by 4, each once
    # The calibration (inside the run) read the same documents: a run whose length is already known reads as much.
    opened.clear()
    decoded.clear()
    runner = RankRunner(plan, pipeline(plan, tokenizer_dir).executor_spec(), pipeline(plan, tokenizer_dir).geometry())
    steps = runner.num_steps()
    calibrated = Counter(decoded)
    assert calibrated and set(calibrated.values()) == {1}  # the calibration decoded row groups of its own
    batches = [b.tokens.tobytes() for b in runner]  # the run reuses them
    assert len(batches) == steps and batches == baseline  # one microbatch per step
    assert sorted(opened.values()) == [1] * 5 and set(decoded.values()) == {1}


def test_a_skipped_document_is_counted_and_warned_about_once(tmp_path, tokenizer_dir, caplog) -> None:
    plan = plan_of(tmp_path, {"web": bad_jsonl(tmp_path, "web", {2, 3, 11, 20, 23})}, window=1)
    pipe = pipeline(plan, tokenizer_dir, on_bad_document="skip")
    with caplog.at_level(logging.WARNING, logger="zephon.executor.read.shard_reader"):
        assert list(pipe)  # the calibration reads all 24 documents first, the run reads them again
    assert pipe.stats().skipped == {"null_text": 5} and pipe.stats().documents == {"web": 19}
    warnings = [r for r in caplog.records if "skipping a bad document" in r.getMessage()]
    assert len(warnings) == 1  # once per shard: the calibration's warning is the run's


def test_num_steps_alone_leaves_no_shard_pinned_in_the_shard_cache(s3, tmp_path, tokenizer_dir) -> None:
    web = write_parquet_dataset(tmp_path / "data", "web", [13, 9, 11])
    s3.upload_dir(web, "web/")
    plan = plan_of(tmp_path, {"web": s3.url("web/")})
    root = tmp_path / "cache"
    io = StoreOptions(cache=CacheOptions(enabled=True, root=str(root), limit_bytes=1 << 30))
    pipe = pipeline(plan, tokenizer_dir, io_options=io)

    def pinned() -> list[bool]:
        with ShardCache(root, None) as cache:
            return [e.in_use for e in cache.entries()]

    assert pipe.num_steps() > 0
    assert pinned() == [False] * 3  # downloaded by the calibration, released by Pipeline.num_steps
    runner = RankRunner(plan, pipe.executor_spec(), pipe.geometry())
    runner.num_steps()
    assert True in pinned()  # held open for the run to reuse…
    del runner
    gc.collect()
    assert pinned() == [False] * 3  # …and released when the runner is dropped without iterating
    assert sum(1 for _ in pipe) == pipe.num_steps() and pinned() == [False] * 3


def test_a_pipeline_calibrates_once_for_num_steps_and_the_run_that_follows(tmp_path, tokenizer_dir, monkeypatch):
    import zephon.executor.runner as runner_module

    calls = []
    measure = runner_module.calibration_documents
    monkeypatch.setattr(runner_module, "calibration_documents", lambda *a, **kw: calls.append(1) or measure(*a, **kw))
    web = write_parquet_dataset(tmp_path / "data", "web", [13, 9, 11], row_group_size=4)
    plan = plan_of(tmp_path, {"web": web})
    expected = [b.tokens.tobytes() for b in pipeline(plan, tokenizer_dir)]
    assert len(calls) == 1  # the run's own calibration
    pipe = pipeline(plan, tokenizer_dir)
    steps = pipe.num_steps()
    batches = [b.tokens.tobytes() for b in pipe]
    assert len(calls) == 2 and batches == expected and len(batches) == steps  # the run reused num_steps()'s
    other = pipe.options(read_chunk=3)  # another spec: computed again (the same number)
    assert other.num_steps() == steps and len(calls) == 3
