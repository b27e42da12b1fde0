"""``zephon sql``: a read-only query over a plan bundle, printed as a table, CSV, JSON or written as Parquet."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from zephon.cli.output import (
    CommandError,
    batch_size_option,
    count_of,
    format_csv,
    format_json,
    format_option,
    format_table,
    max_length_option,
    one_line_errors,
    read_errors,
)
from zephon.storage.files import write_atomic

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OTHER_FILE = "or write to another -o FILE"


def _check_output(output: Path, plan_dir: Path, overwrite: bool) -> None:
    """``-o FILE`` never lands inside the bundle being read, and replaces an existing file only with --overwrite."""
    if output.resolve().is_relative_to(plan_dir.resolve()):
        raise CommandError(
            f"-o must name a file outside the plan bundle being read, got {output} inside {plan_dir} — write the "
            "result elsewhere (a bundle's files are the planner's alone)"
        )
    if (output.exists() or output.is_symlink()) and not overwrite:
        raise CommandError(f"-o must name a new file, got existing {output} — choose another path or pass --overwrite")


def _parse_params(_ctx: click.Context, _param: click.Parameter, values: Sequence[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in values:
        name, sep, text = item.partition("=")
        if not sep or not _NAME.match(name):
            raise click.BadParameter(f"must be NAME=VALUE with NAME a SQL identifier, got {item!r} — e.g. n=3")
        if name in params:
            raise click.BadParameter(f"each NAME must be given once, got {name!r} twice — drop one")
        params[name] = param_value(text)
    return params


def param_value(text: str) -> int | float | str:
    """A ``--param`` value: an int if it parses as one, else a finite float, else the string itself."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


@click.command()
@click.argument("plan_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("query")
@format_option("table", "csv", "json", "parquet", help_text="Output format; parquet needs -o FILE.")
@click.option(
    "-p",
    "--param",
    "params",
    multiple=True,
    metavar="NAME=VALUE",
    callback=_parse_params,
    help="Bind $NAME in QUERY (repeatable). VALUE is an int if it parses, else a float, else a string.",
)
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Write the result to FILE instead of stdout (required by --format parquet).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing FILE (never one inside PLAN_DIR).")
@batch_size_option("Global batch in sequences: adds the views steps and step_documents(n).")
@max_length_option
def sql(
    plan_dir: Path,
    query: str,
    fmt: str,
    params: dict[str, Any],
    output: Path | None,
    overwrite: bool,
    batch_size: int | None,
    max_length: int | None,
) -> None:
    """Run a SQL query on the plan bundle in PLAN_DIR.

    QUERY is DuckDB SQL; '-' reads it from stdin. Views: samples (one row per scheduled document), shards
    (one row per shard), datasets (one row per dataset of plan.json), bins (best-fit plans), sequences
    (documents per packed row, where the plan fixes them) and, with --batch-size, steps (documents per global
    batch). The connection is read-only: it cannot read or write other files. See docs/cli.md for the
    views and output formats.
    """

    from zephon.inspection.views import query_table, run_query

    if fmt == "parquet" and output is None:
        raise click.BadParameter(
            "parquet output must go to a file, got no -o/--output — add -o FILE", param_hint="'--format'"
        )
    if output is not None:
        _check_output(output, plan_dir, overwrite)
    if query == "-":
        query = sys.stdin.read()
    if not query.strip():
        raise click.BadParameter("must be a SQL statement, got an empty query", param_hint="'QUERY'")
    with one_line_errors(*read_errors()):
        if fmt == "parquet":
            import pyarrow.parquet as pq

            assert output is not None
            table = query_table(plan_dir, query, params or None, batch_size=batch_size, max_length=max_length)
            if table is None:
                raise CommandError(
                    "the last statement must return rows to write Parquet, got a statement without a result — "
                    "end QUERY with a SELECT"
                )
            write_atomic(output, lambda tmp: pq.write_table(table, tmp), "the query result", _OTHER_FILE)
            click.echo(f"wrote {count_of(table.num_rows, 'row')} ({count_of(table.num_columns, 'column')}) to {output}")
            return
        columns, rows = run_query(plan_dir, query, params or None, batch_size=batch_size, max_length=max_length)
        if not columns:
            return
        formatter = {"csv": format_csv, "json": format_json, "table": format_table}[fmt]
        text = formatter(columns, rows)
        if output is None:
            click.echo(text, nl=False)
        else:
            write_atomic(output, lambda tmp: tmp.write_text(text, encoding="utf-8"), "the query result", _OTHER_FILE)
