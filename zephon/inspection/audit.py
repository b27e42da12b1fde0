"""Mixture audit: does every window of training hold each dataset's share, not just the whole plan?

``audit_plan(plan_dir, AuditSpec(batch_size=B, window=W))`` measures, per dataset, its share of the units
(``tokens`` or ``samples``, default the plan's mixture unit) in the whole plan and in every window of ``W``
consecutive steps (sliding: steps ``[s, s+W)`` for every ``s``; one window of all steps when the plan is
shorter), and compares them with the target: the normalized mixture weights, or — when auditing in the
other unit than the mixture's — the dataset's overall share of the plan (then the audit measures how evenly
the dataset is spread). A dataset whose weight is at least ``min_weight`` (5 %) *violates* the audit when
its share in some window is more than ``tolerance_pp`` percentage points from its target.

Phased plans (``zephon.work.Phase``; plan.json ``phases``) are audited phase by phase: each document counts
in its phase (by plan position), windows slide over the steps holding the phase's documents, and the
target is the phase's weights. A step that straddles a boundary counts in both phases with the units of
each. The top-level figures then summarize the phases: the target is the mixture the phases add up to
(each phase's target weighted by its units), the worst window is the worst of any phase.

Units per step come from the ``steps`` view (``zephon.inspection.views``): tokens are each document's tokens
inside the step; samples count each document once, in the step holding its first token.

Worked example: 6 steps, two datasets with weights 0.5/0.5, tokens per step a = [4, 4, 8, 0, 4, 4],
b = [4, 4, 0, 8, 4, 4]. Windows of W = 2 steps: a's shares are 8/16, 12/16, 8/16, 4/16, 8/16 — the worst
window is steps 1..2 (share 0.75, +25 pp) and steps 2..3 hold 0.5 again; with ``tolerance_pp = 10``, ``a``
and ``b`` violate (both by 25 pp). Sliding sums are differences of one cumulative sum (``numpy``), so the
audit costs one grouped SQL pass plus ``O(steps × datasets)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zephon.errors import ConfigError
from zephon.inspection.audit_records import AuditResult, AuditSpec, DatasetAudit, PhaseAudit, Unit
from zephon.inspection.steps import resolve_layout
from zephon.inspection.views import connect_with_steps, document_steps_sql
from zephon.plan.bundle import open_bundle
from zephon.plan.manifest import Manifest, PlanDataset

__all__ = ["AuditResult", "AuditSpec", "DatasetAudit", "PhaseAudit", "audit_plan", "plot_shares"]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Range:
    """A stretch of plan positions audited against one target (the whole plan, or one phase)."""

    index: int
    first_position: int
    end_position: int
    weights: np.ndarray  # per dataset, normalized (0 where the phase reads nothing)
    segment: int | None = None  # its lineage segment (continued plans only)


def _ranges(manifest: Manifest, names: list[str]) -> list[_Range]:
    return [
        _Range(
            index=p.index,
            first_position=p.first_position,
            end_position=p.end_position,
            weights=np.array([p.weights.get(n, 0.0) for n in names]),
            segment=p.segment if manifest.lineage is not None else None,
        )
        for p in manifest.resolved_phases
    ]


def audit_plan(plan_dir: str | os.PathLike[str], spec: AuditSpec | None = None) -> AuditResult:
    """Audit the plan's mixture per window of ``spec.window`` steps (see the module docstring)."""
    spec = spec or AuditSpec()
    plan_dir = Path(plan_dir)
    bundle = open_bundle(plan_dir)
    manifest = bundle.manifest
    layout = resolve_layout(manifest, batch_size=spec.batch_size, max_length=spec.max_length)
    steps = layout.require_steps()
    if steps == 0:
        raise ConfigError(f"plan {plan_dir} must have at least one step to audit, got none — audit a non-empty plan")
    unit: Unit = manifest.mixture.unit
    by: Unit = spec.by or unit
    if (by == "cost") != (layout.tokens == "cost") and by != "samples":
        raise ConfigError(
            f"by must be 'samples' or the plan's amount ({'cost' if layout.tokens == 'cost' else 'tokens'}), got "
            f"{by!r} — omit --by, or pass --by samples"
        )
    if by == "tokens" and layout.tokens is None:
        raise ConfigError(
            "by must be 'samples' for a plan without token counts, got 'tokens' — omit --by tokens, or plan a "
            "token mixture (token_estimation) or an exact plan"
        )
    entries = manifest.datasets
    ids = [d.id for d in entries]
    ranges = [r for r in _ranges(manifest, manifest.dataset_names) if r.end_position > r.first_position]
    # Phase of a position: the number of phase ends at or below it (integers from plan.json, not user text).
    phase = " + ".join(f"(position >= {r.end_position})::INTEGER" for r in ranges[:-1]) or "0"
    if by in ("tokens", "cost"):  # a cost plan's steps view carries each sample's cost as its tokens
        query = f"SELECT step, dataset_id, {phase} AS phase, sum(tokens_in_step) AS units FROM steps GROUP BY ALL"
    else:
        query = (
            f"SELECT step, dataset_id, {phase} AS phase, count(*) AS units "
            f"FROM ({document_steps_sql(layout)}) GROUP BY ALL"
        )
    con = connect_with_steps(bundle, layout.batch_size, max_length=spec.max_length)
    try:
        rows = con.execute(query).fetchnumpy()
        longest = con.execute("SELECT max(tokens) FROM samples").fetchone() if manifest.exact else None
    finally:
        con.close()
    column = {dataset_id: i for i, dataset_id in enumerate(ids)}
    cols = np.array([column[int(d)] for d in rows["dataset_id"]], dtype=np.int64)
    per_step = np.zeros((len(ranges), steps, len(entries)), dtype=np.float64)
    where = (np.asarray(rows["phase"], np.int64), np.asarray(rows["step"], dtype=np.int64), cols)
    np.add.at(per_step, where, np.asarray(rows["units"], float))

    parts = []
    for k, r in enumerate(ranges):
        if len(ranges) == 1:
            first, last = 0, steps - 1
        else:
            held = np.flatnonzero(per_step[k].sum(axis=1))
            first, last = int(held[0]), int(held[-1])
        parts.append(_windows(per_step[k, first : last + 1], first, r.weights, by == unit, spec, entries, ids))
    if len(ranges) == 1:
        datasets = parts[0].datasets
        phases: tuple[PhaseAudit, ...] = ()
    else:
        phases = tuple(
            PhaseAudit(
                index=r.index,
                first_position=r.first_position,
                end_position=r.end_position,
                first_step=p.first_step,
                last_step=p.first_step + p.steps - 1,
                window=p.width,
                windows=len(p.shares),
                datasets=p.datasets,
                segment=r.segment,
            )
            for r, p in zip(ranges, parts, strict=True)
        )
        datasets = _summary(per_step, parts, entries, ids)
    return AuditResult(
        plan=str(plan_dir),
        by=by,
        tokens_are=layout.tokens if by == "tokens" else None,  # "cost" says its unit itself
        target_source="weights" if by == unit else "overall",
        batch_size=int(layout.batch_size or 0),
        max_length=layout.max_length,
        steps=steps,
        window=max(p.width for p in parts),
        windows=sum(len(p.shares) for p in parts),
        tolerance_pp=float(spec.tolerance_pp),
        min_weight=spec.min_weight,
        datasets=datasets,
        phases=phases,
        window_first_step=np.concatenate([p.first_step + np.arange(len(p.shares)) for p in parts]),
        window_shares=np.vstack([p.shares for p in parts]),
        window_targets=np.vstack([np.broadcast_to(p.target, p.shares.shape) for p in parts]),
        **_bounds(manifest, longest[0] if longest else None, max(p.width for p in parts), int(layout.batch_size or 0)),
    )


