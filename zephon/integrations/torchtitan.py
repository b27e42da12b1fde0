"""torchtitan: a ``BaseDataLoader`` whose one rank-independent state loads at another data-parallel size.

torchtitan 0.3 builds its data loader from the trainer config: ``Trainer.Config.dataloader`` is a
``BaseDataLoader.Config`` and the trainer calls ``config.dataloader.build(dp_world_size=, dp_rank=, tokenizer=,
seq_len=, local_batch_size=, snapshot_every_n_steps=)``, iterates it once for the whole run (``local_batch_size``
rows per microbatch, ``training.global_batch_size / (local_batch_size × dp)`` microbatches per step, no look-ahead)
and hands the loader to its ``CheckpointManager`` as the ``"dataloader"`` state, which DCP saves on every rank
after a step and loads before the first batch of a resumed run. Its own loaders save ``{"dp_rank_R": pickle,
"world_size": W}``: DCP keeps non-tensor values from rank 0 only, so rank ``R > 0`` finds nothing ("DataLoader
state is empty for dp rank 16", torchtitan #409) and another dp size is refused by an assertion.

``ZephonDataLoader`` follows the same contract with the merged pipeline state under one key
(``{"zephon_state": JSON}``, ``zephon.integrations.state_text``): ``state_dict()`` gathers every rank's lane
cursors (a collective, which DCP's save is), so rank 0's value resumes every rank at any dp size that divides the
global batch. Batches are torchtitan's ``({"input": ids, "positions": per-document positions}, labels)``, from
``batch.to_training`` over a plan bundle, tokenized with the tokenizer torchtitan passes (its ``tokenizer_path``).

Worked example (global batch 8, seq_len 32): at dp 2 with ``local_batch_size`` 2, each rank takes 2 microbatches
of 2 rows per step; after step 3 DCP saves one state (``"step": 3``). At dp 4 (``local_batch_size`` 2, one
microbatch per step) every rank loads it and yields its 2 rows of step 3 — the global batches of steps 3, 4, …
are those of an uninterrupted run, at any dp size dividing 8.

Plugging it in (a config function of a ``config_registry`` module, torchtitan's way of registering a
training setup; ``--module M --config F`` on torchtitan's command line)::

    def llama3_zephon() -> Trainer.Config:
        config = llama3_debugmodel()
        config.dataloader = ZephonDataLoader.Config(plan="plans/run", global_batch_size=64)
        return config

``Config`` is not frozen: torchtitan's ``Configurable.Config`` bases are mutable (its command line edits them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.dataloader import BaseDataLoader

from zephon.checks import is_int, require_positive
from zephon.errors import ConfigError
from zephon.integrations.state_text import pack, unpack
from zephon.integrations.versions import require_tested


class ZephonDataLoader(BaseDataLoader):
    """A plan's batches for torchtitan's trainer, checkpointed by its ``CheckpointManager`` (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        plan: str = ""
        """The plan bundle (``zephon plan … -o DIR`` or ``work_source.plan(DIR)``)."""

        global_batch_size: int = -1
        """Sequences per optimizer step, the same at every dp size (torchtitan's ``training.global_batch_size``);
        -1: ``local_batch_size × dp_world_size``, which then changes with the dp size."""

        num_workers: int = 0
        """DataLoader worker processes; each packs its own lanes (speed only, never the data)."""

        pin_memory: bool = False
        """Hand out page-locked tensors."""

        persistent_workers: bool = False
        """Keep the workers between iterations (with ``num_workers`` ≥ 1)."""

        positions: bool = True
        """Yield ``"positions"`` (each document's token positions from 0), as torchtitan's text loaders do."""

        mask_document_boundaries: bool = False
        """Labels of -100 where the next token starts another document (torchtitan's text loaders never predict
        across documents)."""

        special_tokens: str | None = None
        """``"bos_eos"`` (torchtitan's text loaders), ``"bos"``, ``"eos"``, ``"none"``; None: Zephon's default."""

        def __post_init__(self) -> None:
            if not is_int(self.global_batch_size) or not (self.global_batch_size == -1 or self.global_batch_size >= 1):
                raise ConfigError(
                    "ZephonDataLoader.Config.global_batch_size must be -1 or an integer ≥ 1, got "
                    f"{self.global_batch_size!r} — pass torchtitan's training.global_batch_size"
                )

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        require_tested("torchtitan")
        del snapshot_every_n_steps, kwargs  # every microbatch's state is exact; nothing to snapshot
        self.config = config
        self.dp_world_size, self.dp_rank = dp_world_size, dp_rank
        self.pipeline = build_pipeline(
            config, dp_world_size=dp_world_size, dp_rank=dp_rank, tokenizer=tokenizer, seq_len=seq_len,
            local_batch_size=local_batch_size,
        )  # fmt: skip
        self.loader = self.pipeline.dataloader(
            config.num_workers,
            pin_memory=config.pin_memory,
            persistent_workers=config.persistent_workers,
            return_labels=True,
            return_position_ids=config.positions,
            ignore_document_boundaries=config.mask_document_boundaries,
        )

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        positions = self.config.positions
        for tensors in self.loader:
            inputs = {"input": tensors["input_ids"]}
            if positions:
                inputs["positions"] = tensors["position_ids"]
            yield inputs, tensors["labels"]  # type: ignore[misc]

    def num_steps(self) -> int:
        """Global steps of the run (``Pipeline.num_steps``): torchtitan's ``training.steps`` at most."""
        return self.loader.num_steps()

    def state_dict(self) -> dict[str, str]:
        """``{"zephon_state": JSON}``: the merged state after the last microbatch handed out — torchtitan's loop
        takes none ahead — gathered over the ranks (a collective: DCP's save calls it on every rank)."""
        return pack(self.loader.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The next iteration resumes where the saved state was taken, at this dp size; refused in one line
        when the state is another plan's, tokenizer's or packing's, a torchtitan loader's own, or empty."""
        if isinstance(state_dict, dict) and any(str(k).startswith("dp_rank_") for k in state_dict):
            raise ConfigError(
                "the torchtitan checkpoint's dataloader state must be a ZephonDataLoader's {'zephon_state': …}, got "
                f"a torchtitan loader's per-rank state {sorted(map(str, state_dict))} — resume from a checkpoint "
                "written while training with ZephonDataLoader, or start without loading one"
            )
        state = unpack(state_dict, "the torchtitan checkpoint's dataloader state")
        saved, here = state.get("global_batch"), self.pipeline.geometry().global_batch
        if self.config.global_batch_size == -1 and is_int(saved) and saved != here:  # G followed dp × local batch
            raise ConfigError(
                f"the torchtitan checkpoint's dataloader state must be at this run's global batch of {here} "
                f"sequences (local_batch_size × dp, global_batch_size left at -1), got one of {saved} — pass "
                f"ZephonDataLoader.Config(global_batch_size={saved}) (torchtitan's training.global_batch_size), "
                "which keeps a step's sequences at any dp size"
            )
        self.loader.load_state_dict(state)


def build_pipeline(
    config: ZephonDataLoader.Config,
    *,
    dp_world_size: int,
    dp_rank: int,
    tokenizer: Any,
    seq_len: int,
    local_batch_size: int,
) -> Any:
    """The rank's ``Pipeline`` for torchtitan's build arguments: rows of ``seq_len + 1`` tokens, microbatches of
    ``local_batch_size`` rows, ``config.global_batch_size`` rows per step (each refused in one line)."""
    from zephon.pipeline import Pipeline

    if not config.plan:
        raise ConfigError(
            "ZephonDataLoader.Config.plan must name a plan bundle directory, got '' — pass plan='plans/run' "
            "(written by zephon plan or work_source.plan)"
        )
    path = getattr(tokenizer, "tokenizer_path", None)
    if not isinstance(path, str):
        raise ConfigError(
            "ZephonDataLoader's tokenizer must be torchtitan's HuggingFaceTokenizer (its tokenizer_path is what "
            f"Zephon encodes with), got {type(tokenizer).__name__} — use tokenizer=HuggingFaceTokenizer.Config()"
        )
    require_positive(
        local_batch_size, "ZephonDataLoader's local_batch_size", unit="rows per microbatch",
        fix="set torchtitan's training.local_batch_size to 1 or more",
    )  # fmt: skip
    size = config.global_batch_size if config.global_batch_size != -1 else local_batch_size * dp_world_size
    if dp_world_size < 1 or size % dp_world_size or size % (local_batch_size * dp_world_size):
        raise ConfigError(
            f"ZephonDataLoader's global batch of {size} sequences must split into microbatches of "
            f"local_batch_size {local_batch_size} on each of dp_world_size {dp_world_size} ranks, got "
            f"{size} / ({local_batch_size} × {dp_world_size}) not whole — use a dp size and local_batch_size "
            f"whose product divides {size} (or change global_batch_size)"
        )
    return (
        Pipeline.from_plan(config.plan)
        .options(dp_rank=dp_rank, dp_size=dp_world_size)
        .tokenize(tokenizer_id=path, special_tokens=config.special_tokens)
        .pack_flat(max_length=seq_len + 1)
        .batch(microbatch_size=local_batch_size, global_batch_size=size)
    )
