"""Continuing a run on a changed plan: a child plan whose first N global steps are its parent's.

``continue_plan(parent, source, out, at_step=N, ...)`` writes a plan bundle made of

1. the parent's first ``P`` documents, row for row (dataset, shard, row, epoch, tokens, token offset, deal), and
2. a new *segment* laid out from ``source`` (the new configuration) from position ``P`` on, whose readers skip
   every document the prefix read (``zephon.planner.segment``): epochs continue, nothing is read twice unless
   the new budget asks for another pass; positions, token offsets and deals continue from the prefix.

``P``, the *branch position*, is the first document no row of steps ``< N`` touches:

* exact ``wrap`` plans: step ``s`` holds stream tokens ``[s·G·W, (s+1)·G·W)`` (``G`` global batch rows, ``W``
  max_length), so ``P`` = the first document whose ``token_offset ≥ N·G·W``
  (``zephon.executor.step_arithmetic.first_position``);
* estimated plans pack at run time, so only the run knows where each lane stood: the continuation takes the
  run's checkpoint state at step ``N`` (all lanes' cursors, ``zephon.merge_states`` or a state saved under
  ``torch.distributed``); lane ``k`` has consumed the documents before its cursor ``(p_k, skip_k)``, so
  ``P = max_k (p_k + [skip_k > 0])``. Documents of the prefix after a lane's cursor are still read after the
  branch — by that lane, as in the parent — so the new mixture starts at most one lane's lead late.
* ``best_fit`` / ``homogeneous`` plans place every document over the whole plan: refused.
* record plans (samples with costs, packed by ``pack_samples`` or not): a step is ``G`` positions or ``G`` planned
  rows, so ``P`` follows from the step alone (``zephon.planner.continuation.records``, which also replays a packed
  parent's rows up to the branch).

Invariant: a run of the child with the parent's global batch (and lanes) yields the parent's batches for every
step ``< N`` — byte for byte — and any checkpoint state of the parent at step ``≤ N`` (microbatch 0 at ``N``)
resumes on the child (``Manifest.lineage``; ``zephon.executor.state``).

Worked example (exact wrap, ``G = 2``, ``W = 4``, documents of 3, 5, 2, 6 tokens, offsets 0, 3, 8, 10),
``N = 1``: step 0 holds tokens 0..7; the first document at or past token 8 is the third, so ``P = 2``; the
child keeps documents 0 and 1 and lays out the new segment from token offset 8.

The new config must keep the parent's seed, shuffle, tokenizer, token counting and packing: the prefix's
document orders and deals depend on them. Its datasets are matched to the parent's by name and content, in any
order; a parent dataset it leaves out stays at its index with weight 0 from the branch on, and new datasets
follow (``zephon.planner.continuation.datasets``). Its budget counts the whole run; phase starts are positions
/ tokens / steps of the whole run. One global batch per lineage (``checks.check_lineage_batch``); an estimated
branch after a lane ran out is refused (``DryLanes``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from zephon.errors import ConfigError
from zephon.executor.step_arithmetic import first_position, steps_in
from zephon.plan.bundle import CheckedBundle, open_bundle
from zephon.plan.format import PLAN_JSON, deal_column
from zephon.plan.integrity import config_digest
from zephon.plan.manifest import LineageBranch, LineageParent, LineageSegment, PlanLineage, read_manifest, warn_plan
from zephon.planner.build import PlanOptions, write_bundle
from zephon.planner.continuation.bundle import Continued, Prefix
from zephon.planner.continuation.checks import (
    check_compatible,
    check_lineage_batch,
    check_prefix_orders,
    check_state_plan,
)
from zephon.planner.continuation.datasets import align, finish
from zephon.planner.continuation.records import (
    check_cost_sides,
    check_costs_kept,
    is_record_plan,
    kept_closes,
    record_branch,
)
from zephon.planner.lane_dealing import row_bytes
from zephon.planner.layout import Chunk
from zephon.planner.phases import Stage
from zephon.planner.prepare import PreparedPlan
from zephon.planner.segment import SegmentStart
from zephon.recipe.work_source import WorkSource

_COLUMNS = ["dataset_id", "shard_id", "row", "epoch", "tokens", "token_offset", "deal"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Branch:
    """Where the child leaves its parent: the first new global step and document position."""

    step: int
    position: int
    global_batch: int
    #: Estimated plans: the run's packing lanes and those that had run out of documents by the branch step.
    lanes: int | None = None
    dry_lanes: tuple[int, ...] = ()


class DryLanes(ConfigError):
    """A continuation would hand new documents to a packing lane that had run out before the branch."""


def _read_columns(bundle: CheckedBundle) -> dict[str, np.ndarray | None]:
    """The parent's samples columns (a format-1 parent's ``lane`` as its deal: the child keeps its fixed lanes,
    and the new segment's deals modulo them continue the lanes as the parent's would)."""
    deal = deal_column(bundle.manifest.format_version)
    tables = [f.read([deal if c == "deal" else c for c in _COLUMNS]) for f in bundle.samples]
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    out: dict[str, np.ndarray | None] = {}
    for index, name in enumerate(_COLUMNS):
        column = table.column(index)
        out[name] = None if column.null_count == len(column) and len(column) else column.to_numpy()
    return out


def _plan_id(bundle: CheckedBundle) -> str:
    """SHA-256 of the parent's plan.json bytes (its integrity record covers the Parquet files)."""
    return hashlib.sha256((bundle.path / PLAN_JSON).read_bytes()).hexdigest()


