"""The ``zephon`` command line: a thin layer over ``zephon.config_file``, the planner and ``zephon.sql``.

Commands (documented in docs/cli.md)::

    zephon plan CONFIG -o PLAN_DIR [--overwrite]
    zephon sql PLAN_DIR QUERY [--format table|csv|json|parquet] [--param NAME=VALUE ...] [-o FILE]
                              [--batch-size B] [--max-length L]
    zephon show / audit / diff    (zephon.cli_inspect)

Expected failures (a ``ZephonError``, a DuckDB error in ``sql``, an OS error) print one line
``zephon: error: <message>`` to stderr and exit 1; usage errors exit 2 with click's usage message.
Library modules are imported inside the commands so that ``zephon --help`` stays fast.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import click

from zephon.errors import ZephonError

__all__ = ["CommandError", "cli", "format_csv", "format_json", "format_table", "main", "param_value", "plan_summary"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class CommandError(click.ClickException):
    """An expected failure: printed as ``zephon: error: <message>`` on one line, exit status 1."""

    exit_code = 1

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"zephon: error: {self.format_message()}", file=file, err=file is None)


@contextmanager
def _one_line_errors(*extra: type[BaseException]) -> Iterator[None]:
    """Turn expected exceptions into a ``CommandError`` whose message is a single line."""
    try:
        yield
    except (ZephonError, OSError, *extra) as exc:
        raise CommandError(_one_line(str(exc) or type(exc).__name__)) from exc


def _one_line(message: str) -> str:
    # DuckDB messages span lines ("...\n\nLINE 1: SELEC 1\n        ^^^^^"); keep the words, drop the caret line.
    lines = [line.strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line and set(line) != {"^"})


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="zephon", prog_name="zephon", message="%(prog)s %(version)s")
def cli() -> None:
    """Zephon: plan a training-data curriculum once, inspect it with SQL, stream it as token batches."""


def main() -> None:
    """Entry point of the ``zephon`` console script."""
    cli.main(prog_name="zephon")


# ----------------------------------------------------------------------------------------------------
# zephon plan
# ----------------------------------------------------------------------------------------------------


@cli.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    metavar="PLAN_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write the plan bundle to (created; must be new or empty unless --overwrite).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing non-empty PLAN_DIR.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Count-pass processes (exact plans).")
def plan(config: Path, output: Path, overwrite: bool, workers: int | None) -> None:
    """Plan the work source in CONFIG and write the bundle to PLAN_DIR.

    CONFIG is a .yaml, .yml or .toml file (see docs/cli.md); relative dataset paths in it resolve against
    its directory. Prints a summary line and one line per dataset: its normalized weight, planned documents
    and passes (planned documents / rows).
    """
    from zephon.config_file import load_plan_config
    from zephon.plan_format import read_manifest

    with _one_line_errors():
        loaded = load_plan_config(config)
        # Imported after the CONFIG is valid: the planner pulls in heavy modules, and errors should be quick.
        from zephon.planner.build import write_plan

        write_plan(
            loaded.source,
            output,
            tokenize=loaded.tokenize,
            pack=loaded.pack,
            overwrite=overwrite,
            workers=workers,
            progress=sys.stderr.isatty(),
        )
        manifest = read_manifest(output)
    for line in plan_summary(manifest, str(output)):
        click.echo(line)


def plan_summary(manifest: dict[str, Any], plan_dir: str) -> list[str]:
    """The lines ``zephon plan`` prints for a bundle's manifest (names and numbers aligned in columns)."""
    datasets = manifest["datasets"]
    totals = manifest["totals"]
    lines = [
        f"planned {_count(totals['documents'], 'document')} from {_count(len(datasets), 'dataset')} "
        f"({_count(totals['shards'], 'shard')}) → {plan_dir}  config {manifest['config_hash'][:12]}"
    ]
    names = [d["name"] for d in datasets]
    docs = [str(d["planned_documents"]) for d in datasets]
    passes = [f"{d['planned_documents'] / d['rows']:.2f}" for d in datasets]
    name_w, docs_w, pass_w = (max(map(len, col)) for col in (names, docs, passes))
    for d, name, n, p in zip(datasets, names, docs, passes, strict=True):
        line = f"  {name:<{name_w}}  weight {d['weight']:.3f}  documents {n:>{docs_w}}  passes {p:>{pass_w}}"
        if "planned_tokens" in d:
            line += f"  tokens {d['planned_tokens']} ({totals['tokens_are']}, share {d['planned_token_share']:.3f})"
        lines.append(line)
    for phase in manifest.get("phases") or []:
        weights = ", ".join(f"{name} {w:.3f}" for name, w in phase["weights"].items())
        span = f"positions {phase['first_position']}..{phase['end_position'] - 1}"
        if phase["end_position"] <= phase["first_position"]:
            span = "no documents (the plan ended before it)"
        lines.append(f"  phase {phase['index']}: {span}, {_count(phase['documents'], 'document')}; {weights}")
    return lines


