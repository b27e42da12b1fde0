"""Hugging Face Trainer on 2 processes launched as torchrun launches them (Accelerate's MULTI_CPU, gloo). Each rank
trains on its half of every global batch; checkpoint-3 holds one rank-independent zephon_state.json (every
lane's cursor); resumed from it on 2 processes and on 1, training continues with exactly the global batches of an
uninterrupted run."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import pytest
import torch
from support.integration_runs import GLOBAL, make_pipeline, make_plan, run_as_torchrun, uninterrupted_rows
from transformers import TrainingArguments

from zephon.integrations.hf import STATE_FILE, ZephonTrainer

STOP = 3


class Rows(torch.nn.Module):
    """One weight; records each row it trains on (input_ids and labels bytes), forward pass by forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[bytes]] = []

    def forward(self, input_ids, labels):
        self.seen.append([input_ids[i].numpy().tobytes() + labels[i].numpy().tobytes() for i in range(len(labels))])
        return {"loss": ((self.weight - input_ids.float().mean() / 1000) ** 2).sum()}


def arguments(out: str, max_steps: int) -> TrainingArguments:
    return TrainingArguments(
        output_dir=out, max_steps=max_steps, ignore_data_skip=True, save_strategy="steps", save_steps=STOP,
        per_device_train_batch_size=GLOBAL, logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_pin_memory=False, learning_rate=0.1, lr_scheduler_type="constant",
    )  # fmt: skip


def hf_rank(rank: int, world: int, plan: str, tokenizer_dir: str, root: str, max_steps: int, resume: bool) -> None:
    """One rank of a Trainer run to ``max_steps`` (from the latest checkpoint when ``resume``), writing the rows
    it trained on."""
    warnings.simplefilter("ignore")
    model = Rows()
    pipeline = make_pipeline(Path(plan), tokenizer_dir, size=world)  # the rank from torch.distributed
    ZephonTrainer(model=model, args=arguments(f"{root}/run", max_steps), pipeline=pipeline).train(
        resume_from_checkpoint=resume or None
    )
    Path(f"{root}/seen-{world}-{rank}-{int(resume)}.pkl").write_bytes(pickle.dumps(model.seen))


def seen(root: Path, world: int, resume: bool) -> list[list[list[bytes]]]:
    return [pickle.loads((root / f"seen-{world}-{rank}-{int(resume)}.pkl").read_bytes()) for rank in range(world)]


@pytest.fixture(scope="module")
def plan(tmp_path_factory, tokenizer_dir) -> Path:
    return make_plan(tmp_path_factory.mktemp("hf-ddp"), tokenizer_dir, documents=160)


def test_two_ranks_share_each_global_batch_and_resume_from_checkpoint_3_on_2_and_on_1_process(
    plan, tokenizer_dir, tmp_path
) -> None:
    whole = uninterrupted_rows(plan, tokenizer_dir)
    end = STOP + 3
    assert len(whole) > end

    run_as_torchrun(hf_rank, 2, str(plan), tokenizer_dir, str(tmp_path), STOP, False)
    first = seen(tmp_path, 2, False)
    assert [len(ranks) for ranks in first] == [STOP, STOP]
    for step in range(STOP):
        halves = [set(ranks[step]) for ranks in first]
        assert len(halves[0]) == len(halves[1]) == GLOBAL // 2 and not halves[0] & halves[1]  # each rank its share
        assert halves[0] | halves[1] == set(whole[step])

    state = json.loads((tmp_path / "run" / f"checkpoint-{STOP}" / STATE_FILE).read_text(encoding="utf-8"))
    assert (state["dp_size"], state["step"], state["microbatch"]) == (2, STOP, 0)
    assert sorted(map(int, state["lane_cursors"])) == list(range(GLOBAL))  # every rank's lanes: one state

    run_as_torchrun(hf_rank, 2, str(plan), tokenizer_dir, str(tmp_path), end, True)
    again = seen(tmp_path, 2, True)
    assert [len(ranks) for ranks in again] == [end - STOP] * 2
    for i, step in enumerate(range(STOP, end)):
        assert sorted(again[0][i] + again[1][i]) == sorted(whole[step]), f"step {step}"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = Rows()
        args = arguments(str(tmp_path / "run"), end)
        ZephonTrainer(model=one, args=args, pipeline=make_pipeline(plan, tokenizer_dir)).train(
            resume_from_checkpoint=str(tmp_path / "run" / f"checkpoint-{STOP}")
        )
    assert one.seen == whole[STOP:end]  # 2 → 1: the same rows, in order