def find_branch(
    bundle: CheckedBundle,
    columns: dict[str, np.ndarray | None],
    *,
    at_step: int | None,
    global_batch: int | None,
    state: dict[str, Any] | None,
) -> Branch:
    """The branch step and position (see the module docstring); bad input is one ``ConfigError`` line."""
    manifest = bundle.manifest
    where = f"parent plan {bundle.path}"
    if manifest.exact:
        algorithm = manifest.exact_packing().algorithm
        if algorithm != "wrap":
            raise ConfigError(
                f"a continuation must branch a wrap-packed plan, got a {algorithm} plan at {bundle.path} — "
                f"{algorithm} places every document over the whole plan; plan runs to be continued with "
                "pack_flat(algorithm='wrap')"
            )
        if state is not None:
            check_state_plan(state, bundle, at_step)
            if global_batch is not None and global_batch != int(state["global_batch"]):
                raise ConfigError(
                    f"--global-batch must be the state's global batch {state['global_batch']}, got {global_batch} "
                    "— leave it out (the state carries it) or pass the state of a run with that batch"
                )
            global_batch = int(state["global_batch"])
            at_step = int(state["step"]) if at_step is None else at_step
        if at_step is None or global_batch is None:
            raise ConfigError(
                "an exact plan's continuation needs the branch step and the run's global batch, got "
                f"at_step={at_step}, global_batch={global_batch} — pass both (--at-step N --global-batch G), "
                "or the run's checkpoint state (--continue-from-state STATE.json)"
            )
        check_lineage_batch(bundle, global_batch)
        packing = manifest.exact_packing()
        steps = steps_in(packing.sequences, global_batch, drop_last=True)  # the full steps
        if not 0 <= at_step <= steps:
            raise ConfigError(
                f"--at-step must be within the parent's {steps} full steps of {global_batch} rows, got {at_step} "
                f"({where}) — branch at a step ≤ {steps}"
            )
        offsets = columns["token_offset"]
        assert offsets is not None, "an exact plan has token offsets"
        position = first_position(offsets, at_step, global_batch, packing.max_length)
        return Branch(step=at_step, position=position, global_batch=global_batch)
    if state is None:
        raise ConfigError(
            "an estimated plan's continuation needs the run's checkpoint state at the branch step, got none — an "
            "estimated plan packs at run time, so only the run knows where each lane stood; pass "
            "--continue-from-state STATE.json (Python: state=pipeline.state_dict())"
        )
    check_state_plan(state, bundle, at_step)
    if global_batch is not None and global_batch != int(state["global_batch"]):
        raise ConfigError(
            f"--global-batch must be the state's global batch {state['global_batch']}, got {global_batch} — leave "
            "it out (the state carries it) or pass the state of a run with that batch"
        )
    check_lineage_batch(bundle, int(state["global_batch"]))
    lanes = int(state["lanes"])
    cursors = state.get("lane_cursors") or {}
    missing = sorted(set(range(lanes)) - {int(k) for k in cursors})
    if missing:
        raise ConfigError(
            f"the continuation state must hold every lane's cursor, got none for lanes {missing[:8]} — merge all "
            "ranks' states (zephon.merge_states) or save under torch.distributed, which gathers them"
        )
    position = max(int(p) + (1 if int(skip) else 0) for p, skip in cursors.values())
    return Branch(step=int(state["step"]), position=min(position, manifest.totals.documents),
                  global_batch=int(state["global_batch"]), lanes=lanes,
                  dry_lanes=_dry_lanes(columns, cursors, lanes, int(state["step"])))  # fmt: skip


