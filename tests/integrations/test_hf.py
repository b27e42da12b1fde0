"""Hugging Face Trainer: a run checkpointed at step 3 and resumed to step 6 trains on exactly the batches (and
ends on exactly the weights) of an uninterrupted 6-step run; max_steps comes from num_steps(); Accelerate's
dispatching and the Trainer's own data replay are refused in one line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from support.integration_runs import make_pipeline, make_plan
from transformers import TrainingArguments

from zephon.errors import ConfigError
from zephon.integrations.hf import STATE_FILE, ZephonTrainer, check_accelerator


class Tiny(torch.nn.Module):
    """One weight; records the bytes of every batch it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[bytes] = []

    def forward(self, input_ids, labels):
        self.seen.append(input_ids.numpy().tobytes() + labels.numpy().tobytes())
        return {"loss": ((self.weight - input_ids.float().mean() / 1000) ** 2).sum()}


def arguments(out: Path, max_steps: int = -1, **options) -> TrainingArguments:
    options.setdefault("ignore_data_skip", True)
    return TrainingArguments(
        output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=8, save_strategy="steps",
        save_steps=3, logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_pin_memory=False, learning_rate=0.1, lr_scheduler_type="constant", **options,
    )


@pytest.fixture(scope="module")
def plan(tmp_path_factory, tokenizer_dir) -> Path:
    return make_plan(tmp_path_factory.mktemp("hf"), tokenizer_dir, documents=160)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_a_run_resumed_from_its_step_3_checkpoint_trains_on_the_uninterrupted_batches(plan, tokenizer_dir, tmp_path) -> None:
    whole = Tiny()
    ZephonTrainer(model=whole, args=arguments(tmp_path / "whole", 6), pipeline=make_pipeline(plan, tokenizer_dir)).train()
    assert len(whole.seen) == 6
    first = Tiny()
    ZephonTrainer(model=first, args=arguments(tmp_path / "run", 3), pipeline=make_pipeline(plan, tokenizer_dir)).train()
    assert (tmp_path / "run" / "checkpoint-3" / STATE_FILE).is_file()
    second = Tiny()
    resumed = ZephonTrainer(model=second, args=arguments(tmp_path / "run", 6), pipeline=make_pipeline(plan, tokenizer_dir), num_workers=2)
    resumed.train(resume_from_checkpoint=True)
    assert first.seen + second.seen == whole.seen
    assert torch.equal(second.weight, whole.weight)


def test_max_steps_defaults_to_the_pipelines_num_steps_and_a_larger_one_is_refused(plan, tokenizer_dir, tmp_path) -> None:
    pipeline = make_pipeline(plan, tokenizer_dir)
    steps = pipeline.num_steps()
    trainer = ZephonTrainer(model=Tiny(), args=arguments(tmp_path), pipeline=pipeline)
    assert trainer.args.max_steps == steps
    with pytest.raises(ConfigError, match=rf"^max_steps must be at most the pipeline's {steps} steps \(pipeline.num_steps\(\)\), got {steps + 1} — "):
        ZephonTrainer(model=Tiny(), args=arguments(tmp_path, steps + 1), pipeline=pipeline)


def test_dispatch_batches_replay_and_a_checkpoint_without_the_state_are_refused_in_one_line(plan, tokenizer_dir, tmp_path) -> None:
    pipeline = make_pipeline(plan, tokenizer_dir)
    with pytest.raises(ConfigError, match=r"^TrainingArguments\(accelerator_config=\{'dispatch_batches': ...\}\) must be None or False for ZephonTrainer, got True — "):
        ZephonTrainer(model=Tiny(), args=arguments(tmp_path, accelerator_config={"dispatch_batches": True}), pipeline=pipeline)
    with pytest.raises(ConfigError, match=r"^ZephonTrainer needs TrainingArguments\(ignore_data_skip=True\), got False — "):
        ZephonTrainer(model=Tiny(), args=arguments(tmp_path, ignore_data_skip=False), pipeline=pipeline)
    with pytest.raises(ConfigError, match=r"^gradient_accumulation_steps must be the pipeline's 1 microbatches per step, got 2 — "):
        ZephonTrainer(model=Tiny(), args=arguments(tmp_path, gradient_accumulation_steps=2), pipeline=pipeline)
    (tmp_path / "checkpoint-3").mkdir()
    with pytest.raises(ConfigError, match=rf"^checkpoint \S+checkpoint-3 must hold {STATE_FILE} to resume the data, got none — "):
        ZephonTrainer(model=Tiny(), args=arguments(tmp_path), pipeline=pipeline).train(resume_from_checkpoint=True)
    with pytest.raises(ConfigError, match=r"^Accelerator\(dataloader_config=DataLoaderConfiguration\(dispatch_batches=...\)\) must be None or False for a Zephon loader, got True — "):
        check_accelerator(Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True)))


