"""What ``zephon audit`` prints: the audit (``zephon.inspection.audit``) as aligned tables or as JSON (docs/cli.md)."""

from __future__ import annotations

from typing import Any

from zephon.cli.output import format_table
from zephon.inspection.audit import AuditResult, DatasetAudit

__all__ = ["audit_json", "audit_lines"]


def audit_lines(result: AuditResult) -> list[str]:
    """The lines ``zephon audit`` prints: a summary, a table per dataset (and per phase of a phased plan),
    then FAIL lines or one ok line."""
    tokens = f" ({result.tokens_are})" if result.tokens_are else ""
    target = "mixture weights" if result.target_source == "weights" else "the plan's overall shares"
    if result.phases:
        target = target.replace("mixture weights", "each phase's weights") + f"; {len(result.phases)} phases"
    lines = [
        f"audit {result.plan}: {result.by}{tokens} per window of {result.window} steps ({result.windows} windows; "
        f"{result.steps} steps of {result.batch_size} sequences), tolerance {result.tolerance_pp:.2f} pp, "
        f"target: {target}"
    ]
    if result.bound_pp is not None:
        lines.append(
            f"bound: {result.packing} packing holds every window's shares within ±{result.bound_pp:.2f} pp "
            "(one row at each end of a window)"
        )
    elif result.longest_document_pp is not None:
        lines.append(
            f"bound: none from {result.packing} packing — the longest document is {result.longest_document_pp:.2f} "
            'pp of a window and can move one by that much; pack_flat(algorithm="homogeneous") bounds every '
            "window by one row per end"
        )
    header = ["dataset", "weight", "target", "overall", "worst window", "share", "deviation", "check"]
    lines += format_table(header, _audit_rows(result.datasets)).splitlines()
    for phase in result.phases:
        segment = "" if phase.segment is None else f" (segment {phase.segment})"
        lines.append(
            f"phase {phase.index}{segment}: positions {phase.first_position}..{phase.end_position - 1}, steps "
            f"{phase.first_step}..{phase.last_step}, {phase.windows} windows of {phase.window} steps"
        )
        lines += format_table(header, _audit_rows(phase.datasets)).splitlines()
    failing = [(p.index, p.violations) for p in result.phases] or [(None, result.violations)]
    for index, violations in failing:
        where = f" in phase {index}" if index is not None else ""
        for d in violations:
            lines.append(
                f"FAIL {d.name}{where}: share {d.worst_share:.4f} in steps {d.worst_first_step}..{d.worst_last_step} "
                f"is {100 * d.worst_deviation:+.2f} pp from its target {d.target:.4f} "
                f"(tolerance {result.tolerance_pp:.2f} pp)"
            )
    if result.ok:
        lines.append(
            f"ok: every dataset with weight ≥ {result.min_weight:g} is within {result.tolerance_pp:.2f} pp of its "
            f"target in every window of {result.window} steps"
        )
    return lines


def _audit_rows(datasets: tuple[DatasetAudit, ...]) -> list[list[str]]:
    return [
        [
            d.name,
            f"{d.weight:.3f}",
            f"{d.target:.4f}",
            f"{d.overall_share:.4f}",
            f"steps {d.worst_first_step}..{d.worst_last_step}",
            f"{d.worst_share:.4f}",
            f"{100 * d.worst_deviation:+.2f} pp",
            ("FAIL" if d.violated else "ok") if d.checked else "-",
        ]
        for d in datasets
    ]


def _audit_datasets_json(datasets: tuple[DatasetAudit, ...]) -> list[dict[str, Any]]:
    return [
        {
            "name": d.name,
            "dataset_id": d.dataset_id,
            "weight": d.weight,
            "target": d.target,
            "overall_share": d.overall_share,
            "worst_window": {
                "first_step": d.worst_first_step,
                "last_step": d.worst_last_step,
                "share": d.worst_share,
                "deviation_pp": 100 * d.worst_deviation,
            },
            "checked": d.checked,
            "violated": d.violated,
        }
        for d in datasets
    ]


def audit_json(result: AuditResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "plan": result.plan,
        "ok": result.ok,
        "by": result.by,
        "tokens_are": result.tokens_are,
        "target": result.target_source,
        "batch_size": result.batch_size,
        "max_length": result.max_length,
        "steps": result.steps,
        "window_steps": result.window,
        "windows": result.windows,
        "tolerance_pp": result.tolerance_pp,
        "min_weight": result.min_weight,
        "datasets": _audit_datasets_json(result.datasets),
        "violations": [d.name for d in result.violations],
    }
    if result.packing is not None:
        out["packing"] = result.packing
        out["bound_pp"] = result.bound_pp
        out["longest_document_pp"] = result.longest_document_pp
    if result.phases:
        out["phases"] = [
            {
                "index": p.index,
                "ok": p.ok,
                "first_position": p.first_position,
                "end_position": p.end_position,
                "first_step": p.first_step,
                "last_step": p.last_step,
                "window_steps": p.window,
                "windows": p.windows,
                "datasets": _audit_datasets_json(p.datasets),
                "violations": [d.name for d in p.violations],
            }
            | ({"segment": p.segment} if p.segment is not None else {})
            for p in result.phases
        ]
    return out
