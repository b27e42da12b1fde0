"""PyTorch Lightning on 2 processes: Trainer(accelerator="cpu", devices=2, strategy="ddp") in two processes
launched as torchrun launches them (gloo). Each rank trains on its half of every global batch; the checkpoint
rank 0 writes holds one rank-independent state (every lane's cursor); resumed mid-epoch on 2 processes and on 1,
the run continues with exactly the global batches of an uninterrupted run."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from support.integration_runs import GLOBAL, make_pipeline, make_plan, run_as_torchrun, uninterrupted_rows

from zephon.integrations.lightning import ZephonDataModule
from zephon.integrations.state_text import KEY

STOP = 3


class Rows(pl.LightningModule):
    """One weight; records each row it trains on (input_ids and labels bytes) by global step."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[int, list[bytes]] = {}

    def training_step(self, batch, index):
        ids, labels = batch["input_ids"], batch["labels"]
        got = [ids[i].numpy().tobytes() + labels[i].numpy().tobytes() for i in range(ids.shape[0])]
        self.seen.setdefault(self.global_step, []).extend(got)
        return ((self.weight - ids.float().mean() / 1000) ** 2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(max_steps: int, devices: int) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", max_steps=max_steps,
        use_distributed_sampler=False, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip


def lightning_rank(rank: int, world: int, plan: str, tokenizer_dir: str, root: str, max_steps: int, resume: str) -> None:
    """One DDP rank: fit to ``max_steps`` (from the checkpoint ``resume`` when given), save ``stop.ckpt`` when not
    resuming, and write the rows it trained on by step."""
    warnings.simplefilter("ignore")
    model = Rows()
    fit = trainer(max_steps, world)
    data = ZephonDataModule(make_pipeline(Path(plan), tokenizer_dir, size=world))  # rank from torch.distributed
    fit.fit(model, datamodule=data, ckpt_path=resume or None)
    if not resume:
        fit.save_checkpoint(f"{root}/stop.ckpt")  # every rank calls it (the state is a collective); rank 0 writes
    Path(f"{root}/seen-{world}-{rank}.pkl").write_bytes(pickle.dumps(model.seen))


def seen(root: Path, world: int) -> list[dict[int, list[bytes]]]:
    return [pickle.loads((root / f"seen-{world}-{rank}.pkl").read_bytes()) for rank in range(world)]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers, mid-epoch resumes and small clusters
        yield


@pytest.fixture(scope="module")
def plan(tmp_path_factory, tokenizer_dir) -> Path:
    return make_plan(tmp_path_factory.mktemp("lightning-ddp"), tokenizer_dir, documents=160)


def test_two_ddp_ranks_share_each_global_batch_and_resume_mid_epoch_on_2_and_on_1_process(
    plan, tokenizer_dir, tmp_path
) -> None:
    whole = uninterrupted_rows(plan, tokenizer_dir)
    end = STOP + 3
    assert len(whole) > end

    run_as_torchrun(lightning_rank, 2, str(plan), tokenizer_dir, str(tmp_path), STOP, "")
    first = seen(tmp_path, 2)
    for step in range(STOP):
        halves = [set(ranks[step]) for ranks in first]
        assert len(halves[0]) == len(halves[1]) == GLOBAL // 2 and not halves[0] & halves[1]  # each rank its share
        assert halves[0] | halves[1] == set(whole[step])
    assert sorted(first[0]) == list(range(STOP))

    checkpoint = torch.load(tmp_path / "stop.ckpt", weights_only=False)
    saved = checkpoint["ZephonDataModule"]
    assert list(saved) == [KEY]
    state = json.loads(saved[KEY])
    assert (state["dp_size"], state["step"], state["microbatch"]) == (2, STOP, 0)
    assert sorted(map(int, state["lane_cursors"])) == list(range(GLOBAL))  # every rank's lanes: one state

    run_as_torchrun(lightning_rank, 2, str(plan), tokenizer_dir, str(tmp_path), end, str(tmp_path / "stop.ckpt"))
    for step in range(STOP, end):
        assert sorted(b for ranks in seen(tmp_path, 2) for b in ranks[step]) == sorted(whole[step]), f"step {step}"
    assert sorted(seen(tmp_path, 2)[1]) == list(range(STOP, end))  # nothing before the checkpoint again

    one = Rows()
    trainer(end, 1).fit(one, datamodule=ZephonDataModule(make_pipeline(plan, tokenizer_dir)), ckpt_path=tmp_path / "stop.ckpt")
    assert one.seen == {step: whole[step] for step in range(STOP, end)}  # 2 → 1: the same rows, in order