# ----------------------------------------------------------------------------------------------------
# zephon count
# ----------------------------------------------------------------------------------------------------


@cli.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Worker processes (default: all cores).")
@click.option(
    "--progress/--no-progress", default=None, help="Show a progress bar (default: when stderr is a terminal)."
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Count in local worker processes, or as Ray tasks (RAY_ADDRESS, else a local Ray instance).",
)
def count(config: Path, workers: int | None, progress: bool | None, engine: str) -> None:
    """Tokenize every document of CONFIG's datasets once and cache exact token counts.

    Counts are cached per (shard fingerprint, field, tokenizer fingerprint) under $ZEPHON_CACHE_DIR, so exact
    plans (`exact_tokens: true`) and reruns reuse them. CONFIG needs a `tokenizer:` section. Prints the
    shards counted now and found cached, and the tokens per dataset.
    """
    from zephon.config_file import load_plan_config

    with _one_line_errors():
        loaded = load_plan_config(config)
        if loaded.tokenize is None:
            raise CommandError(
                f"{config}: `tokenizer` must be set to count tokens, got nothing — add `tokenizer: {{id: ...}}`"
            )
        from zephon.executor.tokenize import Encoder
        from zephon.planner.prepare import shard_refs
        from zephon.planner.token_lengths import token_counts

        groups = shard_refs(loaded.source)
        flat = [r for g in groups for r in g]
        arrays, report = token_counts(
            flat,
            loaded.tokenize,
            Encoder(loaded.tokenize),
            workers=workers,
            progress=sys.stderr.isatty() if progress is None else progress,
            engine=engine,
        )
    click.echo(f"counted {_count(report.counted, 'shard')} ({report.cached} cached): {report.tokens} tokens")
    it = iter(arrays)
    names = [ds.name for ds in loaded.source.datasets]
    width = max(map(len, names))
    for name, group in zip(names, groups, strict=True):
        tokens = sum(int(next(it).sum()) for _ in group)
        click.echo(f"  {name:<{width}}  documents {sum(r.rows for r in group)}  tokens {tokens}")


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# ----------------------------------------------------------------------------------------------------
# zephon sql
# ----------------------------------------------------------------------------------------------------


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


@cli.command()
@click.argument("plan_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("query")
@click.option(
    "-f",
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json", "parquet"]),
    default="table",
    show_default=True,
    help="Output format; parquet needs -o FILE.",
)
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
@click.option(
    "-b",
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Global batch in sequences: adds the views steps and step_documents(n).",
)
@click.option(
    "--max-length",
    type=click.IntRange(min=1),
    default=None,
    help="Tokens per sequence of an estimated token plan (exact plans fix it).",
)
def sql(
    plan_dir: Path,
    query: str,
    fmt: str,
    params: dict[str, Any],
    output: Path | None,
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
    import duckdb

    from zephon.inspect_views import query_table, run_query

    if fmt == "parquet" and output is None:
        raise click.BadParameter(
            "parquet output must go to a file, got no -o/--output — add -o FILE", param_hint="'--format'"
        )
    if query == "-":
        query = sys.stdin.read()
    if not query.strip():
        raise click.BadParameter("must be a SQL statement, got an empty query", param_hint="'QUERY'")
    with _one_line_errors(duckdb.Error):
        if fmt == "parquet":
            import pyarrow.parquet as pq

            assert output is not None
            table = query_table(plan_dir, query, params or None, batch_size=batch_size, max_length=max_length)
            if table is None:
                raise CommandError(
                    "the last statement must return rows to write Parquet, got a statement without a result — "
                    "end QUERY with a SELECT"
                )
            pq.write_table(table, output)
            click.echo(f"wrote {_count(table.num_rows, 'row')} ({_count(table.num_columns, 'column')}) to {output}")
            return
        columns, rows = run_query(plan_dir, query, params or None, batch_size=batch_size, max_length=max_length)
        if not columns:
            return
        formatter = {"csv": format_csv, "json": format_json, "table": format_table}[fmt]
        text = formatter(columns, rows)
        if output is None:
            click.echo(text, nl=False)
        else:
            output.write_text(text, encoding="utf-8")


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned text table: header, a line of dashes, rows; numeric columns right-aligned, NULL as ``NULL``."""
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [
        any(row[i] is not None for row in rows) and all(row[i] is None or _is_number(row[i]) for row in rows)
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
    keys: list[str] = []
    for name in columns:
        key, n = name, 0
        while key in keys:
            n += 1
            key = f"{name}_{n}"
        keys.append(key)
    objects = [json.dumps(dict(zip(keys, row, strict=True)), ensure_ascii=False, default=_json_value) for row in rows]
    return "[" + ",\n ".join(objects) + "]\n"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


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


from zephon.cli_cache import cache  # noqa: E402  (registered after the core commands)
from zephon.cli_inspect import audit, diff, show  # noqa: E402

cli.add_command(show)
cli.add_command(audit)
cli.add_command(diff)
cli.add_command(cache)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
