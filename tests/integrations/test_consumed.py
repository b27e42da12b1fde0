"""ConsumedLoader: the state after the k-th microbatch handed out, for the last WINDOW + 1 counts, whatever was
fetched beyond; an older count is refused in one line (WINDOW made 2 here, so a few microbatches reach past it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.integration_runs import make_pipeline, make_plan

from zephon.errors import ConfigError
from zephon.integrations import consumed
from zephon.integrations.consumed import ConsumedLoader


@pytest.fixture(scope="module")
def plan(tmp_path_factory, tokenizer_dir) -> Path:
    return make_plan(tmp_path_factory.mktemp("consumed"), tokenizer_dir, documents=160)


def rows(tensors) -> bytes:
    return b"".join(tensors[k].numpy().tobytes() for k in sorted(tensors))


def test_the_state_after_each_of_the_window_latest_microbatches_resumes_there_and_an_older_one_is_refused(
    plan, tokenizer_dir, monkeypatch
) -> None:
    monkeypatch.setattr(consumed, "WINDOW", 2)
    whole = [rows(t) for t in make_pipeline(plan, tokenizer_dir).dataloader()]
    assert len(whole) >= 6
    taken = ConsumedLoader(make_pipeline(plan, tokenizer_dir).dataloader())
    items = iter(taken)
    for _ in range(5):  # the framework fetched 5; its training loop took 3, 4 or 5 of them
        next(items)
    assert taken.handed == 5
    for k in (3, 4, 5):
        again = make_pipeline(plan, tokenizer_dir).dataloader()
        again.load_state_dict(taken.state_after(k))
        assert [rows(t) for t in again] == whole[k:]
    with pytest.raises(ConfigError, match=r"^the training loop's count of batches taken must be within the 2 latest of the 5 handed out, got 2 — the framework fetched further ahead than Zephon expects; report this with the framework's version$"):
        taken.state_after(2)
    with pytest.raises(ConfigError, match=r"^the training loop's count of batches taken must be within the 2 latest of the 5 handed out, got 6 — "):
        taken.state_after(6)
