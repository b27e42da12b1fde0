"""``zephon show`` and ``zephon audit``: a thin layer over ``zephon.inspection`` (``show``, ``audit``),
registered on the ``zephon`` group by ``zephon.cli.app``.

Output formats are documented in docs/cli.md. Expected failures print ``zephon: error: <message>`` on one line
and exit 1 (``zephon.cli.output.one_line_errors``); ``audit`` also exits 1 when the mixture leaves its tolerance.
Library modules are imported inside the commands, so that ``zephon --help`` stays fast.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from zephon.cli.output import (
    CommandError,
    batch_size_option,
    count_of,
    format_option,
    format_table,
    max_length_option,
    one_line_errors,
    read_errors,
)

if TYPE_CHECKING:
    from zephon.inspection.show import StepView

__all__ = ["PLAN_DIR", "audit", "show", "show_lines"]

#: A plan bundle argument: an existing directory.
PLAN_DIR = click.Path(exists=True, file_okay=False, path_type=Path)


# ----------------------------------------------------------------------------------------------------
# zephon show
# ----------------------------------------------------------------------------------------------------


@click.command()
@click.argument("plan_dir", type=PLAN_DIR)
@click.option("-s", "--step", type=click.IntRange(min=0), required=True, help="The step to show (0-based).")
@batch_size_option("Global batch in sequences (default: plan.json batch.global_batch_size; required otherwise).")
@max_length_option
@click.option("--field", default=None, help="Shard column to preview (default: the plan's tokenizer field, else text).")
@click.option("--no-text", is_flag=True, help="Do not open the shards; leave the text column out.")
@click.option(
    "--column",
    "columns",
    multiple=True,
    metavar="COLUMN",
    help="Also show this metadata column of selected datasets (their own or their sidecar's); repeatable.",
)
@format_option("table", "json")
def show(
    plan_dir: Path,
    step: int,
    batch_size: int | None,
    max_length: int | None,
    field: str | None,
    no_text: bool,
    columns: tuple[str, ...],
    fmt: str,
) -> None:
    """Show the documents of one training step of the plan in PLAN_DIR.

    Prints a summary line, then one line per document in plan order: position, dataset, shard (below the
    shards' common directory), row, its tokens, its tokens inside the step, and its first 60 characters
    (line breaks as ⏎). Seeks by Parquet row-group statistics: fast on plans of any size.
    """
    from zephon.inspection.show import show_step

    with one_line_errors(*read_errors()):
        view = show_step(
            plan_dir, step, batch_size=batch_size, max_length=max_length, text=not no_text, field=field, columns=columns
        )
    if fmt == "json":
        click.echo(json.dumps(show_json(view), ensure_ascii=False, indent=2))
        return
    for line in show_lines(view):
        click.echo(line)


def show_lines(view: StepView) -> list[str]:
    """The lines ``zephon show`` prints: a summary, then an aligned table (``zephon.cli.format_table``)."""

    head = (
        f"step {view.step} of {view.steps}: sequences {view.first_sequence}..{view.last_sequence} "
        f"({view.sequences_are}; batch {view.batch_size}), {count_of(len(view.rows), 'document')}"
    )
    tokens = view.tokens
    with_tokens = bool(view.rows) and view.rows[0].tokens is not None
    if tokens is not None and with_tokens:
        head += f", cost {tokens}" if view.costs else f", {count_of(tokens, 'token')}"
    with_sequence = bool(view.rows) and view.rows[0].sequence is not None and view.costs
    with_text = bool(view.rows) and view.rows[0].text is not None
    with_phase = bool(view.rows) and view.rows[0].phase is not None
    columns = ["sequence"] if with_sequence else []
    columns += ["position", "dataset", "shard", "row"]
    columns += ["phase"] if with_phase else []
    columns += (["cost"] if view.costs else ["tokens", "in_step"]) if with_tokens else []
    meta = list(view.rows[0].metadata) if view.rows else []
    columns += meta
    columns += ["text"] if with_text else []
    rows = []
    for r in view.rows:
        values: list[Any] = [r.sequence] if with_sequence else []
        values += [r.position, r.dataset, r.shard, r.row]
        values += [r.phase] if with_phase else []
        values += ([r.tokens] if view.costs else [r.tokens, r.tokens_in_step]) if with_tokens else []
        values += [r.metadata[n] for n in meta]
        values += [r.text] if with_text else []
        rows.append(values)
    return [head, *format_table(columns, rows).splitlines()]


def show_json(view: StepView) -> dict[str, Any]:
    return {
        "step": view.step,
        "steps": view.steps,
        "batch_size": view.batch_size,
        "first_sequence": view.first_sequence,
        "last_sequence": view.last_sequence,
        "sequences_are": view.sequences_are,
        "tokens": view.tokens,
        "documents": [
            {
                "position": r.position,
                "dataset": r.dataset,
                "shard": r.uri,
                "row": r.row,
                "epoch": r.epoch,
                "tokens": r.tokens,
                "tokens_in_step": r.tokens_in_step,
                "text": r.text,
                **({"phase": r.phase} if r.phase is not None else {}),
                **({"sequence": r.sequence} if r.sequence is not None else {}),
                **({"metadata": dict(r.metadata)} if r.metadata else {}),
            }
            for r in view.rows
        ],
    }


# ----------------------------------------------------------------------------------------------------
# zephon audit
# ----------------------------------------------------------------------------------------------------


@click.command()
@click.argument("plan_dir", type=PLAN_DIR)
@click.option("-w", "--window", type=click.IntRange(min=1), default=100, show_default=True, help="Steps per window.")
@click.option(
    "-t",
    "--tolerance",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    metavar="PCT",
    help="Allowed deviation of a window's share from the target, in percentage points.",
)
@click.option(
    "--by",
    type=click.Choice(["samples", "tokens", "cost"]),
    default=None,
    help="Unit of the shares (default: the plan's mixture unit).",
)
@batch_size_option("Global batch in sequences (default: plan.json batch.global_batch_size; required otherwise).")
@max_length_option
@format_option("table", "json")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE.png",
    help="Write a PNG of each dataset's share per window (needs matplotlib).",
)
@click.option(
    "--log",
    "log_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    metavar="LOGDIR",
    help="Check a provenance log (Pipeline.options(provenance_dir=LOGDIR)) against the plan instead.",
)
@click.option(
    "--by-column",
    "by_column",
    default=None,
    metavar="COLUMN",
    help="Report the mean of a metadata column (a selected dataset's or sidecar's) per window instead.",
)
def audit(
    plan_dir: Path,
    window: int,
    tolerance: float,
    by: str | None,
    batch_size: int | None,
    max_length: int | None,
    fmt: str,
    plot: Path | None,
    log_dir: Path | None,
    by_column: str | None,
) -> None:
    """Audit the mixture of the plan in PLAN_DIR in every window of consecutive steps.

    Compares each dataset's share (of tokens or samples) overall and in its worst sliding window of
    --window steps with its target (the normalized mixture weight). Exits 1 when a dataset with weight
    ≥ 5% is more than --tolerance percentage points off in some window, naming the dataset and the window;
    0 otherwise. With --log LOGDIR it instead checks what the ranks actually yielded (their provenance log)
    against the plan and exits 1 on any mismatch. With --by-column COLUMN it reports that metadata
    column's mean in consecutive windows of --window steps (e.g. quality over training; docs/curricula.md).
    """
    from zephon.cli.audit_report import audit_json, audit_lines
    from zephon.inspection.audit import AuditSpec, audit_plan, plot_shares

    if log_dir is not None:
        from zephon.inspection.log_check import check_log, log_json, log_summary

        with one_line_errors(*read_errors()):
            check = check_log(plan_dir, log_dir)
        click.echo(log_json(check) if fmt == "json" else "\n".join(log_summary(check)))
        if not check.ok:
            sys.exit(1)
        return
    if by_column is not None:
        from zephon.inspection.column_audit import column_windows

        with one_line_errors(*read_errors()):
            cw = column_windows(plan_dir, by_column, batch_size=batch_size, max_length=max_length, window=window)
        if fmt == "json":
            windows = [
                {"first_step": int(f), "mean": None if math.isnan(m) else float(m), "documents": int(n)}
                for f, m, n in zip(cw.first_step.tolist(), cw.means.tolist(), cw.counts.tolist(), strict=True)
            ]
            body = {"column": cw.column, "window": cw.window, "mean": cw.mean, "documents": cw.documents}
            click.echo(json.dumps(body | {"nulls": cw.nulls, "windows": windows}, indent=2))
            return
        click.echo(
            f"{cw.column}: mean {cw.mean:.4f} over {cw.documents} documents ({cw.nulls} without a value); "
            f"per window of {cw.window} steps:"
        )
        for f, m, n in zip(cw.first_step.tolist(), cw.means.tolist(), cw.counts.tolist(), strict=True):
            click.echo(f"  steps {f}-{f + cw.window - 1}: mean {m:.4f} ({n} documents)")
        return
    if plot is not None and not plot.parent.is_dir():
        raise CommandError(
            f"--plot must be a file in an existing directory, got {plot} (no directory {plot.parent}) — create "
            "the directory or choose another path"
        )
    with one_line_errors(*read_errors()):
        spec = AuditSpec(
            batch_size=batch_size,
            max_length=max_length,
            window=window,
            tolerance_pp=tolerance,
            by=by,  # type: ignore[arg-type]
        )
        result = audit_plan(plan_dir, spec)
        if plot is not None:
            plot_shares(result, plot)
    if fmt == "json":
        click.echo(json.dumps(audit_json(result), indent=2))
    else:
        for line in audit_lines(result):
            click.echo(line)
    if not result.ok:
        sys.exit(1)
