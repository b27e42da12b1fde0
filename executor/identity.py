"""Who this process is among the data-parallel ranks.

Order of precedence: ``Pipeline.options(dp_rank=..., dp_size=...)`` (for tensor/pipeline-parallel setups,
where the data-parallel group is smaller than the world: ranks that share a dp_rank get identical batches);
else ``torch.distributed`` when it is initialized (rank and world size of the default group); else the
``RANK`` and ``WORLD_SIZE`` environment variables that torchrun and most launchers set; else rank 0 of 1.
"""

from __future__ import annotations

import os

from zephon.errors import ConfigError


def resolve_dp(dp_rank: int | None, dp_size: int | None) -> tuple[int, int]:
    """``(dp_rank, dp_size)`` by the precedence above."""
    if (dp_rank is None) != (dp_size is None):
        raise ConfigError(
            f"dp_rank and dp_size must be given together, got dp_rank={dp_rank}, dp_size={dp_size} — pass both"
        )
    if dp_rank is not None and dp_size is not None:
        rank, size = dp_rank, dp_size
    else:
        rank, size = 0, 1
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank, size = dist.get_rank(), dist.get_world_size()
            elif "WORLD_SIZE" in os.environ:
                rank, size = int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
        except ValueError as exc:
            raise ConfigError(f"RANK and WORLD_SIZE must be integers, got {exc} — fix the launcher's env") from exc
    if not (isinstance(size, int) and size >= 1 and isinstance(rank, int) and 0 <= rank < size):
        raise ConfigError(f"dp_rank must be in [0, dp_size) with dp_size ≥ 1, got rank {rank} of {size}")
    return rank, size
