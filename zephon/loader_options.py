"""``Pipeline.dataloader()``'s DataLoader settings (``LoaderOptions``): speed only, never data, each checked
when the loader is made, in one line, rather than by ``torch`` once its workers have started."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, fields
from typing import Any

from zephon.checks import is_int, require_bool
from zephon.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class LoaderOptions:
    """The ``torch.utils.data.DataLoader`` settings ``Pipeline.dataloader`` passes on (speed only, never data).

    Attributes:
        num_workers: worker processes (0: the batches are built in this process).
        pin_memory: hand out page-locked tensors (a no-op without an accelerator).
        persistent_workers: keep the workers between iterations.
        prefetch_factor: items each worker builds ahead (torch's default when None).
        multiprocessing_context: ``"fork"``, ``"spawn"``, ``"forkserver"`` or a context (torch's default when None).
        timeout: seconds to wait for an item from a worker (0: forever).
    """

    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    multiprocessing_context: Any = None
    timeout: float = 0

    def __post_init__(self) -> None:
        if not is_int(self.num_workers) or self.num_workers < 0:
            raise ConfigError(f"num_workers must be an integer ≥ 0, got {self.num_workers!r} — pass 0, 1, 2, …")
        require_bool(self.pin_memory, "pin_memory")
        require_bool(self.persistent_workers, "persistent_workers")
        if self.persistent_workers and not self.num_workers:
            raise ConfigError("persistent_workers must go with num_workers ≥ 1, got num_workers=0 — drop one of them")
        # Checked here, in one line each, rather than by torch once its workers have started (an assertion and a
        # traceback from its iterator's __del__); a worker's slot ring is sized by prefetch_factor too.
        if self.prefetch_factor is not None:
            if not is_int(self.prefetch_factor) or self.prefetch_factor < 1:
                raise ConfigError(
                    f"prefetch_factor must be an integer ≥ 1 (items each worker builds ahead), got "
                    f"{self.prefetch_factor!r} — pass 1, 2, … or leave it unset (torch's default, 2)"
                )
            if not self.num_workers:
                raise ConfigError("prefetch_factor must go with num_workers ≥ 1, got num_workers=0 — drop one of them")
        methods = multiprocessing.get_all_start_methods()
        if isinstance(self.multiprocessing_context, str) and self.multiprocessing_context not in methods:
            raise ConfigError(
                f"multiprocessing_context must be a start method of this platform ({', '.join(methods)}) or a "
                f"context, got {self.multiprocessing_context!r} — pass one of those"
            )
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, int | float) or self.timeout < 0:
            raise ConfigError(f"timeout must be a number of seconds ≥ 0, got {self.timeout!r} — pass 0 to wait forever")


#: The DataLoader settings ``Pipeline.dataloader`` takes (besides ``to_training``'s options).
LOADER_SETTINGS = tuple(f.name for f in fields(LoaderOptions))
