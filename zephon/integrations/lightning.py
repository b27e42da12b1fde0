"""PyTorch Lightning: a ``LightningDataModule`` whose state rides in Lightning's checkpoint and resumes mid-epoch.

Lightning calls a data module's ``state_dict()`` while it writes a checkpoint — on every rank (``dump_checkpoint``),
though only global rank 0 writes the file — and ``load_state_dict()`` before it asks for ``train_dataloader()``
on resume. ``ZephonDataModule`` answers with the pipeline's merged, rank-independent state (gathered over the
ranks: every rank calls it together), so the one file rank 0 writes resumes any data-parallel size.

Two Lightning behaviours it must not inherit:

* The fit loop fetches one batch ahead (to know the last one), so a loader's state after the last batch handed
  out is one batch ahead of the model. The module saves the state after the batches the loop *took* (its
  ``batch_progress`` count since the iteration started; ``zephon.integrations.consumed``).
* Lightning checkpoints a ``Stateful`` train loader itself, with that fetched-ahead state, and loads it back
  after the data module's. The iterable handed to Lightning is therefore not ``Stateful``: the state lives in
  one place, the data module.

Example::

    data = ZephonDataModule(pipeline, num_workers=2)
    trainer = L.Trainer(max_steps=data.num_steps(), use_distributed_sampler=False, accumulate_grad_batches=A)
    trainer.fit(model, datamodule=data)                       # checkpoints carry data.state_dict()
    trainer.fit(model, datamodule=ZephonDataModule(pipeline), ckpt_path="last.ckpt")  # continues mid-epoch

``use_distributed_sampler=True`` (Lightning's default) is refused in one line: the plan already gives each rank
its share. A resumed fit whose checkpoint holds no Zephon state is refused rather than restarting the data at
step 0. Batches are ``batch.to_training(**training)`` dicts, microbatch by microbatch; a Lightning step is an
optimizer step, so ``accumulate_grad_batches`` must be the pipeline's microbatches per step ``A`` (global batch ÷
(dp size × microbatch size); another value is refused when fit asks for the loader: each optimizer step would be
a fraction of a global batch, and checkpoints would land mid-step) and ``max_steps=num_steps()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytorch_lightning as pl

from zephon.errors import ConfigError
from zephon.integrations.accumulation import check_accumulation
from zephon.integrations.consumed import ConsumedLoader
from zephon.integrations.state_text import pack, unpack
from zephon.integrations.versions import require_tested


class _Taken:
    """The iterable Lightning gets: the loader's microbatches, counting where Lightning's loop stands when an
    iteration starts. Deliberately not ``Stateful`` (see the module docstring)."""

    def __init__(self, module: ZephonDataModule) -> None:
        self.module = module

    def __iter__(self) -> Iterator[Any]:
        module = self.module
        module._base = module._loop_count()
        assert module._consumed is not None
        return iter(module._consumed)


class ZephonDataModule(pl.LightningDataModule):
    """A pipeline's training batches for ``Trainer.fit``, checkpointed with the trainer (module docstring).

    ``num_workers`` and the other ``Pipeline.dataloader`` arguments (``pin_memory``, ``persistent_workers``,
    ``prefetch_factor``, ``multiprocessing_context``, ``timeout``) change speed only; ``training`` goes to
    ``batch.to_training``."""

    def __init__(self, pipeline: Any, *, num_workers: int = 0, training: dict[str, Any] | None = None, **loader: Any):
        require_tested("pytorch-lightning")
        super().__init__()
        self.pipeline = pipeline
        self.loader_options = {"num_workers": num_workers, **loader}
        self.training = dict(training or {})
        self._consumed: ConsumedLoader | None = None
        self._pending: dict[str, Any] | None = None
        self._restored = False  # the checkpoint's state went to a loader already
        self._base = 0

    def num_steps(self) -> int:
        """Global steps of the run (``Pipeline.num_steps``): Lightning's ``max_steps``."""
        return self.pipeline.num_steps()

    def _loop_count(self) -> int:
        """Batches Lightning's fit loop has taken into a training step in this epoch (not those fetched ahead)."""
        trainer = self.trainer
        return 0 if trainer is None else trainer.fit_loop.epoch_loop.batch_progress.current.ready

    def _check_trainer(self, trainer: pl.Trainer) -> None:
        """Refuse, in one line, a Trainer that would split the plan's batches or restart its data."""
        if trainer._accelerator_connector.use_distributed_sampler:
            raise ConfigError(
                "ZephonDataModule needs Trainer(use_distributed_sampler=False), got True — the plan already gives "
                "each rank its share; pass use_distributed_sampler=False"
            )
        check_accumulation(
            self.pipeline, trainer.accumulate_grad_batches, owner="Trainer", key="accumulate_grad_batches"
        )
        if trainer.ckpt_path is not None and self._pending is None and not self._restored:
            raise ConfigError(
                f"the checkpoint {trainer.ckpt_path} must hold the ZephonDataModule's state to resume, got none — "
                "resume from a checkpoint written while training with ZephonDataModule (or start without ckpt_path)"
            )

    def train_dataloader(self) -> _Taken:
        if self.trainer is not None:
            self._check_trainer(self.trainer)
        loader = self.pipeline.dataloader(**self.loader_options, **self.training)
        self._consumed = ConsumedLoader(loader)
        if self._pending is not None:
            self._consumed.load_state_dict(self._pending)
            self._pending = None
            self._restored = True  # a loader made again (reload_dataloaders_every_n_epochs) starts the next epoch
        return _Taken(self)

    def state_dict(self) -> dict[str, Any]:
        """``{"zephon_state": JSON}``: the merged state after the batches Lightning's loop took (a collective
        under torch.distributed: Lightning calls it on every rank)."""
        if self._consumed is None:
            return pack(self.pipeline.state_dict())
        return pack(self._consumed.state_after(self._loop_count() - self._base))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning calls this on resume, before ``train_dataloader()``: the next loader starts there."""
        state = unpack(state_dict, "the Lightning checkpoint's ZephonDataModule state")
        self.pipeline.load_state_dict(state)  # refuses another plan, tokenizer or packing now, in one line
        self._pending = state
