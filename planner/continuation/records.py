"""Where a continuation of a record plan branches, and what it must keep: plans of samples with costs (``cost=``,
``mixture_unit="cost"``, ``Pipeline.pack_samples``; docs/records.md).

A record run reads a samples plan position by position (global step ``s`` = positions ``[s·G, (s+1)·G)``), or,
packed, row by row (step ``s`` = rows ``[s·G, (s+1)·G)`` of bins.parquet). So the branch at step ``N`` is

* unpacked: position ``P = N·G`` — the child keeps the parent's first ``P`` samples;
* packed: row ``R = N·G``. The kept rows ``[0, R)`` hold a set ``S`` of positions that need not be a prefix (best
  fit keeps up to 64 rows open, so a row opened late may hold an earlier sample). The child keeps the parent's
  samples ``[0, P)`` with ``P = max(S) + 1`` (0 when ``R = 0``); the samples of that prefix outside ``S`` — the
  *leftovers*, in the parent's rows ``≥ R`` — are packed again by the child. Its packing replays the parent's
  over the prefix (same costs, same row closes: plan.json ``sample_packing.closes``), so the rows ``[0, R)`` come
  out as the parent's, then closes every row below ``R`` at ``P`` (the seam) and goes on with the new segment:
  the leftovers' rows stay open and are filled by the new samples, numbered on from the parent's (rows ``≥ R``).

Invariant: the child's steps ``< N`` (positions, or rows and their members) are the parent's, byte for byte, so
a checkpoint of the parent at a step ``≤ N`` resumes on the child; every sample of the prefix is in exactly one
row of the child.

Worked example (packed, ``max_cost`` 10, ``G = 1``, costs 6 5 4 3 at positions 0–3, no phases): the parent's rows
are [0:6 2:4] [1:5 3:3]. At ``N = 1``: ``R = 1``, ``S = {0, 2}``, ``P = 3``; position 1 is a leftover. The child
keeps positions 0–2, replays them (row 0 = [0 2], row 1 = [1], open with 5 free), closes row 0 at position 3 and
packs its own samples from position 3 on into row 1 and later rows.

What a continuation of a cost plan may not change (each one ``ConfigError`` line, ``check_costs_kept``): costs on
one side only, a dataset's ``cost=`` expression (the prefix's costs count toward the shares and the budget), and
the packing (``max_cost``, ``oversize``, packed or not: the replay and the meaning of a step depend on them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon.errors import ConfigError
from zephon.executor.step_arithmetic import steps_in
from zephon.plan.bundle import CheckedBundle
from zephon.planner.continuation.checks import check_lineage_batch, check_state_plan
from zephon.planner.prepare import PreparedPlan

#: The ``algorithm`` of a record run's checkpoint state (``zephon.executor.records.runner.RECORDS``).
RECORDS = "records"

__all__ = [
    "RECORDS",
    "RecordBranch",
    "check_cost_sides",
    "check_costs_kept",
    "is_record_plan",
    "kept_closes",
    "record_branch",
]


def is_record_plan(bundle: CheckedBundle, state: dict[str, Any] | None) -> bool:
    """Whether ``bundle`` is continued as a record plan: it has costs or packed samples, or the run's state is a
    record run's."""
    manifest = bundle.manifest
    if manifest.totals.tokens_are == "cost" or manifest.sample_packing is not None:
        return True
    return isinstance(state, dict) and state.get("algorithm") == RECORDS


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordBranch:
    """The branch of a record plan (see the module docstring)."""

    #: The first global step of the new configuration (``N``).
    step: int
    #: The first plan position the child lays out anew (``P``).
    position: int
    #: Rows (samples, or planned rows when packed) per global step (``G``).
    global_batch: int
    #: Packed plans: the first row the child packs anew (``R = N·G``); None unpacked.
    row: int | None