def _dry_lanes(
    columns: dict[str, np.ndarray | None], cursors: dict[str, Any], lanes: int, step: int
) -> tuple[int, ...]:
    """The lanes with no document left at their cursor at ``step`` (they packed short or empty rows before it)."""
    deal = columns["deal"]
    if deal is None or not step:
        return ()
    lane = deal % lanes
    last = np.full(lanes, -1, np.int64)
    np.maximum.at(last, lane, np.arange(len(lane), dtype=np.int64))
    return tuple(sorted(int(k) for k, (p, skip) in cursors.items() if not int(skip) and int(p) > last[int(k)]))


def branch_of(
    parent_dir: str | Path,
    *,
    at_step: int | None = None,
    global_batch: int | None = None,
    state: dict[str, Any] | None = None,
) -> Branch:
    """Where a continuation of ``parent_dir`` would branch (its step and first new position), without planning."""
    bundle = open_bundle(parent_dir)
    if is_record_plan(bundle, state):
        found = record_branch(bundle, at_step=at_step, global_batch=global_batch, state=state)
        return Branch(step=found.step, position=found.position, global_batch=found.global_batch)
    return find_branch(bundle, _read_columns(bundle), at_step=at_step, global_batch=global_batch, state=state)


def _segment_stages(stages: tuple[Stage, ...], position: int, tokens: int) -> tuple[Stage, ...]:
    """The stages in force from the branch on, their starts counted from it (the one in force at the branch
    starts at 0)."""
    out: list[Stage] = []
    for stage in stages:
        at_position = stage.start_position - position if stage.start_position is not None else None
        at_tokens = stage.start_tokens - tokens if stage.start_tokens is not None else None
        if (at_position is not None and at_position <= 0) or (at_tokens is not None and at_tokens <= 0):
            out = [replace(stage, start_position=0, start_tokens=None)]
        else:
            out.append(replace(stage, start_position=at_position, start_tokens=at_tokens))
    return tuple(out)


def segment_start(prepared: PreparedPlan, columns: dict[str, np.ndarray | None], position: int) -> SegmentStart:
    """What the prefix ``[0, position)`` placed, per dataset of the new config."""
    n = len(prepared.shards)
    ids = columns["dataset_id"][:position]  # type: ignore[index]
    documents = np.bincount(ids, minlength=n)
    tokens = columns["tokens"]
    if tokens is not None:
        kept = tokens[:position].astype(np.int64)
        per = np.bincount(ids, weights=kept, minlength=n).astype(np.int64)
        total = int(kept.sum())
        units = total
    else:
        per, total = np.zeros(n, np.int64), 0
        units = int(row_bytes(prepared.shards)[columns["shard_id"][:position]].sum())  # type: ignore[index]
    return SegmentStart(
        position=position,
        tokens=total,
        units=units if not prepared.exact else 0,
        documents=tuple(int(d) for d in documents),
        dataset_tokens=tuple(int(t) for t in per),
    )


