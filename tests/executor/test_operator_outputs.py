"""An estimated plan's operators that act otherwise in another process are refused on resume and when the ranks'
states are merged (``operators.outputs_digest`` in the state's ``num_steps``), not resumed onto other data."""

from __future__ import annotations

import pytest
from support.chat_data import build_tokenizer

from zephon import Pipeline, merge_states
from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

#: What ``per_process`` does differs between processes, as a choice made with Python's salted hash() would.
PROCESS = {"drop_odd": False}

MESSAGE = (
    r"^the map_transform/map_batch operators must make the same documents of the plan's first documents in every "
    r"process, got other documents or token counts than {} — an operator depends on more than its record "
    r"\(Python's hash\(\) of a string changes from process to process: use hashlib"
)


def per_process(record: dict) -> dict | None:
    return None if PROCESS["drop_odd"] and int(str(record["id"])[-1]) % 2 else record


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> str:
    return str(build_tokenizer(tmp_path_factory.mktemp("tok") / "t", eos="</s>"))


@pytest.fixture
def plan(tmp_path, tok, make_jsonl):
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("docs", str(make_jsonl("docs", [40])))], mixture=MixtureSpec({"docs": 1.0}), seed=4
    )
    return source.plan(tmp_path / "plan", tokenize=TokenizeSpec(tokenizer_id=tok), pack=PackSpec(max_length=24))


def pipe(plan, tok: str, *, dp_rank: int = 0, dp_size: int = 1) -> Pipeline:
    p = Pipeline.from_plan(plan).map_transform(per_process).tokenize(tokenizer_id=tok).pack_flat(max_length=24)
    return p.batch(microbatch_size=2, global_batch_size=2 * dp_size).options(dp_rank=dp_rank, dp_size=dp_size)


def state_after(p: Pipeline, batches: int) -> dict:
    it = iter(p)
    for _ in range(batches):
        next(it)
    state = p.state_dict()
    it.close()
    return state


def test_a_resume_whose_operators_make_other_documents_is_refused(plan, tok, monkeypatch) -> None:
    state = state_after(pipe(plan, tok), 2)
    assert len(state["num_steps"]["outputs"]) == 16
    same = pipe(plan, tok)
    same.load_state_dict(state)
    assert len(list(same)) > 0  # the same output: resumes as before
    monkeypatch.setitem(PROCESS, "drop_odd", True)  # "another process": the operator now drops odd rows
    other = pipe(plan, tok)
    other.load_state_dict(state)
    with pytest.raises(ConfigError, match=MESSAGE.format("the run this state was saved from")):
        next(iter(other))


def test_ranks_whose_operators_make_other_documents_are_refused_when_their_states_merge(
    plan, tok, monkeypatch
) -> None:
    first = state_after(pipe(plan, tok, dp_rank=0, dp_size=2), 1)
    monkeypatch.setitem(PROCESS, "drop_odd", True)
    second = state_after(pipe(plan, tok, dp_rank=1, dp_size=2), 1)
    with pytest.raises(ConfigError, match=MESSAGE.format(r"on another rank \(the states merged\)")):
        merge_states([first, second])
    monkeypatch.setitem(PROCESS, "drop_odd", False)
    again = state_after(pipe(plan, tok, dp_rank=1, dp_size=2), 1)
    assert merge_states([first, again])["num_steps"] == first["num_steps"]


def test_a_pipeline_without_operators_keeps_its_state_as_it_was(plan, tok) -> None:
    p = Pipeline.from_plan(plan).tokenize(tokenizer_id=tok).pack_flat(max_length=24).batch(microbatch_size=2)
    assert set(state_after(p, 1)["num_steps"]) == {"steps", "drop_last"}


def test_a_dataloader_s_state_carries_them_and_its_resume_compares(plan, tok, monkeypatch) -> None:
    loader = pipe(plan, tok).dataloader(num_workers=2, multiprocessing_context="fork")
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    assert state["num_steps"]["outputs"] == state_after(pipe(plan, tok), 1)["num_steps"]["outputs"]
    monkeypatch.setitem(PROCESS, "drop_odd", True)
    other = pipe(plan, tok).dataloader(num_workers=2, multiprocessing_context="fork")
    other.load_state_dict(state)
    with pytest.raises(ConfigError, match=MESSAGE.format("the run this state was saved from")):
        next(iter(other))
