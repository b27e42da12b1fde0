"""torch.distributed.checkpoint: one rank-independent state under one key, saved at dp 4 (gloo, 4 spawned
processes), loaded at dp 2 and dp 8, continues with exactly the global steps of an uninterrupted run."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from support.integration_runs import GLOBAL, dcp_rank, global_rows, make_pipeline, make_plan

from zephon.errors import ConfigError
from zephon.integrations.dcp import DataCheckpoint
from zephon.integrations.state_text import KEY, pack

SAVE_STEP = 3


@pytest.fixture(scope="module")
def plan(tmp_path_factory, tokenizer_dir) -> Path:
    return make_plan(tmp_path_factory.mktemp("dcp"), tokenizer_dir)


def run_ranks(world: int, mode: str, plan: Path, tokenizer_dir: str, root: Path) -> None:
    """``world`` ranks under gloo, started by torch.multiprocessing (fork: the ranks share this process's imports,
    so 14 ranks start in seconds on 2 cores; the state crosses only through DCP's files)."""
    args = (world, mode, str(plan), tokenizer_dir, str(root), SAVE_STEP)
    mp.start_processes(dcp_rank, args=args, nprocs=world, start_method="fork")


def test_a_state_saved_by_dcp_at_dp_4_resumes_at_dp_2_and_8_with_the_uninterrupted_global_steps(
    plan, tokenizer_dir, tmp_path
) -> None:
    whole = global_rows(make_pipeline(plan, tokenizer_dir))
    assert len(whole) > SAVE_STEP + 3
    run_ranks(4, "save", plan, tokenizer_dir, tmp_path)
    for world in (2, 8):
        run_ranks(world, "load", plan, tokenizer_dir, tmp_path)
        resumed: dict[int, dict[int, bytes]] = {}
        for rank in range(world):
            for step, rows in pickle.loads((tmp_path / f"out-{world}" / f"rank-{rank}.pkl").read_bytes()).items():
                assert not set(rows) & set(resumed.get(step, {}))  # no sequence on two ranks
                resumed.setdefault(step, {}).update(rows)
        assert sorted(resumed) == list(range(SAVE_STEP, len(whole)))
        for step, rows in resumed.items():
            assert sorted(rows) == list(range(step * GLOBAL, (step + 1) * GLOBAL))
            assert rows == whole[step], f"step {step} at dp {world}"


def test_the_state_is_one_json_value_under_one_key_and_loads_in_one_process(plan, tokenizer_dir) -> None:
    pipeline = make_pipeline(plan, tokenizer_dir)
    batches = iter(pipeline)
    for _ in range(2):
        next(batches)
    saved = DataCheckpoint(pipeline).state_dict()
    assert list(saved) == [KEY] and isinstance(saved[KEY], str)
    again = make_pipeline(plan, tokenizer_dir)
    DataCheckpoint(again).load_state_dict(saved)
    rest = global_rows(again)
    assert min(rest) == 2 and rest == {s: r for s, r in global_rows(make_pipeline(plan, tokenizer_dir)).items() if s >= 2}


def test_a_checkpoint_of_another_plan_is_refused_in_one_line(plan, tokenizer_dir, tmp_path_factory) -> None:
    other = make_plan(tmp_path_factory.mktemp("other"), tokenizer_dir, seed=6)
    saved = DataCheckpoint(make_pipeline(other, tokenizer_dir)).state_dict()
    with pytest.raises(ConfigError, match=r"^pipeline state must come from the same plan, tokenizer and packing, got a different plan \(config_hash\)[^\n]*start fresh$"):
        DataCheckpoint(make_pipeline(plan, tokenizer_dir)).load_state_dict(saved)


def test_a_state_whose_dp_size_does_not_divide_its_global_batch_is_refused_in_one_line(plan, tokenizer_dir) -> None:
    state = make_pipeline(plan, tokenizer_dir).state_dict()
    with pytest.raises(ConfigError, match=r"^the checkpoint's data state: a state's dp_size must divide its global batch of 8 sequences, got dp_size 3 — [^\n]*$"):
        DataCheckpoint(make_pipeline(plan, tokenizer_dir)).load_state_dict(pack({**state, "dp_size": 3}))


def test_a_statefuldataloader_state_or_a_bare_state_is_refused_in_one_line(plan, tokenizer_dir) -> None:
    data = DataCheckpoint(make_pipeline(plan, tokenizer_dir))
    with pytest.raises(ConfigError, match=r"^the checkpoint's data state must hold a Zephon pipeline state, got a torchdata StatefulDataLoader state"):
        data.load_state_dict({"_snapshot": {}, "_steps_since_snapshot": 0})
    with pytest.raises(ConfigError, match=r"^the checkpoint's data state must be \{'zephon_state': JSON text\}, got \['step', "):
        data.load_state_dict({"step": 3, "version": 1})


def test_a_torch_version_outside_the_tested_range_is_refused_in_one_line() -> None:
    from zephon.integrations.versions import require_tested

    with pytest.raises(ConfigError, match=r"^torch must be in the range zephon.integrations was tested with \(>=2.6,<3.0\), got 2.5.1\+cpu — pip install 'torch>=2.6,<3.0'$"):
        require_tested("torch", "2.5.1+cpu")
