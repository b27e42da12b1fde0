"""The ``to_training`` options a pipeline's loaders pass on, checked when the loader is made.

``Pipeline.dataloader(**training)`` and ``Pipeline.to_torch_dataset(**training)`` hand ``training`` to
``Batch.to_training`` on every microbatch — in a DataLoader worker, at the first batch. A name it does not take
(``batch_size``, ``shuffle``, ``collate_fn``: a ``torch.utils.data.DataLoader``'s own arguments, which a user
of torch passes by habit) would fail there as ``TypeError: Batch.to_training() got an unexpected keyword
argument``, and an ``ids_dtype`` that is not a torch dtype as torch's "Invalid device string". Both are refused
here, in one line: a DataLoader argument with what takes its place (the plan fixes the order, ``.batch()`` the
microbatch), anything else with the names that are taken.

Example: ``pipeline.dataloader(num_workers=2, batch_size=8)`` → "dataloader() options must be DataLoader
settings it passes on (...) or to_training options (...), got batch_size=8 — the microbatch is
.batch(microbatch_size=...)".
"""

from __future__ import annotations

import inspect
from typing import Any

from zephon.errors import ConfigError
from zephon.executor.batch import Batch, check_ids_dtype, check_switches

__all__ = ["check_training_options"]

#: ``torch.utils.data.DataLoader`` arguments that a pipeline's loader does not take, and what does their job.
_INSTEAD = {
    "batch_size": "the microbatch is .batch(microbatch_size=...)",
    "shuffle": "the plan fixes the order (its seed shuffles it)",
    "sampler": "the plan fixes the order and each rank's share (Pipeline.options(dp_rank=..., dp_size=...))",
    "batch_sampler": "the plan fixes the order and .batch(microbatch_size=...) the microbatch",
    "collate_fn": "to_training builds the dict (its return_* options); a record pipeline takes .batch(collate=fn)",
    "drop_last": "drop the plan's last, incomplete step with .batch(drop_last=True)",
    "worker_init_fn": "each worker sets itself up; randomness comes from the plan's seed",
    "generator": "randomness comes from the plan's seed",
}
#: ``to_training``'s options (``allocate`` is the loader's own, never a user's).
_OPTIONS = tuple(name for name in inspect.signature(Batch.to_training).parameters if name not in ("self", "allocate"))


def check_training_options(
    training: dict[str, Any], *, what: str, settings: tuple[str, ...] = (), records: bool = False
) -> None:
    """Refuse, in one line, an option of ``training`` that ``to_training`` does not take (``what`` names the
    call, ``settings`` the DataLoader settings it takes besides; a record pipeline's ``to_training`` takes none),
    and an ``ids_dtype`` that is not a torch dtype."""
    for key, value in training.items():
        if records:  # a record batch's to_training takes no option at all
            allowed = f"DataLoader settings it passes on ({', '.join(settings)})" if settings else "none"
            fix = _INSTEAD.get(key, "shape the batch in map_transform or .batch(collate=fn)")
            raise ConfigError(f"{what} options must be {allowed} for a record pipeline, got {key}={value!r} — {fix}")
        if key not in _OPTIONS:
            taken = f"DataLoader settings it passes on ({', '.join(settings)}) or " if settings else ""
            fix = _INSTEAD.get(key, "drop it or fix its name")
            raise ConfigError(
                f"{what} options must be {taken}to_training options ({', '.join(_OPTIONS)}), got {key}={value!r} "
                f"— {fix}"
            )
    if "ids_dtype" in training:
        check_ids_dtype(training["ids_dtype"])
    check_switches(training)  # a quoted "false" would turn a switch on, in every batch
