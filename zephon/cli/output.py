"""What every ``zephon`` command shares: one-line failures, counted nouns, and tables in text, CSV and JSON.

Commands import these helpers; nothing here imports a command, so helpers flow down, never back up.
Expected failures (a ``ZephonError``, an OS error, a DuckDB error in ``sql``) print one line
``zephon: error: <message>`` to stderr and exit 1 (``one_line_errors``); usage errors exit 2 with click's
usage message. A ``ZephonWarning`` raised meanwhile (a plan bundle skipped in a dataset folder) prints one line
``zephon: warning: <message>`` (``warning_lines``).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from typing import IO, Any

import click

from zephon.checks import is_number
from zephon.errors import ZephonError, ZephonWarning, one_line


class CommandError(click.ClickException):
    """An expected failure: printed as ``zephon: error: <message>`` on one line, exit status 1."""

    exit_code = 1

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"zephon: error: {self.format_message()}", file=file, err=file is None)


@contextmanager
def one_line_errors(*extra: type[BaseException]) -> Iterator[None]:
    """Turn expected exceptions into a ``CommandError`` whose message is a single line."""
    try:
        yield
    except (ZephonError, OSError, *extra) as exc:
        raise CommandError(one_line(exc)) from exc


@contextmanager
def warning_lines() -> Iterator[None]:
    """Within the block, each ``ZephonWarning`` is printed as one line ``zephon: warning: <message>`` on stderr
    (other warnings as Python shows them); the warning filters decide which are shown, as always."""
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
            if issubclass(category, ZephonWarning):
                click.echo(f"zephon: warning: {one_line(str(message))}", err=True)
            else:
                shown(message, category, *args, **kwargs)

        warnings.showwarning = show
        yield


def count_of(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned text table: header, a line of dashes, rows; numeric columns right-aligned, NULL as ``NULL``."""
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [
        any(row[i] is not None for row in rows) and all(row[i] is None or is_number(row[i]) for row in rows)
        for i in range(len(columns))
    ]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    out = [line(columns), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in cells)
    return "\n".join(out) + "\n"


def format_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """CSV with a header row (``\\n`` line endings, NULL as an empty field)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([["" if v is None else v for v in row] for row in rows])
    return out.getvalue()


def format_json(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A JSON array of one object per row, one row per line; a repeated column name gets ``_1``, ``_2``..."""
    # Imported here: `zephon --help` stays fast (the views import DuckDB); a query has imported it already.
    from zephon.inspection.views import unique_names

    keys = unique_names(columns)
    objects = [json.dumps(dict(zip(keys, row, strict=True)), ensure_ascii=False, default=_json_value) for row in rows]
    return "[" + ",\n ".join(objects) + "]\n"


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    text = str(value)
    return text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def _json_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


# ---------------------------------------------------------------- options shared by commands over a plan bundle
def batch_size_option(help_text: str) -> Any:
    """``-b/--batch-size``: the global batch in sequences (steps need it)."""
    return click.option("-b", "--batch-size", type=click.IntRange(min=1), default=None, help=help_text)


#: ``--max-length``: tokens per sequence of an estimated token plan.
max_length_option = click.option(
    "--max-length",
    type=click.IntRange(min=1),
    default=None,
    help="Tokens per sequence of an estimated token plan (exact plans fix it).",
)


def format_option(*choices: str, help_text: str = "Output format.") -> Any:
    """``-f/--format`` among ``choices``, the first being the default."""
    return click.option(
        "-f",
        "--format",
        "fmt",
        type=click.Choice(choices),
        default=choices[0],
        show_default=True,
        help=help_text,
    )


def read_errors() -> tuple[type[BaseException], ...]:
    """Errors of reading a bundle's data that its checks at opening cannot see (a damaged data page under an
    intact footer), printed as one line like any other failure. Imported here, when a command runs."""
    import duckdb
    import pyarrow as pa

    return (duckdb.Error, pa.ArrowException)
