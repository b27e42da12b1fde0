"""The one rule every trainer integration checks: an optimizer step is one global batch.

A framework's gradient accumulation (Lightning's ``accumulate_grad_batches``, Hugging Face's
``gradient_accumulation_steps``) must be the pipeline's microbatches per step ``A`` = global batch ÷ (dp size ×
microbatch size): with another value each optimizer step would be a fraction (or a multiple) of a global batch,
``max_steps=num_steps()`` would stop elsewhere in the plan, and checkpoints would land mid-step, where a state
resumes only at the same dp and microbatch size. Example: global batch 8, dp 2, microbatches of 2 → ``A = 2``.
"""

from __future__ import annotations

from typing import Any

from zephon.errors import ConfigError

__all__ = ["check_accumulation"]


def check_accumulation(pipeline: Any, got: object, *, owner: str, key: str) -> None:
    """Refuse ``got`` (the framework's ``owner(key=...)``) unless it is the pipeline's ``A``, in one line."""
    per_step = pipeline.geometry().accumulation
    if got != per_step:
        raise ConfigError(
            f"{key} must be the pipeline's {per_step} microbatches per step, got {got} — pass {owner}({key}={per_step})"
        )
