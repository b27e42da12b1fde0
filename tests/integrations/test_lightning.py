"""PyTorch Lightning: Trainer(max_steps=3) on CPU, checkpointed and resumed to step 6, trains on exactly the
batches of an uninterrupted 6-step run (the state rides in Lightning's checkpoint; the batch Lightning fetched
ahead is not skipped)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from support.integration_runs import make_pipeline, make_plan

from zephon.errors import ConfigError
from zephon.integrations.lightning import ZephonDataModule


class Tiny(pl.LightningModule):
    """One weight; records the bytes of every batch it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[bytes] = []

    def training_step(self, batch, index):
        self.seen.append(b"".join(batch[k].numpy().tobytes() for k in sorted(batch)))
        return ((self.weight - batch["input_ids"].float().mean() / 1000) ** 2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(max_steps: int, **options) -> pl.Trainer:
    options.setdefault("use_distributed_sampler", False)
    return pl.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, **options,
    )


@pytest.fixture(scope="module")
def plan(tmp_path_factory, tokenizer_dir) -> Path:
    return make_plan(tmp_path_factory.mktemp("lightning"), tokenizer_dir, documents=160)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and mid-epoch resumes
        yield


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_stopped_at_step_3_and_resumed_from_its_checkpoint_trains_on_the_uninterrupted_batches(
    plan, tokenizer_dir, tmp_path, workers
) -> None:
    whole = Tiny()
    trainer(6).fit(whole, datamodule=ZephonDataModule(make_pipeline(plan, tokenizer_dir)))
    assert len(whole.seen) == 6
    first = Tiny()
    stopped = trainer(3)
    stopped.fit(first, datamodule=ZephonDataModule(make_pipeline(plan, tokenizer_dir), num_workers=workers))
    stopped.save_checkpoint(tmp_path / "step3.ckpt")
    second = Tiny()
    data = ZephonDataModule(make_pipeline(plan, tokenizer_dir), num_workers=workers)
    trainer(6).fit(second, datamodule=data, ckpt_path=tmp_path / "step3.ckpt")
    assert first.seen + second.seen == whole.seen
    assert torch.equal(second.weight, whole.weight)


def test_use_distributed_sampler_and_a_checkpoint_without_the_state_are_refused_in_one_line(
    plan, tokenizer_dir, tmp_path
) -> None:
    with pytest.raises(ConfigError, match=r"^ZephonDataModule needs Trainer\(use_distributed_sampler=False\), got True — "):
        trainer(1, use_distributed_sampler=True).fit(Tiny(), datamodule=ZephonDataModule(make_pipeline(plan, tokenizer_dir)))
    plain = trainer(1)
    plain.fit(Tiny(), train_dataloaders=make_pipeline(plan, tokenizer_dir).dataloader())
    plain.save_checkpoint(tmp_path / "plain.ckpt")
    with pytest.raises(ConfigError, match=r"^the checkpoint \S+plain.ckpt must hold the ZephonDataModule's state to resume, got none — "):
        trainer(2).fit(Tiny(), datamodule=ZephonDataModule(make_pipeline(plan, tokenizer_dir)), ckpt_path=tmp_path / "plain.ckpt")


def test_a_lightning_version_outside_the_tested_range_is_refused_in_one_line() -> None:
    from zephon.integrations.versions import require_tested

    with pytest.raises(ConfigError, match=r"^pytorch-lightning must be in the range zephon.integrations was tested with \(>=2.6,<3.0\), got 1.9.5 — pip install 'pytorch-lightning>=2.6,<3.0'$"):
        require_tested("pytorch-lightning", "1.9.5")


