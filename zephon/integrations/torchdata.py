"""torchdata's ``StatefulDataLoader`` protocol over ``Pipeline.dataloader()``: the loader's own state is what to
checkpoint.

Decision. A ``StatefulDataLoader``'s state is one rank's: a snapshot of each worker's dataset state, the items
yielded since, and which worker yields next. It cannot resume at another worker count or data-parallel size,
its fast-forward replays the items after the last snapshot (tokenizing them again), and it hands out the items
its workers yield — it has no step that joins a microbatch's pieces, which is what lets ``Pipeline.dataloader``
workers own disjoint lanes (``zephon.torch_loader``). Deriving each worker's state from the global cursor would
still leave that envelope per rank and per worker count. ``Pipeline.dataloader()`` already *is* a stateful
loader whose state is derived from the global cursor: ``state_dict()`` merges the cursors each worker reports
with its pieces into the rank's state after the last microbatch handed out (gathered over the ranks under
``torch.distributed``), and ``load_state_dict`` starts new workers there — exactly, at any ``num_workers`` and
any data-parallel size dividing the global batch. So this module adapts it to the protocol code written for a
``StatefulDataLoader`` expects (``torchdata.stateful_dataloader.Stateful``: ``state_dict``/``load_state_dict``;
iteration; a new epoch after the end) rather than putting Zephon inside one.

``stateful_loader(pipeline, **kwargs)`` takes a ``StatefulDataLoader``'s keyword arguments: those that change
speed only pass on; those that would change the data or its order (``batch_size``, ``shuffle``, ``sampler``,
``batch_sampler``, ``collate_fn``, ``drop_last``, ``in_order=False``) are refused in one line, as is a
``worker_init_fn`` (Zephon's workers would never call it), and ``snapshot_every_n_steps`` is accepted and unused
(every microbatch's state is exact). Its ``load_state_dict`` refuses a ``StatefulDataLoader``'s own state in one
line.

Example: ``loader = stateful_loader(pipeline, num_workers=2)``; after 5 microbatches ``state =
loader.state_dict()`` (JSON-serializable); later ``loader = stateful_loader(pipeline, num_workers=1);
loader.load_state_dict(state)`` yields microbatch 6 onwards.
"""

from __future__ import annotations

from typing import Any

from zephon.errors import ConfigError
from zephon.integrations.state_text import check_portable, refuse_statefuldataloader_state
from zephon.integrations.versions import require_tested
from zephon.torch_loader import PipelineLoader

#: StatefulDataLoader arguments that pass on to ``Pipeline.dataloader`` (speed only).
PASSED = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "multiprocessing_context", "timeout")
#: Arguments that would change the data or its order, and the value that does not.
FIXED: dict[str, Any] = {
    "batch_size": None,
    "shuffle": None,
    "sampler": None,
    "batch_sampler": None,
    "collate_fn": None,
    "drop_last": False,
    "in_order": True,
}
#: Functions a StatefulDataLoader calls that Zephon's loader never would, and what does their job: None only.
UNCALLED = {"worker_init_fn": "each worker sets itself up and randomness comes from the plan's seed; drop it"}
IGNORED = ("snapshot_every_n_steps", "generator", "pin_memory_device")
#: Every StatefulDataLoader argument stateful_loader takes.
ACCEPTED = tuple(sorted((*PASSED, *FIXED, *UNCALLED, *IGNORED)))


class StatefulPipelineLoader(PipelineLoader):
    """``Pipeline.dataloader()`` that also refuses a ``StatefulDataLoader``'s state in one line."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        refuse_statefuldataloader_state(state, "load_state_dict's state")
        super().load_state_dict(check_portable(state, "load_state_dict's state"))


def stateful_loader(pipeline: Any, *, training: dict[str, Any] | None = None, **kwargs: Any) -> StatefulPipelineLoader:
    """``pipeline``'s loader behind the ``StatefulDataLoader`` protocol (see the module docstring); ``training``
    goes to ``batch.to_training``."""
    require_tested("torchdata")
    for name, value in kwargs.items():
        if name in FIXED and value != FIXED[name]:
            raise ConfigError(
                f"stateful_loader's {name} must be {FIXED[name]!r}, got {value!r} — the plan fixes the batches and "
                f"their order; set microbatch_size and global_batch_size with pipeline.batch(...)"
            )
        if name in UNCALLED and value is not None:
            raise ConfigError(f"stateful_loader's {name} must be None, got {value!r} — {UNCALLED[name]}")
        if name not in ACCEPTED:
            raise ConfigError(
                f"stateful_loader takes StatefulDataLoader's arguments {list(ACCEPTED)}, got "
                f"{name!r} — pass batch.to_training options as training={{...}}"
            )
    from zephon.loader_options import LoaderOptions

    options = LoaderOptions(**{k: v for k, v in kwargs.items() if k in PASSED})
    return StatefulPipelineLoader(pipeline, options, dict(training or {}))
