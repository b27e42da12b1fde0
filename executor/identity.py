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
    fix = "give each rank a dp_rank below dp_size ≥ 1"
    if dp_rank is not None and dp_size is not None:
        rank, size = dp_rank, dp_size
    else:
        rank, size = 0, 1
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, size = dist.get_rank(), dist.get_world_size()
        elif "WORLD_SIZE" in os.environ or os.environ.get("RANK", "0").strip() not in ("", "0"):
            rank, size = _from_env()
            fix = "fix the launcher's RANK and WORLD_SIZE"
    if not (isinstance(size, int) and size >= 1 and isinstance(rank, int) and 0 <= rank < size):
        raise ConfigError(f"dp_rank must be in [0, dp_size) with dp_size ≥ 1, got rank {rank} of {size} — {fix}")
    return rank, size


def _from_env() -> tuple[int, int]:
    """``(RANK, WORLD_SIZE)`` as torchrun sets them. One without the other is refused: every process would take
    itself for rank 0 (or for a world of one), each reading what another reads — the data duplicated silently."""
    got = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
    missing = [k for k, v in got.items() if v is None]
    if missing and got["WORLD_SIZE"] != "1":
        have = ", ".join(f"{k}={v}" for k, v in got.items() if v is not None)
        raise ConfigError(
            f"RANK and WORLD_SIZE must be set together, got {have} without {missing[0]} — launch with torchrun (it "
            "sets both), set the other, or pass Pipeline.options(dp_rank=..., dp_size=...)"
        )
    try:
        return int(got["RANK"] or "0"), int(got["WORLD_SIZE"] or "1")
    except ValueError as exc:
        raise ConfigError(f"RANK and WORLD_SIZE must be integers, got {exc} — fix the launcher's env") from exc
