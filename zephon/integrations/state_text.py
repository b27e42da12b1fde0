"""A pipeline state as one value a framework's checkpoint can carry, and the checks a foreign state fails.

Frameworks store a loader's state in different ways — DCP flattens nested dicts into one key per leaf (and
needs the same keys at load time, at any data-parallel size), Accelerate pickles, Lightning and the Hugging Face
Trainer write it beside their own files — so the merged state travels as one JSON string (sorted keys: the same
text on every rank). Example: ``{"zephon_state": "{\"algorithm\": \"wrap\", …, \"step\": 3, …}"}``.
"""

from __future__ import annotations

import json
from typing import Any

from zephon.errors import ConfigError
from zephon.executor.state import PACKED_KEY

#: The one key under which a framework's checkpoint holds the pipeline state.
KEY = PACKED_KEY

_FIX = "save it with a zephon.integrations loader (its state_dict()), or pass pipeline.state_dict()"


def pack(state: dict[str, Any]) -> dict[str, str]:
    """``{KEY: the state as JSON}`` (sorted keys, so every rank holds the same text)."""
    return {KEY: json.dumps(state, sort_keys=True)}


def unpack(packed: object, where: str) -> dict[str, Any]:
    """The state ``pack`` made, checked: a StatefulDataLoader's own state or another shape is one line."""
    refuse_statefuldataloader_state(packed, where)
    if not (isinstance(packed, dict) and isinstance(packed.get(KEY), str)):
        keys = sorted(map(str, packed)) if isinstance(packed, dict) else type(packed).__name__
        raise ConfigError(f"{where} must be {{{KEY!r}: JSON text}}, got {keys} — {_FIX}")
    try:
        state = json.loads(packed[KEY])
    except json.JSONDecodeError as error:
        raise ConfigError(f"{where}[{KEY!r}] must be JSON, got text failing at {error.pos} — {_FIX}") from None
    return check_portable(state, where)


def refuse_statefuldataloader_state(state: object, where: str) -> None:
    """A torchdata ``StatefulDataLoader``'s own state (``_snapshot``, ``_steps_since_snapshot``, …) is one line."""
    if isinstance(state, dict) and any(str(k).startswith(("_snapshot", "_steps_since", "_num_yielded")) for k in state):
        raise ConfigError(
            f"{where} must hold a Zephon pipeline state, got a torchdata StatefulDataLoader state (per-worker "
            "snapshots of one rank, which cannot resume another worker count or data-parallel size) — checkpoint "
            "the state_dict() of pipeline.dataloader() or zephon.integrations.torchdata.stateful_loader instead"
        )


def check_portable(state: object, where: str) -> dict[str, Any]:
    """A state that can resume at another data-parallel size: its ``dp_size`` divides its global batch (a state
    from elsewhere, or hand-edited, fails here in one line; ``Pipeline.load_state_dict`` checks the rest)."""
    if not isinstance(state, dict):
        raise ConfigError(f"{where} must be a pipeline state (a dict), got {type(state).__name__} — {_FIX}")
    size, batch = state.get("dp_size"), state.get("global_batch")
    if isinstance(size, int) and isinstance(batch, int) and size > 0 and batch % size:
        raise ConfigError(
            f"{where}: a state's dp_size must divide its global batch of {batch} sequences, got dp_size {size} — "
            "the state was not saved by a Zephon run; resume from a checkpoint this run wrote"
        )
    return state