def test_a_checkpoint_of_another_plan_a_state_at_a_dp_size_not_dividing_the_batch_and_workers_beyond_the_lanes_are_refused_in_one_line(
    plan, tokenizer_dir, tmp_path_factory
) -> None:
    from zephon.integrations.state_text import pack

    other = make_plan(tmp_path_factory.mktemp("other"), tokenizer_dir, documents=160, seed=6)
    data = ZephonDataModule(make_pipeline(plan, tokenizer_dir))
    with pytest.raises(ConfigError, match=r"^pipeline state must come from the same plan, tokenizer and packing, got a different plan \(config_hash\)[^\n]* — resume with the pipeline that saved it, or start fresh$"):
        data.load_state_dict(ZephonDataModule(make_pipeline(other, tokenizer_dir)).state_dict())
    state = make_pipeline(plan, tokenizer_dir).state_dict()
    with pytest.raises(ConfigError, match=r"^the Lightning checkpoint's ZephonDataModule state: a state's dp_size must divide its global batch of 8 sequences, got dp_size 3 — [^\n]*$"):
        data.load_state_dict(pack({**state, "dp_size": 3}))
    with pytest.raises(ConfigError, match=r"^num_workers must split this rank's 8 packing lanes [^\n]*, got 16 — use num_workers in \[1, 2, 3, 4, 5, 6, 7, 8\][^\n]*$"):
        ZephonDataModule(make_pipeline(plan, tokenizer_dir), num_workers=16).train_dataloader()


def test_accumulate_grad_batches_other_than_the_pipelines_microbatches_per_step_is_refused_when_fit_starts(
    plan, tokenizer_dir
) -> None:
    from zephon import Pipeline
    from zephon.integrations.state_text import unpack

    def halves():  # microbatches of 4 rows: 2 per global batch of 8
        pipeline = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=33)
        return pipeline.batch(microbatch_size=4, global_batch_size=8)

    model = Tiny()
    with pytest.raises(ConfigError, match=r"^accumulate_grad_batches must be the pipeline's 2 microbatches per step, got 1 — pass Trainer\(accumulate_grad_batches=2\)$"):
        trainer(3).fit(model, datamodule=ZephonDataModule(halves()))
    assert model.seen == []
    data = ZephonDataModule(halves())
    trainer(3, accumulate_grad_batches=2).fit(model, datamodule=data)
    state = unpack(data.state_dict(), "the state")
    assert (len(model.seen), state["step"], state["microbatch"]) == (6, 3, 0)  # 3 whole global batches


def test_a_fit_resumed_mid_epoch_with_loaders_reloaded_every_epoch_trains_both_epochs(
    tokenizer_dir, tmp_path_factory, tmp_path
) -> None:
    """reload_dataloaders_every_n_epochs=1: Lightning asks for a new loader at epoch 1 with ckpt_path still set;
    the module took that for a checkpoint without its state and the resumed fit died at the epoch boundary (and
    the pipeline's loaded state, applied to every later loader, would have started epoch 1 at the checkpoint's
    step). Now epoch 1 is the plan from its start, as in the uninterrupted run."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    small = make_plan(tmp_path_factory.mktemp("lightning-epochs"), tokenizer_dir, documents=40)

    def fit(model: Tiny, data: ZephonDataModule, **options) -> None:
        pl.Trainer(
            accelerator="cpu", devices=1, max_epochs=2, max_steps=-1, logger=False, enable_progress_bar=False,
            enable_model_summary=False, use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1, **options,
        ).fit(model, datamodule=data)  # fmt: skip

    whole = Tiny()
    fit(whole, ZephonDataModule(make_pipeline(small, tokenizer_dir)), enable_checkpointing=False)
    per_epoch = len(whole.seen) // 2
    assert per_epoch > 3 and whole.seen[:per_epoch] == whole.seen[per_epoch:]
    first = Tiny()
    saver = ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=3, save_top_k=-1)
    fit(first, ZephonDataModule(make_pipeline(small, tokenizer_dir)), callbacks=[saver])
    (checkpoint,) = tmp_path.glob("*step=3.ckpt")
    second = Tiny()
    pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, max_steps=-1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1,
        enable_checkpointing=False,
    ).fit(second, datamodule=ZephonDataModule(make_pipeline(small, tokenizer_dir)), ckpt_path=checkpoint)  # fmt: skip
    assert first.seen[:3] + second.seen == whole.seen