def _bounds(manifest: Manifest, longest: int | None, window: int, batch: int) -> dict[str, object]:
    """``packing``, ``bound_pp`` and ``longest_document_pp`` of an exact plan (nothing for estimated plans)."""
    if not manifest.exact or manifest.packing is None or not window or not batch:
        return {}
    packing = manifest.packing
    rows = window * batch
    out: dict[str, object] = {"packing": packing.algorithm}
    if longest is not None:
        out["longest_document_pp"] = 100.0 * int(longest) / (rows * packing.max_length)
    if packing.algorithm == "homogeneous":
        from zephon.planner.homogeneous import window_bound_rows

        out["bound_pp"] = 100.0 * window_bound_rows() / rows
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class _Windows:
    first_step: int
    steps: int
    width: int
    target: np.ndarray
    units: np.ndarray  # per dataset, whole range
    shares: np.ndarray  # windows × datasets
    datasets: tuple[DatasetAudit, ...]


def _windows(
    per_step: np.ndarray,
    first_step: int,
    weights: np.ndarray,
    by_weights: bool,
    spec: AuditSpec,
    entries: tuple[PlanDataset, ...],
    ids: list[int],
) -> _Windows:
    """Sliding windows over ``per_step`` (steps × datasets, starting at ``first_step``) against ``weights``
    (or, when not ``by_weights``, the range's own overall shares)."""
    steps = len(per_step)
    totals = per_step.sum(axis=0)
    overall = totals / totals.sum() if totals.sum() else np.zeros_like(totals)
    target = weights if by_weights else overall
    width = min(spec.window, steps)
    cumulative = np.vstack([np.zeros((1, len(entries))), np.cumsum(per_step, axis=0)])
    sums = cumulative[width:] - cumulative[:-width]
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = sums / sums.sum(axis=1, keepdims=True)
    deviation = np.where(np.isnan(shares), 0.0, shares - target)
    worst = np.abs(deviation).argmax(axis=0)
    tolerance = spec.tolerance_pp / 100
    datasets = []
    for i, entry in enumerate(entries):
        w = int(worst[i])
        checked = bool(weights[i] >= spec.min_weight)
        datasets.append(
            DatasetAudit(
                dataset_id=ids[i],
                name=entry.name,
                weight=float(weights[i]),
                target=float(target[i]),
                overall_share=float(overall[i]),
                worst_share=float(shares[w, i]),
                worst_first_step=first_step + w,
                worst_last_step=first_step + w + width - 1,
                worst_deviation=float(deviation[w, i]),
                checked=checked,
                violated=checked and abs(float(deviation[w, i])) > tolerance,
            )
        )
    return _Windows(
        first_step=first_step,
        steps=steps,
        width=width,
        target=target,
        units=totals,
        shares=shares,
        datasets=tuple(datasets),
    )


