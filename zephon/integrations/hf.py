"""Hugging Face ``Trainer`` and Accelerate: the pipeline's loader plugged in as it is, saved and restored with
the trainer's checkpoints.

Accelerate's ``prepare`` would wrap a ``DataLoader`` in a ``DataLoaderDispatcher`` when ``dispatch_batches`` is
on (its default for iterable datasets): rank 0 reads every rank's batches and broadcasts them, so one process
tokenizes for all. Zephon gives each rank its own share already, so its loader is never prepared, and
``dispatch_batches=True`` is refused in one line.

``ZephonTrainer`` (a ``transformers.Trainer``):

* trains on ``pipeline.dataloader(...)`` (``get_train_dataloader``), one microbatch per forward pass, with
  ``TrainingArguments``' ``dataloader_num_workers``, ``dataloader_persistent_workers`` and
  ``dataloader_prefetch_factor`` unless the same setting is passed to ``ZephonTrainer`` (both, differing: refused);
  ``gradient_accumulation_steps`` must be the pipeline's microbatches per step ``A``, and ``max_steps`` is
  ``pipeline.num_steps()`` when left at -1 (a larger one is refused: the plan would start again), set on the
  trainer's own copy of the arguments — the caller's ``TrainingArguments`` stay as given, so they can be reused;
  ``num_train_epochs`` is unused: a run is at most one pass over the plan;
* writes the merged state, after the microbatches the optimizer steps took (``global_step × A`` since the
  iteration started; ``zephon.integrations.consumed``), as ``zephon_state.json`` into every
  ``checkpoint-N`` folder (all ranks compute it together; the process that saves writes it);
* on ``train(resume_from_checkpoint=...)`` loads it and continues there. The Trainer's own replay of the data
  (``skip_first_batches``) must be off: ``TrainingArguments(ignore_data_skip=True)``, refused otherwise; a
  checkpoint folder without ``zephon_state.json``, and ``resume_from_checkpoint=True`` with no ``checkpoint-N``
  folder in ``output_dir``, are refused rather than restarting the data at step 0.

For a hand-written Accelerate loop, ``check_accelerator(accelerator)`` refuses ``dispatch_batches=True``, and
``accelerator.register_for_checkpointing(DataCheckpoint(loader))`` (``zephon.integrations.dcp``) puts the
merged state into ``accelerator.save_state`` / ``load_state`` (Accelerate writes it from the main process only:
the state must be the merged one).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from zephon.errors import ConfigError
from zephon.integrations.accumulation import check_accumulation
from zephon.integrations.consumed import ConsumedLoader
from zephon.integrations.state_text import check_portable
from zephon.integrations.versions import require_tested
from zephon.storage.files import write_atomic

#: The file a checkpoint folder holds the pipeline state in.
STATE_FILE = "zephon_state.json"
#: ``Pipeline.dataloader`` settings ``TrainingArguments`` also names: (its field, the loader's default).
FROM_ARGUMENTS: dict[str, tuple[str, Any]] = {
    "num_workers": ("dataloader_num_workers", 0),
    "persistent_workers": ("dataloader_persistent_workers", False),
    "prefetch_factor": ("dataloader_prefetch_factor", None),
}


def check_accelerator(accelerator: Any) -> None:
    """Refuse ``dispatch_batches=True`` (rank 0 would read and broadcast every rank's batches)."""
    require_tested("accelerate")
    if accelerator.dispatch_batches:
        raise ConfigError(
            "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=...)) must be None or False for "
            "a Zephon loader, got True — each rank reads its own share; leave dispatch_batches unset"
        )


class _Counted:
    """The loader the Trainer iterates; notes the global step each iteration starts at."""

    def __init__(self, trainer: ZephonTrainer) -> None:
        self.trainer = trainer

    def __iter__(self) -> Iterator[Any]:
        self.trainer._start_step = self.trainer.state.global_step
        assert self.trainer._consumed is not None
        return iter(self.trainer._consumed)


def _copy_arguments(positional: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The Trainer's ``args`` (second positional, or keyword) replaced by a shallow copy, so that resolving
    ``max_steps`` leaves the caller's ``TrainingArguments`` as given; returns the positional arguments."""
    if "args" in kwargs:
        kwargs["args"] = copy.copy(kwargs["args"])
    elif len(positional) > 1:
        positional = (positional[0], copy.copy(positional[1]), *positional[2:])
    return positional


class ZephonTrainer(Trainer):
    """A ``transformers.Trainer`` over a Zephon pipeline (module docstring). ``num_workers`` and the other
    ``Pipeline.dataloader`` arguments change speed only (unset: ``TrainingArguments``' ``dataloader_*`` values);
    ``training`` goes to ``batch.to_training``."""

    def __init__(
        self,
        *args: Any,
        pipeline: Any,
        num_workers: int | None = None,
        training: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        require_tested("transformers")
        require_tested("accelerate")
        loader = {k: kwargs.pop(k) for k in ("pin_memory", "persistent_workers", "prefetch_factor") if k in kwargs}
        if num_workers is not None:
            loader["num_workers"] = num_workers
        super().__init__(*_copy_arguments(args, kwargs), **kwargs)
        self.pipeline = pipeline
        self.loader_options = self._loader_options(loader)
        self.training = dict(training or {})
        self._consumed: ConsumedLoader | None = None
        self._pending: dict[str, Any] | None = None
        self._start_step = 0
        self._check_arguments()

    def _loader_options(self, given: dict[str, Any]) -> dict[str, Any]:
        """``given`` completed with ``TrainingArguments``' ``dataloader_*`` values; a setting both name differently
        is refused."""
        options = dict(given)
        for name, (field, default) in FROM_ARGUMENTS.items():
            declared = getattr(self.args, field)
            if name not in options:
                options[name] = declared
            elif declared != default and declared != options[name]:
                raise ConfigError(
                    f"ZephonTrainer's {name} must match TrainingArguments({field}=...) when both are set, got "
                    f"{options[name]!r} and {declared!r} — set it in one place"
                )
        return options

    def _check_arguments(self) -> None:
        args = self.args
        if args.accelerator_config.dispatch_batches:
            raise ConfigError(
                "TrainingArguments(accelerator_config={'dispatch_batches': ...}) must be None or False for "
                "ZephonTrainer, got True — each rank reads its own share; leave dispatch_batches unset"
            )
        if not args.ignore_data_skip:
            raise ConfigError(
                "ZephonTrainer needs TrainingArguments(ignore_data_skip=True), got False — the loader resumes from "
                "its checkpointed state; the Trainer's replay would skip those batches a second time"
            )
        check_accumulation(
            self.pipeline,
            args.gradient_accumulation_steps,
            owner="TrainingArguments",
            key="gradient_accumulation_steps",
        )
        steps = self.pipeline.num_steps()
        if args.max_steps <= 0:
            args.max_steps = steps
        elif args.max_steps > steps:
            raise ConfigError(
                f"max_steps must be at most the pipeline's {steps} steps (pipeline.num_steps()), got {args.max_steps} "
                f"— pass max_steps={steps} or less (or -1), or plan more data"
            )

    def get_train_dataloader(self) -> Any:
        """The pipeline's own loader, never prepared by Accelerate (no dispatching, no re-sharding)."""
        loader = self.pipeline.dataloader(**self.loader_options, **self.training)
        self._consumed = ConsumedLoader(loader)
        if self._pending is not None:
            self._consumed.load_state_dict(self._pending)
            self._pending = None
        return _Counted(self)

    def data_state(self) -> dict[str, Any]:
        """The merged state after the microbatches the optimizer steps took (a collective under
        torch.distributed)."""
        if self._consumed is None:
            return self.pipeline.state_dict()
        taken = (self.state.global_step - self._start_step) * self.args.gradient_accumulation_steps
        return self._consumed.state_after(taken)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        state = self.data_state()  # every rank: a collective
        if self.args.should_save:
            folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            text = json.dumps(state, sort_keys=True)
            write_atomic(folder / STATE_FILE, lambda tmp: tmp.write_text(text, encoding="utf-8"), "the data state")

    def _last_checkpoint(self) -> str:
        """The latest ``checkpoint-N`` folder in ``output_dir``, for ``resume_from_checkpoint=True``; none is refused
        (the Trainer would otherwise get None and start the data again at step 0)."""
        folder = self.args.output_dir
        last = get_last_checkpoint(folder) if folder and os.path.isdir(folder) else None
        if last is None:
            raise ConfigError(
                f"resume_from_checkpoint=True must find a {PREFIX_CHECKPOINT_DIR}-N folder in output_dir {folder!r}, "
                "got none — pass the checkpoint's path, or train without resume_from_checkpoint"
            )
        return str(last)

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        """``Trainer.train``; a resumed run loads the checkpoint's ``zephon_state.json`` first."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = self._last_checkpoint()
        if resume_from_checkpoint:
            path = Path(os.fspath(resume_from_checkpoint)) / STATE_FILE
            if not path.is_file():
                raise ConfigError(
                    f"checkpoint {path.parent} must hold {STATE_FILE} to resume the data, got none — resume from a "
                    "checkpoint ZephonTrainer wrote, or train without resume_from_checkpoint"
                )
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as error:  # not JSON, or not UTF-8 text: a truncated or foreign file
                raise ConfigError(
                    f"{path} must be the JSON state ZephonTrainer wrote, got text failing with {error} — resume "
                    "from another checkpoint, or train without resume_from_checkpoint"
                ) from None
            state = check_portable(saved, str(path))
            self.pipeline.load_state_dict(state)  # another plan, tokenizer or packing: one line, now
            self._pending = state
        return super().train(resume_from_checkpoint=resume_from_checkpoint or None, **kwargs)
