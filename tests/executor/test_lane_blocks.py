"""Rows of several microbatches popped together (``LaneBatches``' blocks): every batch, every state taken between
two batches, the stats and every resume are those of popping one microbatch at a time (``BLOCK_TOKENS = 1``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
from support.demo_plans import code_and_short_plan, texts_plan

from zephon import Pipeline
from zephon.errors import DatasetError
from zephon.executor import estimated
from zephon.executor.pack import calibration

MAX_LENGTH = 65
GLOBAL = 8


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: str) -> Path:
    """An estimated token mixture of short documents beside code files: lanes far apart, some running dry."""
    root = tmp_path_factory.mktemp("blocks")
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    return code_and_short_plan(root, tokenizer_dir, MAX_LENGTH)


def _pipeline(plan: Path, tokenizer_dir: str, micro: int, drop_last: bool, dp: tuple[int, int]) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .options(dp_rank=dp[0], dp_size=dp[1])
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=micro, global_batch_size=GLOBAL, drop_last=drop_last)
    )


def _counts(stats: Any) -> dict[str, Any]:
    """The stats but the spot check's CPU seconds (a clock)."""
    return {k: v for k, v in dataclasses.asdict(stats).items() if k != "spot_check_seconds"}


def _run(pipe: Pipeline, stop: int | None = None) -> list[tuple[Any, ...]]:
    """Every batch (ids, starts, lengths, pieces, place) and the state after it, up to ``stop`` batches."""
    out = []
    for batch in pipe:
        out.append(
            (
                batch.tokens.tobytes(),
                batch.doc_start.tobytes(),
                batch.lengths.tolist(),
                None if batch.pieces is None else batch.pieces.tolist(),
                (batch.step, batch.microbatch),
                pipe.state_dict(),
            )
        )
        if stop is not None and len(out) == stop:
            break
    return out


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("micro", "dp"), [(8, (0, 1)), (2, (0, 1)), (2, (1, 2)), (1, (0, 1))])
def test_blocks_give_the_batches_states_stats_and_resumes_of_one_microbatch_at_a_time(
    monkeypatch: pytest.MonkeyPatch, plan: Path, tokenizer_dir: str, micro: int, dp: tuple[int, int], drop_last: bool
) -> None:
    monkeypatch.setattr(estimated, "BLOCK_TOKENS", 3 * micro * MAX_LENGTH + 1)  # blocks of 4 microbatches
    blocked = _pipeline(plan, tokenizer_dir, micro, drop_last, dp)
    got = _run(blocked)
    stats = blocked.stats()
    assert len(got) > 2 * 4  # several blocks (the last one cut short by num_steps, mostly)
    with monkeypatch.context() as one_at_a_time:
        one_at_a_time.setattr(estimated, "BLOCK_TOKENS", 1)
        single = _pipeline(plan, tokenizer_dir, micro, drop_last, dp)
        want = _run(single)
        assert got == want
        assert _counts(stats) == _counts(single.stats())
    for k in (1, 5, len(got) // 2 + 3):  # resumed from a state taken inside a block: the rest of the run
        resumed = _pipeline(plan, tokenizer_dir, micro, drop_last, dp)
        resumed.load_state_dict(got[k - 1][-1])
        assert _run(resumed) == got[k:]  # the batches, and the states after them


def test_a_run_stopped_inside_a_block_states_where_it_stopped(plan: Path, tokenizer_dir: str) -> None:
    """A loop that breaks after a batch in the middle of a block: the pipeline's state is that batch's."""
    full = _run(_pipeline(plan, tokenizer_dir, 2, False, (0, 1)))
    for stop in (3, 7):
        pipe = _pipeline(plan, tokenizer_dir, 2, False, (0, 1))
        assert _run(pipe, stop=stop)[-1][-1] == full[stop - 1][-1] == pipe.state_dict()
        resumed = _pipeline(plan, tokenizer_dir, 2, False, (0, 1))
        resumed.load_state_dict(pipe.state_dict())
        assert _run(resumed) == full[stop:]


def test_an_error_reading_for_a_block_comes_at_the_batch_that_needed_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_dir: str
) -> None:
    """A null text late in the plan (past the calibration's first 2,048 documents): the run raises its one-line error after exactly the batches one microbatch
    at a time hands out first — a block does not raise it early, for the microbatches before it."""
    monkeypatch.setattr(calibration, "CALIBRATION_UNITS", 0)  # else the calibration reads this small plan whole
    texts = [None if r == 2400 else f"document {r} " + "word " * (r % 13) for r in range(2600)]
    plan = texts_plan(tmp_path / "web", texts, tmp_path / "plan")

    def until_error() -> tuple[int, str]:
        pipe = _pipeline(plan, tokenizer_dir, 2, False, (0, 1))
        handed = 0
        with pytest.raises(DatasetError) as raised:
            for _ in pipe:
                handed += 1
        return handed, str(raised.value)

    blocked = until_error()
    monkeypatch.setattr(estimated, "BLOCK_TOKENS", 1)
    assert blocked == until_error() and blocked[0] > 2 * estimated.MAX_BLOCK and "null" in blocked[1]