def continue_plan(
    parent_dir: str | Path,
    source: WorkSource,
    out_dir: str | Path,
    *,
    at_step: int | None = None,
    global_batch: int | None = None,
    state: dict[str, Any] | None = None,
    options: PlanOptions | None = None,
) -> Path:
    """Write the plan that continues the parent at ``parent_dir`` from step ``at_step`` with ``source``'s
    configuration into ``out_dir`` (see the module docstring); ``state``: the run's checkpoint state at the
    branch (required for estimated plans); ``options``: see ``PlanOptions``."""
    options = options or PlanOptions()
    if at_step is not None and at_step < 0:
        raise ConfigError(f"--at-step must be >= 0, got {at_step} — give the first global step of the new plan")
    if global_batch is not None and global_batch < 1:
        raise ConfigError(f"--global-batch must be >= 1, got {global_batch} — give the run's global batch rows")
    bundle = open_bundle(parent_dir)  # a damaged or changed parent: one line naming the file
    if Path(out_dir).resolve() == bundle.path.resolve():
        raise ConfigError(
            f"a continuation must be written to a new directory, got the parent's own {bundle.path} — the parent "
            "stays the record of the steps already trained; choose another -o"
        )
    check_cost_sides(bundle, options.sample_pack is not None or any(ds.cost is not None for ds in source.datasets))
    columns = _read_columns(bundle)
    closes: tuple[tuple[int, int | None], ...] = ()
    if is_record_plan(bundle, state):  # samples with costs, packed or not (``continuation.records``)
        found = record_branch(bundle, at_step=at_step, global_batch=global_batch, state=state)
        branch = Branch(step=found.step, position=found.position, global_batch=found.global_batch)
        closes = kept_closes(bundle, found)
    else:
        branch = find_branch(bundle, columns, at_step=at_step, global_batch=global_batch, state=state)
    aligned = align(source, bundle.manifest)
    prepared = options.prepare(aligned.source)
    prepared = finish(prepared, aligned, bundle.manifest, str(bundle.path))
    check_costs_kept(prepared, bundle)  # first: a cost plan's changes are named as such
    check_compatible(prepared, bundle)
    start = segment_start(prepared, columns, branch.position)
    check_prefix_orders(prepared, columns, start)
    parent = bundle.manifest
    parent_id = _plan_id(bundle)  # one read of plan.json: the config and the lineage name the same bytes
    earlier = _parent_segments(bundle, branch)
    config = dict(prepared.config)
    config["continue_from"] = {
        "plan": parent.config_hash,
        "plan_json_sha256": parent_id,
        "step": branch.step,
        "position": branch.position,
        "global_batch": branch.global_batch,
    }
    if aligned.removed:  # only then: continuations that keep every dataset keep their config and hash
        config["continue_from"]["removed"] = list(aligned.removed)
    child = replace(
        prepared,
        config=config,
        config_hash=config_digest(config),
        segment=start,
        stages=_segment_stages(prepared.stages, start.position, start.tokens),
    )
    here = LineageSegment(
        segment=len(earlier), config_hash=child.config_hash, first_step=branch.step, first_position=branch.position
    )
    lineage = PlanLineage(
        parent=LineageParent(config_hash=parent.config_hash, plan_json_sha256=parent_id, path=str(bundle.path)),
        branch=LineageBranch(
            step=branch.step, position=branch.position, global_batch=branch.global_batch, tokens=start.tokens
        ),
        segments=(*earlier, here),
    )
    prefix = Prefix(columns={k: (v[: branch.position] if v is not None else None) for k, v in columns.items()},
                    position=branch.position)  # fmt: skip
    continued = Continued(prefix=prefix, parent=parent, lineage=lineage, check=_dry_lane_check(branch, bundle),
                          sample_closes=closes)  # fmt: skip
    written = write_bundle(
        child,
        Path(out_dir),
        overwrite=options.overwrite,
        continued=continued,
        materialize_selections=options.materialize_selections,
    )
    warn_plan(read_manifest(written))
    return written


def _dry_lane_check(branch: Branch, bundle: CheckedBundle) -> Callable[[Chunk], None] | None:
    """A check of the new segment's chunks: no document dealt to a lane that ran out before the branch (it
    packed short or empty rows in the parent, which the new documents would fill: the kept steps would differ)."""
    if not branch.dry_lanes or branch.lanes is None:
        return None
    lanes, dry = branch.lanes, np.asarray(branch.dry_lanes)

    def check(chunk: Chunk) -> None:
        if chunk.deal is not None and np.isin(chunk.deal % lanes, dry).any():
            raise DryLanes(
                f"the continuation state must be from a step at which every packing lane still had documents, got "
                f"step {branch.step}, where lanes {list(branch.dry_lanes[:8])} of {lanes} had run out (parent plan "
                f"{bundle.path}) — their rows before the branch were short and new documents would fill them; "
                "continue from an earlier checkpoint (a lane runs out within its last deal of the plan's end)"
            )

    return check


def _parent_segments(bundle: CheckedBundle, branch: Branch) -> tuple[LineageSegment, ...]:
    """The parent's segments that start before the branch (a plan without lineage is one segment)."""
    parent = bundle.manifest
    if parent.lineage is None:
        return (LineageSegment(segment=0, config_hash=parent.config_hash, first_step=0, first_position=0),)
    return tuple(s for s in parent.lineage.segments if s.first_position < branch.position or s.segment == 0)