def test_a_checkpoint_of_another_plan_a_state_at_a_dp_size_not_dividing_the_batch_and_workers_beyond_the_lanes_are_refused_in_one_line(
    plan, tokenizer_dir, tmp_path, tmp_path_factory
) -> None:
    other = make_plan(tmp_path_factory.mktemp("other"), tokenizer_dir, documents=160, seed=6)
    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    trainer = ZephonTrainer(model=Tiny(), args=arguments(tmp_path), pipeline=make_pipeline(plan, tokenizer_dir))
    (checkpoint / STATE_FILE).write_text(json.dumps(make_pipeline(other, tokenizer_dir).state_dict()), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^pipeline state must come from the same plan, tokenizer and packing, got a different plan \(config_hash\)[^\n]* — resume with the pipeline that saved it, or start fresh$"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    state = make_pipeline(plan, tokenizer_dir).state_dict()
    (checkpoint / STATE_FILE).write_text(json.dumps({**state, "dp_size": 3}), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"a state's dp_size must divide its global batch of 8 sequences, got dp_size 3 — [^\n]*$"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    (checkpoint / STATE_FILE).write_text(json.dumps(state)[:40], encoding="utf-8")  # cut short
    with pytest.raises(ConfigError, match=rf"^\S+checkpoint-3/{STATE_FILE} must be the JSON state ZephonTrainer wrote, got text failing with Unterminated string [^\n]* — resume from another checkpoint, or train without resume_from_checkpoint$"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    wide = ZephonTrainer(model=Tiny(), args=arguments(tmp_path), pipeline=make_pipeline(plan, tokenizer_dir), num_workers=16)
    with pytest.raises(ConfigError, match=r"^num_workers must split this rank's 8 packing lanes [^\n]*, got 16 — use num_workers in \[1, 2, 3, 4, 5, 6, 7, 8\][^\n]*$"):
        wide.get_train_dataloader()


def test_a_transformers_or_accelerate_version_outside_the_tested_range_is_refused_in_one_line() -> None:
    from zephon.integrations.versions import require_tested

    with pytest.raises(ConfigError, match=r"^transformers must be in the range zephon.integrations was tested with \(>=5.18,<6.0\), got 4.57.1 — pip install 'transformers>=5.18,<6.0'$"):
        require_tested("transformers", "4.57.1")
    with pytest.raises(ConfigError, match=r"^accelerate must be in the range zephon.integrations was tested with \(>=1.10,<2.0\), got 0.34.2 — pip install 'accelerate>=1.10,<2.0'$"):
        require_tested("accelerate", "0.34.2")


def test_resume_from_checkpoint_true_without_a_checkpoint_in_output_dir_is_refused_in_one_line(plan, tokenizer_dir, tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "empty", tmp_path / "missing"):  # no checkpoint-N folder; no folder at all
        model = Tiny()
        trainer = ZephonTrainer(model=model, args=arguments(folder, 3), pipeline=make_pipeline(plan, tokenizer_dir))
        with pytest.raises(ConfigError, match=rf"^resume_from_checkpoint=True must find a checkpoint-N folder in output_dir '{folder}', got none — pass the checkpoint's path, or train without resume_from_checkpoint$"):
            trainer.train(resume_from_checkpoint=True)
        assert model.seen == []  # refused before a step, rather than training from step 0


def test_the_callers_training_arguments_are_left_unchanged_and_reused_for_a_longer_plan_run_it_whole(
    plan, tokenizer_dir, tmp_path, tmp_path_factory
) -> None:
    short = make_pipeline(make_plan(tmp_path_factory.mktemp("short"), tokenizer_dir, documents=40), tokenizer_dir)
    given = arguments(tmp_path)
    first = ZephonTrainer(Tiny(), given, pipeline=short)  # positional args, as Trainer(model, args) takes them
    assert (first.args.max_steps, given.max_steps) == (short.num_steps(), -1)
    longer = make_pipeline(plan, tokenizer_dir)
    assert longer.num_steps() > short.num_steps()
    second = ZephonTrainer(model=Tiny(), args=given, pipeline=longer)
    assert (second.args.max_steps, given.max_steps) == (longer.num_steps(), -1)


def test_the_training_arguments_dataloader_num_workers_is_used_and_a_different_num_workers_is_refused_in_one_line(
    plan, tokenizer_dir, tmp_path
) -> None:
    pipeline = make_pipeline(plan, tokenizer_dir)
    wide = ZephonTrainer(model=Tiny(), args=arguments(tmp_path, dataloader_num_workers=16), pipeline=pipeline)
    with pytest.raises(ConfigError, match=r"^num_workers must split this rank's 8 packing lanes [^\n]*, got 16 — "):
        wide.get_train_dataloader()
    with pytest.raises(ConfigError, match=r"^ZephonTrainer's num_workers must match TrainingArguments\(dataloader_num_workers=...\) when both are set, got 1 and 2 — set it in one place$"):
        ZephonTrainer(model=Tiny(), args=arguments(tmp_path, dataloader_num_workers=2), pipeline=pipeline, num_workers=1)
