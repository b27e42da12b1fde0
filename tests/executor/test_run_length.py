"""An estimated run's length (``zephon.executor.pack.run_length``): exact when the calibration reads the whole
plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.demo_plans import texts_plan

from zephon import Pipeline
from zephon.executor.pack import run_length

MAX_LENGTH = 33


def lane_lengths(plan: Path, tokenizer_dir: str, *, drop_last: bool) -> tuple[np.ndarray, Pipeline]:
    """Each step's row lengths (one row a lane: G = 4 = the plan's lanes) and the pipeline that made them."""
    pipe = (
        Pipeline.from_plan(plan)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=4, drop_last=drop_last)
    )
    lengths = np.stack([batch.lengths for batch in pipe])
    assert len(lengths) == pipe.num_steps()
    return lengths, pipe


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("run_length")
    return texts_plan(root / "web", [f"document {i} " + "word " * (i * 7 % 61) for i in range(600)], root / "plan")


def test_a_plan_the_calibration_reads_whole_ends_on_its_data(plan, tokenizer_dir, monkeypatch) -> None:
    """A plan of at most ``CALIBRATION`` documents is tokenized whole by the calibration, so each lane's tokens
    are known: the run used to add its 3σ margin all the same and end on steps of padding alone (the README's
    demo plan: 5 of its 59 steps)."""
    lengths, pipe = lane_lengths(plan, tokenizer_dir, drop_last=False)
    assert lengths[-1].max() > 0 and pipe.stats().lanes_cut == 0  # the last step holds the longest lane's last row
    full, pipe = lane_lengths(plan, tokenizer_dir, drop_last=True)
    assert (full == MAX_LENGTH).all() and pipe.stats().short_rows == 0
    per_lane = lengths.sum(axis=0)
    assert len(full) == int((per_lane // MAX_LENGTH).min())  # every full row of the shortest lane
    # measured on fewer documents than the plan's (the calibration no longer whole): the margin, and its padding
    monkeypatch.setattr(run_length, "CALIBRATION", 100)
    estimated, _ = lane_lengths(plan, tokenizer_dir, drop_last=False)
    assert len(estimated) > len(lengths) and (estimated[len(lengths) :] == 0).all()
    assert (estimated[: len(lengths)] == lengths).all()  # the same rows: only the end moved


def test_whole_steps_are_the_longest_lanes_rows_or_the_shortest_lanes_full_ones() -> None:
    lanes = np.array([5000, 3100])
    assert run_length.whole_steps(lanes, 1000, global_batch=2, drop_last=False) == 5
    assert run_length.whole_steps(lanes, 1000, global_batch=2, drop_last=True) == 3
    assert run_length.whole_steps(lanes, 1000, global_batch=4, drop_last=False) == 3  # 2 lanes × 5 rows over G = 4