def _summary(
    per_step: np.ndarray, parts: list[_Windows], entries: tuple[PlanDataset, ...], ids: list[int]
) -> tuple[DatasetAudit, ...]:
    """Per dataset over all phases: overall share against the phases' combined target, and the worst window
    of any phase."""
    totals = per_step.sum(axis=(0, 1))
    overall = totals / totals.sum()
    units = np.array([p.units.sum() for p in parts])
    target = sum(u * p.target for u, p in zip(units, parts, strict=True)) / units.sum()
    out = []
    for i, entry in enumerate(entries):
        worst = max((p.datasets[i] for p in parts), key=lambda d: (d.checked, abs(d.worst_deviation)))
        out.append(
            DatasetAudit(
                dataset_id=ids[i],
                name=entry.name,
                weight=entry.weight,
                target=float(target[i]),
                overall_share=float(overall[i]),
                worst_share=worst.worst_share,
                worst_first_step=worst.worst_first_step,
                worst_last_step=worst.worst_last_step,
                worst_deviation=worst.worst_deviation,
                checked=any(p.datasets[i].checked for p in parts),
                violated=any(p.datasets[i].violated for p in parts),
            )
        )
    return tuple(out)


def plot_shares(result: AuditResult, path: str | os.PathLike[str], *, max_points: int = 4000) -> Path:
    """Write a PNG of each dataset's share per window over training, with its target as a dashed line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError(
            f"matplotlib must be installed to plot the audit, got {type(exc).__name__}: {exc} — "
            "pip install matplotlib (it is in zephon's dev extra)"
        ) from exc
    stride = max(1, -(-result.windows // max_points))
    x = result.window_first_step[::stride]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    try:
        for i, d in enumerate(result.datasets):
            (line,) = ax.plot(x, result.window_shares[::stride, i], label=f"{d.name} (target {d.target:.3f})")
            # The target per window: one level, or a step per phase.
            ax.plot(x, result.window_targets[::stride, i], color=line.get_color(), linestyle="--", linewidth=0.8)
        for phase in result.phases[1:]:
            ax.axvline(phase.first_step, color="grey", linestyle=":", linewidth=0.8)
        ax.set_xlabel(f"first step of the window ({result.window} steps of {result.batch_size} sequences)")
        ax.set_ylabel(f"share of {result.by}")
        ax.set_title(f"{Path(result.plan).name}: share per window, {'ok' if result.ok else 'VIOLATED'}")
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        out = Path(path)
        fig.savefig(out, format="png", dpi=100)
    finally:
        plt.close(fig)
    return out
