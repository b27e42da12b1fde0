"""``zephon diff``: two plans compared (``zephon.inspection.diff``), registered on the ``zephon`` group by
``zephon.cli.app``; output formats in docs/cli.md. Exits 0 whatever the differences; a plan that cannot be read
is one line (``zephon.cli.output.one_line_errors``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from zephon.cli.inspect_commands import PLAN_DIR
from zephon.cli.output import (
    batch_size_option,
    count_of,
    format_option,
    format_table,
    max_length_option,
    one_line_errors,
    read_errors,
)

if TYPE_CHECKING:
    from zephon.inspection.diff import PlanDiff

__all__ = ["diff", "diff_json", "diff_lines"]


# ----------------------------------------------------------------------------------------------------
# zephon diff
# ----------------------------------------------------------------------------------------------------


@click.command()
@click.argument("plan_a", type=PLAN_DIR)
@click.argument("plan_b", type=PLAN_DIR)
@batch_size_option("Global batch in sequences: report the step of the first difference in each plan.")
@max_length_option
@format_option("table", "json")
def diff(plan_a: Path, plan_b: Path, batch_size: int | None, max_length: int | None, fmt: str) -> None:
    """Compare the plans in PLAN_A and PLAN_B.

    Prints the config keys whose values differ (dotted paths), the first position whose document differs
    (and its step with --batch-size), documents and tokens per dataset in A and B, and the shards added and
    removed (by URI and fingerprint). Exits 0 whatever the differences.
    """
    from zephon.inspection.diff import diff_plans

    with one_line_errors(*read_errors()):
        result = diff_plans(plan_a, plan_b, batch_size=batch_size, max_length=max_length)
    if fmt == "json":
        click.echo(json.dumps(diff_json(result), ensure_ascii=False, indent=2))
        return
    for line in diff_lines(result):
        click.echo(line)


def _value(present: bool, value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if present else "(missing)"


def diff_lines(result: PlanDiff) -> list[str]:
    """The lines ``zephon diff`` prints (see docs/cli.md)."""
    from zephon.inspection.show import short_uris

    changes = result.config_changes
    lines = [
        f"diff {result.plan_a} → {result.plan_b}",
        f"config {result.config_hash_a[:12]} → {result.config_hash_b[:12]}: {count_of(len(changes), 'difference')}",
    ]
    width = max((len(c.path) for c in changes), default=0)
    lines += [f"  {c.path:<{width}}  {_value(c.in_a, c.a)} → {_value(c.in_b, c.b)}" for c in changes]
    br = result.branch
    if br is not None:
        parent = "A" if br.child == "B" else "B"
        lines.append(
            f"branch: {br.child} continues {parent} from step {br.step} (global batch {br.global_batch}), "
            f"position {br.position}; steps 0..{br.step - 1} are shared"
            if br.step
            else f"branch: {br.child} continues {parent} from step 0 (global batch {br.global_batch}); none shared"
        )
        if br.removed or br.added:
            lines.append(
                "  datasets at the branch: "
                + ", ".join([*(f"{n} left out" for n in br.removed), *(f"{n} added" for n in br.added)])
            )
    first = result.first_difference
    uris = [s.uri for s in (*result.shards_added, *result.shards_removed)]
    if first is not None:
        uris += [ref.uri for ref in (first.a, first.b) if ref is not None]
    short = short_uris(uris)
    if first is None:
        lines.append(f"first difference: none (the same {count_of(result.documents_a, 'document')} in the same order)")
    else:
        steps = ""
        if first.step_a is not None or first.step_b is not None:
            steps = f" (step {_or_none(first.step_a)} in A, step {_or_none(first.step_b)} in B)"
        lines.append(f"first difference: position {first.position}{steps}")
        refs = (("A", first.a), ("B", first.b))
        name_w = max(len(ref.dataset) for _, ref in refs if ref is not None)
        uri_w = max(len(short[ref.uri]) for _, ref in refs if ref is not None)
        for label, ref in refs:
            where = f"{ref.dataset:<{name_w}}  {short[ref.uri]:<{uri_w}}  row {ref.row}" if ref else "(plan ended)"
            lines.append(f"  {label}  {where}")
    lines.append(f"documents: {result.documents_a} → {result.documents_b}")
    with_tokens = any(d.tokens_a is not None or d.tokens_b is not None for d in result.datasets)
    header = ["dataset", "documents A", "documents B", "Δ documents"]
    header += ["tokens A", "tokens B", "Δ tokens"] if with_tokens else []
    rows = []
    for d in result.datasets:
        row: list[Any] = [d.name, d.documents_a, d.documents_b, d.documents_b - d.documents_a]
        if with_tokens:
            delta = None if d.tokens_a is None or d.tokens_b is None else d.tokens_b - d.tokens_a
            row += [d.tokens_a, d.tokens_b, delta]
        rows.append(row)
    lines += ["  " + line for line in format_table(header, rows).splitlines()]
    lines.append(f"shards: {len(result.shards_added)} added, {len(result.shards_removed)} removed")
    lines += [f"  + {s.dataset}  {short[s.uri]}  {s.fingerprint}" for s in result.shards_added]
    lines += [f"  - {s.dataset}  {short[s.uri]}  {s.fingerprint}" for s in result.shards_removed]
    return lines


def _or_none(value: int | None) -> str:
    return "-" if value is None else str(value)


def diff_json(result: PlanDiff) -> dict[str, Any]:
    first = result.first_difference

    def ref(r: Any) -> dict[str, Any] | None:
        return None if r is None else {"dataset": r.dataset, "uri": r.uri, "fingerprint": r.fingerprint, "row": r.row}

    def change(c: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"path": c.path}
        if c.in_a:
            out["a"] = c.a
        if c.in_b:
            out["b"] = c.b
        return out

    return {
        "plan_a": result.plan_a,
        "plan_b": result.plan_b,
        "config_hash_a": result.config_hash_a,
        "config_hash_b": result.config_hash_b,
        "config_changes": [change(c) for c in result.config_changes],
        "first_difference": None
        if first is None
        else {
            "position": first.position,
            "step_a": first.step_a,
            "step_b": first.step_b,
            "a": ref(first.a),
            "b": ref(first.b),
        },
        "documents_a": result.documents_a,
        "documents_b": result.documents_b,
        "datasets": [
            {
                "name": d.name,
                "documents_a": d.documents_a,
                "documents_b": d.documents_b,
                "tokens_a": d.tokens_a,
                "tokens_b": d.tokens_b,
            }
            for d in result.datasets
        ],
        "shards_added": [
            {"dataset": s.dataset, "uri": s.uri, "fingerprint": s.fingerprint} for s in result.shards_added
        ],
        "shards_removed": [
            {"dataset": s.dataset, "uri": s.uri, "fingerprint": s.fingerprint} for s in result.shards_removed
        ],
    } | ({"branch": {k: getattr(result.branch, k)
                     for k in ("child", "step", "position", "global_batch", "removed", "added")}}
         if result.branch is not None else {})  # fmt: skip
