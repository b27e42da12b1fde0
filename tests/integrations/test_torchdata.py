"""torchdata: Pipeline.dataloader's own state behind the StatefulDataLoader protocol resumes exactly at another
worker count; the same batches as a real StatefulDataLoader over to_torch_dataset; wrong arguments refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.integration_runs import make_pipeline, make_plan
from torchdata.stateful_dataloader import Stateful, StatefulDataLoader

from zephon.errors import ConfigError
from zephon.integrations.torchdata import stateful_loader


@pytest.fixture(scope="module")
def plan(tmp_path_factory, tokenizer_dir) -> Path:
    return make_plan(tmp_path_factory.mktemp("torchdata"), tokenizer_dir, documents=160)


def rows(tensors) -> bytes:
    """Every tensor of a ``to_training`` dict (input_ids, labels), byte for byte."""
    return b"".join(tensors[k].numpy().tobytes() for k in sorted(tensors))


def test_the_loader_is_a_stateful_loader_and_yields_a_real_statefuldataloaders_batches(plan, tokenizer_dir) -> None:
    pipeline = make_pipeline(plan, tokenizer_dir)
    loader = stateful_loader(pipeline, num_workers=0, snapshot_every_n_steps=1)
    assert isinstance(loader, Stateful)
    real = StatefulDataLoader(make_pipeline(plan, tokenizer_dir).to_torch_dataset(), batch_size=None)
    assert [rows(t) for t in loader] == [rows(t) for t in real]


def test_a_state_taken_with_two_workers_resumes_exactly_with_one(plan, tokenizer_dir) -> None:
    whole = [rows(t) for t in stateful_loader(make_pipeline(plan, tokenizer_dir))]
    loader = stateful_loader(make_pipeline(plan, tokenizer_dir), num_workers=2)
    taken = []
    for tensors in loader:
        taken.append(rows(tensors))
        if len(taken) == 5:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    again = stateful_loader(make_pipeline(plan, tokenizer_dir), num_workers=1)
    again.load_state_dict(state)
    assert taken + [rows(t) for t in again] == whole
    assert [rows(t) for t in again] == whole  # the next epoch starts at the beginning of the plan


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator")
def test_pinned_batches_resume_exactly(plan, tokenizer_dir) -> None:
    """pin_memory passed through: the same batches and an exact resume, page-locked where an accelerator is
    (a GPU machine runs the pinned check; here torch warns that pinning is off)."""
    import torch

    whole = [rows(t) for t in stateful_loader(make_pipeline(plan, tokenizer_dir))]
    loader = stateful_loader(make_pipeline(plan, tokenizer_dir), num_workers=2, pin_memory=True)
    taken, pinned = [], []
    for tensors in loader:
        taken.append(rows(tensors))
        pinned += [t.is_pinned() for t in tensors.values()]
        if len(taken) == 3:
            break
    again = stateful_loader(make_pipeline(plan, tokenizer_dir), num_workers=1, pin_memory=True)
    again.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    rest = []
    for tensors in again:
        rest.append(rows(tensors))
        pinned += [t.is_pinned() for t in tensors.values()]
    assert taken + rest == whole
    assert all(pinned) if torch.accelerator.is_available() else not any(pinned)


def test_arguments_that_would_change_the_data_are_refused_in_one_line(plan, tokenizer_dir) -> None:
    pipeline = make_pipeline(plan, tokenizer_dir)
    with pytest.raises(ConfigError, match=r"^stateful_loader's batch_size must be None, got 8 — the plan fixes the batches"):
        stateful_loader(pipeline, batch_size=8)
    with pytest.raises(ConfigError, match=r"^stateful_loader's shuffle must be None, got True — "):
        stateful_loader(pipeline, shuffle=True)
    with pytest.raises(ConfigError, match=r"^num_workers must split this rank's 8 packing lanes [^\n]*, got 16 — use num_workers in \[1, 2, 3, 4, 5, 6, 7, 8\]"):
        stateful_loader(pipeline, num_workers=16)


def test_a_worker_init_fn_is_refused_in_one_line_rather_than_never_called(plan, tokenizer_dir) -> None:
    def setup(worker: int) -> None:
        raise AssertionError("never called by Zephon's workers")

    with pytest.raises(ConfigError, match=r"^stateful_loader's worker_init_fn must be None, got <function [^\n]*setup at [^\n]*> — each worker sets itself up and randomness comes from the plan's seed; drop it$"):
        stateful_loader(make_pipeline(plan, tokenizer_dir), num_workers=2, worker_init_fn=setup)
    stateful_loader(make_pipeline(plan, tokenizer_dir), worker_init_fn=None, generator=None)  # the defaults pass


def test_a_statefuldataloader_state_is_refused_in_one_line(plan, tokenizer_dir) -> None:
    real = StatefulDataLoader(make_pipeline(plan, tokenizer_dir).to_torch_dataset(), batch_size=None)
    next(iter(real))
    loader = stateful_loader(make_pipeline(plan, tokenizer_dir))
    with pytest.raises(ConfigError, match=r"^load_state_dict's state must hold a Zephon pipeline state, got a torchdata StatefulDataLoader state"):
        loader.load_state_dict(real.state_dict())


@pytest.mark.parametrize("workers", [0, 1])
def test_a_pipeline_state_taken_inside_documents_resumes_exactly_and_reads_back_unchanged(plan, tokenizer_dir, workers) -> None:
    """Regression: without workers the loader started at the plan's start instead of the state, and a resumed
    lane reported cursor (position, 0) before its first row, dropping the tokens of its document already
    emitted."""
    whole = [rows(t) for t in make_pipeline(plan, tokenizer_dir).dataloader()]
    pipeline = make_pipeline(plan, tokenizer_dir)
    batches = iter(pipeline)
    for _ in range(3):
        next(batches)
    state = pipeline.state_dict()
    assert any(skip for _, skip in state["lane_cursors"].values())  # lanes stand inside documents
    resumed = make_pipeline(plan, tokenizer_dir)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    loader = stateful_loader(resumed, num_workers=workers)
    assert loader.state_dict() == state
    assert [rows(t) for t in loader] == whole[3:]


def test_a_state_of_another_plan_or_at_a_dp_size_not_dividing_the_batch_and_a_torchdata_outside_the_tested_range_are_refused_in_one_line(
    plan, tokenizer_dir, tmp_path_factory
) -> None:
    from zephon.integrations.versions import require_tested

    other = make_plan(tmp_path_factory.mktemp("other"), tokenizer_dir, documents=160, seed=6)
    loader = stateful_loader(make_pipeline(plan, tokenizer_dir))
    with pytest.raises(ConfigError, match=r"^pipeline state must come from the same plan, tokenizer and packing, got a different plan \(config_hash\)[^\n]* — resume with the pipeline that saved it, or start fresh$"):
        loader.load_state_dict(stateful_loader(make_pipeline(other, tokenizer_dir)).state_dict())
    state = loader.state_dict()
    with pytest.raises(ConfigError, match=r"a state's dp_size must divide its global batch of 8 sequences, got dp_size 3 — [^\n]*$"):
        loader.load_state_dict({**state, "dp_size": 3})
    with pytest.raises(ConfigError, match=r"^torchdata must be in the range zephon.integrations was tested with \(>=0.11,<0.12\), got 0.10.1 — pip install 'torchdata>=0.11,<0.12'$"):
        require_tested("torchdata", "0.10.1")
