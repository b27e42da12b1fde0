"""``num_steps()`` keeps its calibrating runner for the next iteration (``zephon.run.KeptRunner``): the shards
its calibration decoded are not decoded again, the batches are exactly those of a pipeline iterated without
``num_steps()``, and anything that would make another runner — other options, another start state, workers —
gets its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_parquet_dataset

import zephon.executor.runner as runner_module
from zephon import Pipeline
from zephon.executor.batch import Batch
from zephon.executor.shard_access import ShardAccess
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kept")
    web = write_parquet_dataset(root, "web", [30, 25])
    code = write_parquet_dataset(root, "code", [20])
    ws = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web)), Dataset.from_path("code", str(code))],
        mixture=MixtureSpec({"web": 0.6, "code": 0.4}),
        seed=3,
    )
    return ws.plan(root / "plan")


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[ShardAccess]:
    """Every ``ShardAccess`` a runner opens (one per decoding of the run's shards), in order."""
    made: list[ShardAccess] = []

    class Counted(ShardAccess):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(runner_module, "ShardAccess", Counted)
    return made


def pipe(plan: Path, tokenizer_dir: str) -> Pipeline:
    return (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=33).batch(microbatch_size=2)
    )


def run(batches: object) -> list[tuple[int, int, bytes, bytes, bytes, bytes, bytes]]:
    out = []
    for b in batches:  # type: ignore[attr-defined]
        assert isinstance(b, Batch) and b.sequences is not None and b.pieces is not None
        out.append(
            (
                b.step,
                b.microbatch,
                b.tokens.tobytes(),
                b.doc_start.tobytes(),
                b.lengths.tobytes(),
                b.sequences.tobytes(),
                b.pieces.tobytes(),
            )
        )
    return out


def test_the_iteration_after_num_steps_runs_on_its_runner_with_the_same_batches_and_stats(
    plan: Path, tokenizer_dir: str, opened: list[ShardAccess]
) -> None:
    plain = pipe(plan, tokenizer_dir)
    whole = run(plain)
    assert len(opened) == 1
    p = pipe(plan, tokenizer_dir)
    steps = p.num_steps()
    assert len(opened) == 2  # the calibration opened the run's shards
    assert run(p) == whole and len(opened) == 2  # ... and the iteration read them: nothing opened again
    assert steps == whole[-1][0] + 1
    assert p.stats().documents == plain.stats().documents and p.stats().tokens == plain.stats().tokens
    assert run(p) == whole and len(opened) == 3  # a runner is taken once: the next iteration opens its own


def test_a_pipeline_with_other_options_after_num_steps_gets_its_own_runner(
    plan: Path, tokenizer_dir: str, opened: list[ShardAccess]
) -> None:
    expected = run(pipe(plan, tokenizer_dir).options(read_chunk=3))
    p = pipe(plan, tokenizer_dir)
    p.num_steps()
    q = p.options(read_chunk=3)  # another spec: the kept runner is not q's
    assert run(q) == expected and len(opened) == 3
    assert q._kept is None and p._kept is not None and p._kept.runner.spec.read_chunk != 3
    q.num_steps()
    smaller = q.batch(microbatch_size=1)  # another geometry
    batches = run(smaller)
    assert [b[2] for b in batches] == [b[2] for b in run(pipe(plan, tokenizer_dir).batch(microbatch_size=1))]
    assert q._kept is not None  # still q's, for q's own next iteration
    assert run(q) == expected and len(opened) == 6  # 3, then smaller's and its reference's; q's own kept one reused


def test_a_state_loaded_after_num_steps_closes_the_kept_runner_and_resumes_exactly(
    plan: Path, tokenizer_dir: str, opened: list[ShardAccess]
) -> None:
    whole = run(pipe(plan, tokenizer_dir))
    first = pipe(plan, tokenizer_dir)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = pipe(plan, tokenizer_dir)
    resumed.num_steps()
    kept = resumed._kept
    assert kept is not None and kept.runner._access is not None
    resumed.load_state_dict(state)
    assert resumed._kept is None and kept.runner._access is None  # its shards released
    assert run(head) + run(resumed) == whole


def test_the_loader_made_after_num_steps_runs_on_its_runner_without_workers_and_closes_it_with_workers(
    plan: Path, tokenizer_dir: str, opened: list[ShardAccess]
) -> None:
    expected = [t["labels"].tolist() for t in (b.to_training() for b in pipe(plan, tokenizer_dir))]
    p = pipe(plan, tokenizer_dir)
    p.num_steps()
    loader = p.dataloader()
    assert p._kept is None and loader._pipeline._kept is not None  # handed to the loader
    assert [t["labels"].tolist() for t in loader] == expected and len(opened) == 2
    q = pipe(plan, tokenizer_dir)
    q.num_steps()
    kept = q._kept
    assert kept is not None
    with_workers = q.dataloader(num_workers=1, multiprocessing_context="fork")
    assert [t["labels"].tolist() for t in with_workers] == expected
    assert kept.runner._access is None and with_workers._pipeline._kept is None  # released before the workers
