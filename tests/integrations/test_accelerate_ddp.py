"""A hand-written Accelerate loop on 2 processes (MULTI_CPU, gloo; launched as torchrun launches them): each rank
iterates its own share of ``pipeline.dataloader()`` (never prepared, so never dispatched), the state registered
with ``accelerator.register_for_checkpointing(DataCheckpoint(loader))`` is saved by ``save_state`` as one merged
state (Accelerate writes custom objects from the main process only), and ``load_state`` on 2 processes and on 1
continues with exactly the global batches of an uninterrupted run."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from support.integration_runs import GLOBAL, make_pipeline, make_plan, run_as_torchrun, uninterrupted_rows

from zephon.integrations.dcp import DataCheckpoint
from zephon.integrations.hf import check_accelerator  # imported here: the forked ranks share it (transformers)

STOP = 3


def accelerate_rank(rank: int, world: int, plan: str, tokenizer_dir: str, root: str, mode: str) -> None:
    """``save``: 3 steps, then ``accelerator.save_state``; ``load``: ``load_state`` at this world size and every
    later step's rows."""
    warnings.simplefilter("ignore")
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == world
    check_accelerator(accelerator)
    loader = make_pipeline(Path(plan), tokenizer_dir, size=world).dataloader()  # rank from torch.distributed
    accelerator.register_for_checkpointing(DataCheckpoint(loader))
    rows: dict[int, list[bytes]] = {}
    if mode == "load":
        accelerator.load_state(f"{root}/state")
    for step, tensors in enumerate(loader, start=STOP if mode == "load" else 0):
        ids, labels = tensors["input_ids"], tensors["labels"]
        rows[step] = [ids[i].numpy().tobytes() + labels[i].numpy().tobytes() for i in range(ids.shape[0])]
        if mode == "save" and step == STOP - 1:
            break
    if mode == "save":
        accelerator.save_state(f"{root}/state")  # every rank (state_dict is a collective); the main one writes
    Path(f"{root}/{mode}-{world}-{rank}.pkl").write_bytes(pickle.dumps(rows))
    accelerator.end_training()


@pytest.fixture(scope="module")
def plan(tmp_path_factory, tokenizer_dir) -> Path:
    return make_plan(tmp_path_factory.mktemp("accelerate-ddp"), tokenizer_dir, documents=160)


def test_accelerate_save_state_at_2_processes_resumes_on_2_and_on_1_with_the_uninterrupted_global_batches(
    plan, tokenizer_dir, tmp_path
) -> None:
    whole = uninterrupted_rows(plan, tokenizer_dir)

    run_as_torchrun(accelerate_rank, 2, str(plan), tokenizer_dir, str(tmp_path), "save")
    first = [pickle.loads((tmp_path / f"save-2-{rank}.pkl").read_bytes()) for rank in range(2)]
    for step in range(STOP):
        halves = [set(ranks[step]) for ranks in first]
        assert len(halves[0]) == len(halves[1]) == GLOBAL // 2 and not halves[0] & halves[1]  # each rank its share
        assert halves[0] | halves[1] == set(whole[step])
    saved = torch.load(tmp_path / "state" / "custom_checkpoint_0.pkl", weights_only=False)
    state = json.loads(saved["zephon_state"])
    assert (state["dp_size"], state["step"]) == (2, STOP)
    assert sorted(map(int, state["lane_cursors"])) == list(range(GLOBAL))  # every rank's lanes: one state

    for world in (2, 1):
        run_as_torchrun(accelerate_rank, world, str(plan), tokenizer_dir, str(tmp_path), "load")
        resumed: dict[int, list[bytes]] = {}
        for rank in range(world):
            for step, got in pickle.loads((tmp_path / f"load-{world}-{rank}.pkl").read_bytes()).items():
                resumed.setdefault(step, []).extend(got)
        assert sorted(resumed) == list(range(STOP, len(whole))), f"world {world}"
        for step, got in resumed.items():
            assert sorted(got) == sorted(whole[step]), f"step {step} at world {world}"
