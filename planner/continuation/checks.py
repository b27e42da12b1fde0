"""What a continuation checks before it writes: the new config keeps what the kept rows depend on
(``check_compatible``), a run state belongs to the parent (``check_state_plan``), a continued parent keeps its
branch's global batch (``check_lineage_batch``), and the new readers continue the parent's epoch order
(``check_prefix_orders``). Each refusal is one ``ConfigError`` saying what to change; ``continue_plan``
(``zephon.planner.continuation.child``) calls them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from zephon.errors import ConfigError
from zephon.executor.state import check_state_fields, refuse_packed
from zephon.plan.bundle import CheckedBundle
from zephon.planner.layout import dataset_reader
from zephon.planner.prepare import PreparedPlan
from zephon.planner.segment import SegmentStart

_COLUMNS = ["dataset_id", "shard_id", "row", "epoch", "tokens", "token_offset", "deal"]

__all__ = ["check_compatible", "check_lineage_batch", "check_prefix_orders", "check_state_plan"]


def check_lineage_batch(bundle: CheckedBundle, global_batch: int) -> None:
    """A continuation of a continued plan keeps its lineage's global batch: the lineage counts every segment's
    first step in steps of that many rows."""
    lineage = bundle.manifest.lineage
    if lineage is not None and global_batch != lineage.branch.global_batch:
        raise ConfigError(
            f"--global-batch must be {lineage.branch.global_batch}, the global batch of the continued parent "
            f"{bundle.path}, got {global_batch} — its lineage counts steps of {lineage.branch.global_batch} rows; "
            "continue with that batch, or continue the first plan of the lineage"
        )


def check_state_plan(state: dict[str, Any], bundle: CheckedBundle, at_step: int | None, *, lanes: bool = True) -> None:
    """A run's checkpoint state belongs to the parent, is taken at a step boundary and at ``at_step``; ``lanes``:
    it must carry packing lanes (an estimated text run's; a record run has none)."""
    manifest = bundle.manifest
    refuse_packed(state)  # a framework checkpoint's {"zephon_state": JSON}: named, with its fix
    if not isinstance(state, dict) or "plan" not in state or "step" not in state:
        raise ConfigError(
            f"the continuation state must be a pipeline state (Pipeline.state_dict()), got {type(state).__name__} "
            "without 'plan' and 'step' — pass the JSON a checkpoint saved"
        )
    if state["plan"] != manifest.config_hash:
        raise ConfigError(
            f"the continuation state must come from the parent plan {manifest.config_hash[:12]}, got a state of plan "
            f"{str(state['plan'])[:12]} — pass the state of a run of {bundle.path}"
        )
    check_state_fields(state, documents=manifest.totals.documents)  # each field in range, one line each
    if lanes and state.get("lanes") is None:
        raise ConfigError(
            f"pipeline state 'lanes' must be an integer ≥ 1 for an estimated plan's continuation, got "
            f"{state.get('lanes')!r} — pass the state of a run of {bundle.path}"
        )
    if int(state.get("microbatch", 0)):
        raise ConfigError(
            f"the continuation state must be taken at a step boundary, got step {state['step']} microbatch "
            f"{state['microbatch']} — checkpoint after a whole step"
        )
    if at_step is not None and int(state["step"]) != at_step:
        raise ConfigError(
            f"--at-step must be the state's step {state['step']}, got {at_step} — a state knows where the lanes "
            "stood at its own step only; branch at its step (leave out --at-step) or pass the state of that step"
        )


def check_compatible(prepared: PreparedPlan, bundle: CheckedBundle) -> None:
    """The new config keeps what the prefix's document orders and deals depend on (its datasets:
    ``zephon.planner.continuation.datasets``)."""
    parent = bundle.manifest
    config, old = prepared.config, parent.config
    for key, what in (
        ("seed", "seed"),
        ("shuffle", "shuffle"),
        ("token_counts", "token counting (token_counts)"),
        ("lanes", "lanes"),
        ("tokenizer", "tokenizer"),
        ("token_estimation", "token estimation"),
        ("packing", "packing"),
        ("operators", "operators"),
    ):
        if config.get(key) != old.get(key):
            raise ConfigError(
                f"the new config's {what} must be the parent's {old.get(key)!r}, got {config.get(key)!r} — the "
                "kept steps' document orders depend on it; keep it as in the parent's CONFIG"
            )
    if config["mixture"]["unit"] != old["mixture"]["unit"]:
        raise ConfigError(
            f"the new config's mixture unit must be the parent's {old['mixture']['unit']!r}, got "
            f"{config['mixture']['unit']!r} — keep token_estimation as in the parent"
        )


def check_prefix_orders(prepared: PreparedPlan, columns: dict[str, np.ndarray | None], start: SegmentStart) -> None:
    """The prefix's documents of each parent dataset are the first ones the new config's reader produces, so
    skipping them continues the parent's epoch order (a config that would read them in another order — or a
    parent that was changed — is refused here rather than reading documents twice)."""
    ids = columns["dataset_id"][: start.position]  # type: ignore[index]
    for index, count in enumerate(start.documents):
        if not count:
            continue
        at = np.flatnonzero(ids == index)
        got = dataset_reader(replace(prepared, segment=None), index).take(count)
        same = all(
            np.array_equal(mine, columns[name][at])  # type: ignore[index]
            for mine, name in ((got.shard_id, "shard_id"), (got.row, "row"), (got.epoch, "epoch"))
        )
        if not same:
            raise ConfigError(
                f"dataset {prepared.config['datasets'][index]['name']!r} must read the parent's documents in the "
                "parent's order, got another order — the parent was planned with different settings or changed; "
                "continue from the parent's own CONFIG with the changes you want"
            )