def record_branch(
    bundle: CheckedBundle,
    *,
    at_step: int | None,
    global_batch: int | None,
    state: dict[str, Any] | None,
) -> RecordBranch:
    """The branch of a record plan at ``at_step`` of ``global_batch`` rows, or at a record run's ``state`` (see the
    module docstring); bad input is one ``ConfigError`` line."""
    manifest = bundle.manifest
    if state is not None:
        if state.get("algorithm") != RECORDS:
            raise ConfigError(
                f"the continuation state of a record plan must come from a record run (algorithm 'records'), got "
                f"{state.get('algorithm')!r} — pass Pipeline(...).state_dict() of a run without .tokenize()"
            )
        check_state_plan(state, bundle, at_step, lanes=False)
        if global_batch is not None and global_batch != int(state["global_batch"]):
            raise ConfigError(
                f"--global-batch must be the state's global batch {state['global_batch']}, got {global_batch} — "
                "leave it out (the state carries it) or pass the state of a run with that batch"
            )
        global_batch, at_step = int(state["global_batch"]), int(state["step"])
    if at_step is None or global_batch is None:
        raise ConfigError(
            "a record plan's continuation needs the branch step and the run's global batch, got "
            f"at_step={at_step}, global_batch={global_batch} — pass both (--at-step N --global-batch G), or the "
            "run's checkpoint state (--continue-from-state STATE.json)"
        )
    check_lineage_batch(bundle, global_batch)
    packing = manifest.sample_packing
    units = packing.rows if packing is not None else manifest.totals.documents
    steps = steps_in(units, global_batch, drop_last=True)
    if not 0 <= at_step <= steps:
        what = "rows" if packing is not None else "samples"
        raise ConfigError(
            f"--at-step must be within the parent's {steps} full steps of {global_batch} {what}, got {at_step} "
            f"(parent plan {bundle.path}) — branch at a step ≤ {steps}"
        )
    first = at_step * global_batch
    if packing is None:
        return RecordBranch(step=at_step, position=first, global_batch=global_batch, row=None)
    return RecordBranch(step=at_step, position=_after_rows(bundle, first), global_batch=global_batch, row=first)


def _after_rows(bundle: CheckedBundle, rows: int) -> int:
    """One past the last plan position that rows ``[0, rows)`` of the parent's bins.parquet hold (0 for none).
    bins.parquet is sorted by ``sequence``: only the row groups whose smallest ``sequence`` is below ``rows`` (by
    their footer statistics) are read."""
    if rows == 0:
        return 0
    bins = bundle.bins
    assert bins is not None, "a packed plan has bins.parquet (checked when the bundle was opened)"
    reader, metadata = bins.open(), bins.metadata
    column = metadata.schema.to_arrow_schema().get_field_index("sequence")
    last = -1
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        if stats is not None and stats.has_min_max and stats.min >= rows:
            break
        table = bins.read_row_group(reader, group, ["sequence", "position"])
        kept = table.column(1).to_numpy()[table.column(0).to_numpy() < rows]
        if len(kept):
            last = max(last, int(kept.max()))
    return last + 1


def kept_closes(bundle: CheckedBundle, branch: RecordBranch) -> tuple[tuple[int, int | None], ...]:
    """The child's row closes up to its seam: the parent's before ``P`` (its packing replayed), then the seam's
    (every row below ``R`` closed at ``P``). None for an unpacked plan."""
    packing = bundle.manifest.sample_packing
    if packing is None or branch.row is None:
        return ()
    replayed = [(c.position, c.rows_below) for c in packing.closes if c.position < branch.position]
    return (*replayed, (branch.position, branch.row))


def check_cost_sides(bundle: CheckedBundle, priced: bool) -> None:
    """Costs on both sides of a continuation or on neither (``priced``: the new config has ``cost=`` or
    ``pack_samples``); checked before the branch is looked for, whose rules depend on it."""
    had = bundle.manifest.totals.tokens_are == "cost"
    if had != priced:
        got, want = ("costs", "a plan without costs") if priced else ("no costs", "a plan with costs")
        raise ConfigError(
            f"a continuation of {want} must keep it so, got {got} in the new config (parent plan {bundle.path}) — "
            f"{'drop cost= and pack_samples' if priced else 'give every dataset its cost= as in the parent'}"
            ", or plan the new configuration from its start"
        )


def check_costs_kept(prepared: PreparedPlan, bundle: CheckedBundle) -> None:
    """A continuation keeps costs on both sides or neither, each kept dataset's ``cost=``, and the packing."""
    parent = bundle.manifest
    check_cost_sides(bundle, prepared.costs)
    old = {d["name"]: d.get("cost") for d in parent.config["datasets"]}
    for entry in prepared.config["datasets"]:
        name = entry["name"]
        if name in old and entry.get("cost") != old[name]:
            raise ConfigError(
                f"dataset {name!r}: the new config's cost= must be the parent's {old[name]!r}, got "
                f"{entry.get('cost')!r} — the kept samples' costs count toward the cost shares and budget; keep the "
                "expression, or add the data again as a dataset of another name"
            )
    before = parent.config.get("sample_packing")
    after = prepared.config.get("sample_packing")
    if before != after:
        raise ConfigError(
            f"the new config's pack_samples must be the parent's {_packing(before)}, got {_packing(after)} — the "
            "kept steps' rows and the parent's leftover samples are packed by it; keep pack_samples as in the "
            "parent, or plan the new configuration from its start"
        )


def _packing(spec: dict[str, Any] | None) -> str:
    if spec is None:
        return "none"
    return ", ".join(f"{k}={v!r}" for k, v in spec.items())
