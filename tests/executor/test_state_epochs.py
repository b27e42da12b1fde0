"""A loaded state and the iterations after it: a state at an epoch's end starts the next epoch whole; the state
before the next iteration is the loaded one; the iterations after the resumed one start at the plan's start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.demo_plans import texts_plan

from zephon import Pipeline


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("epochs")
    return texts_plan(root / "web", [f"document {i} " + "word " * (i % 13) for i in range(300)], root / "plan")


def make(plan: Path, tokenizer_dir: str) -> Pipeline:
    return Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=33).batch(
        microbatch_size=2, global_batch_size=4
    )


def rows(batches) -> list[bytes]:
    return [b.tokens.tobytes() + b.lengths.tobytes() for b in batches]


def loader_rows(loader) -> list[bytes]:
    return [t["input_ids"].numpy().tobytes() for t in loader]


def test_a_state_at_an_epochs_end_resumes_into_the_next_whole_epoch(plan: Path, tokenizer_dir: str) -> None:
    """After the last batch the state is at the run's end; loaded, the next iteration gave nothing — a Lightning
    run resumed from the checkpoint at an epoch's end skipped the next epoch without a word."""
    first = make(plan, tokenizer_dir)
    whole = rows(first)
    end = json.loads(json.dumps(first.state_dict()))
    assert end["step"] == first.num_steps() and end["microbatch"] == 0
    resumed = make(plan, tokenizer_dir)
    resumed.load_state_dict(end)
    assert rows(resumed) == whole
    expected = loader_rows(make(plan, tokenizer_dir).dataloader(return_labels=False))
    for workers in (0, 2):
        loader = make(plan, tokenizer_dir).dataloader(workers, return_labels=False)
        loader.load_state_dict(end)
        assert loader_rows(loader) == expected  # the next epoch, whole
        assert loader_rows(loader) == expected  # and the one after


def test_the_state_before_the_next_iteration_is_the_loaded_one(plan: Path, tokenizer_dir: str) -> None:
    """On a pipeline that had iterated, state_dict() after load_state_dict() gave the old iteration's position:
    a checkpoint taken between the load and the first batch skipped the batches in between."""
    early = make(plan, tokenizer_dir)
    it = iter(early)
    head = [next(it) for _ in range(3)]
    at_three = early.state_dict()
    later = make(plan, tokenizer_dir)
    it = iter(later)
    for _ in range(7):
        next(it)
    later.load_state_dict(at_three)
    assert later.state_dict() == at_three
    assert rows(head) + rows(later) == rows(make(plan, tokenizer_dir))
