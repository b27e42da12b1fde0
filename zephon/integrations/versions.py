"""The framework versions each integration was tested with; another version is refused in one line.

An integration leans on a framework's checkpoint and loop contracts (which hooks run, on which ranks, how far a
loop fetches ahead), which change between releases. Tested here: torch 2.13, torchdata 0.11.0, pytorch-lightning
2.6.6, transformers 5.24.0, accelerate 1.15.0, torchtitan 0.3.0. The ranges accept later patch releases and,
where the project keeps its contracts within a major version, later minor ones (torchtitan, before 1.0: 0.3 only).

transformers from 5.18: before it, a Trainer of several processes on CPU (``use_cpu``, gloo) could not resume
from its own checkpoint — it loaded the optimizer with ``map_location`` ``cpu:0``, which torch refuses ("don't
know how to restore data location ... cpu:0"); seen with 5.17.0 on a GPU machine (tests/integrations/test_hf_ddp).
"""

from __future__ import annotations

from importlib import metadata

from zephon.errors import ConfigError

#: distribution → (lowest, first refused) version, as ``major.minor`` tuples.
TESTED: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "torch": ((2, 6), (3, 0)),
    "torchdata": ((0, 11), (0, 12)),
    "pytorch-lightning": ((2, 6), (3, 0)),
    "transformers": ((5, 18), (6, 0)),
    "accelerate": ((1, 10), (2, 0)),
    "torchtitan": ((0, 3), (0, 4)),
}


def _major_minor(version: str) -> tuple[int, int]:
    parts = [*version.split("+")[0].split("."), "0"][:2]
    digits = ["".join(c for c in p if c.isdigit()) or "0" for p in parts]
    return int(digits[0]), int(digits[1])


def require_tested(distribution: str, version: str | None = None) -> str:
    """The installed ``distribution``'s version, refused outside ``TESTED`` (``version`` overrides, for tests)."""
    low, high = TESTED[distribution]
    got = version or metadata.version(distribution)
    if not low <= _major_minor(got) < high:
        wanted = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
        raise ConfigError(
            f"{distribution} must be in the range zephon.integrations was tested with ({wanted}), got {got} — "
            f"pip install '{distribution}{wanted}'"
        )
    return got
