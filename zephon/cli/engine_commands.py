"""``zephon engines check``: every installed tokenizer engine against ``tokenizers`` over whole datasets.

A thin layer over ``zephon.inspection.engine_check.check_engines``: the datasets come from a CONFIG file (as
``zephon plan`` reads it; its ``tokenizer:`` section gives the default ``--tokenizer`` and ``--field``) and/or
``--dataset NAME=PATH`` options. Prints one row per engine (table or JSON) and, for each engine that did not
agree or could not load, one line saying why; exit status 0 when every engine that loaded agrees, 1 when any
differs, fails a probe or crashed (or on a one-line error: a missing tokenizer, a missing dataset path).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from zephon.cli.output import CommandError, count_of, format_option, format_table, one_line_errors

if TYPE_CHECKING:
    from zephon.inspection.engine_check import EngineCheck, EngineResult
    from zephon.recipe.dataset import Dataset

COLUMNS = ("engine", "version", "status", "documents", "differing", "M tok/s", "tokenizers M tok/s", "verdict")


@click.group(name="engines")
def engines() -> None:
    """Tokenizer engines: check them against Hugging Face tokenizers on your own data."""


@engines.command(name="check")
@click.argument("config", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--dataset",
    "dataset_options",
    multiple=True,
    metavar="NAME=PATH",
    help="A dataset to read (a directory, glob or file of Parquet/JSONL shards, hf://, s3://...); repeatable.",
)
@click.option(
    "--tokenizer",
    "tokenizer_id",
    default=None,
    metavar="TOK",
    help="A tokenizer directory, tokenizer.json or Hub id (default: CONFIG's tokenizer.id).",
)
@click.option("--field", default=None, help="The text column or key (default: CONFIG's tokenizer.field, else text).")
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N", help="Read at most N documents in all.")
@click.option(
    "--engine",
    "engine_names",
    multiple=True,
    type=click.Choice(["fastokens", "gigatoken", "tiktoken", "kitoken"]),
    help="Check only this engine (repeatable; default: every candidate).",
)
@format_option("table", "json")
def check(
    config: Path | None,
    dataset_options: tuple[str, ...],
    tokenizer_id: str | None,
    field: str | None,
    limit: int | None,
    engine_names: tuple[str, ...],
    fmt: str,
) -> None:
    """Encode every document of the datasets with tokenizers and with every installed engine; report per
    engine the documents that differ (and the first one), tokens/s on one thread, and the verdict cached for
    the run's engine choice (docs/performance.md, Tokenizer engines)."""
    from zephon.inspection.engine_check import check_engines

    with one_line_errors():
        datasets, default_tokenizer, default_field = _inputs(config, dataset_options)
        tokenizer = tokenizer_id or default_tokenizer
        if tokenizer is None:
            raise CommandError("--tokenizer must name a tokenizer, got none (and no tokenizer: in CONFIG) — pass one")
        result = check_engines(
            datasets,
            tokenizer,
            text_field=field or default_field or "text",
            limit=limit,
            engines=engine_names or None,
        )
    click.echo(_json(result) if fmt == "json" else _table(result), nl=False)
    bad = [e.engine for e in result.engines if not e.ok]
    if bad:
        line = f"zephon: {count_of(len(bad), 'engine')} differing from tokenizers or crashed: {', '.join(bad)}"
        click.echo(line, err=True)
        raise SystemExit(1)


def _inputs(config: Path | None, options: tuple[str, ...]) -> tuple[list[Dataset], str | None, str | None]:
    """The datasets of CONFIG and of ``--dataset NAME=PATH``, and CONFIG's tokenizer id and field."""
    from zephon.recipe.dataset import Dataset

    datasets: list[Dataset] = []
    tokenizer = field = None
    if config is not None:
        from zephon.config_file import load_plan_config

        loaded = load_plan_config(config)
        datasets.extend(loaded.source.datasets)
        if loaded.tokenize is not None:
            tokenizer, field = loaded.tokenize.tokenizer_id, loaded.tokenize.field
    for option in options:
        name, sep, path = option.partition("=")
        if not sep or not name or not path:
            raise CommandError(f"--dataset must be NAME=PATH, got {option!r} — write e.g. --dataset web=data/web")
        datasets.append(Dataset.from_path(name, path))
    if not datasets:
        raise CommandError("datasets must be given, got none — pass a CONFIG file or --dataset NAME=PATH")
    return datasets, tokenizer, field


def _rate(value: float | None) -> float | None:
    return None if value is None else round(value / 1e6, 2)


def _table(result: EngineCheck) -> str:
    rows = [
        (
            e.engine,
            e.version or "-",
            e.status,
            e.documents,
            e.differing,
            _rate(e.tokens_per_s),
            _rate(e.reference_tokens_per_s),
            e.verdict,
        )
        for e in result.engines
    ]
    head = (
        f"{count_of(result.documents, 'document')}, {count_of(result.tokens, 'token')} compared with tokenizers "
        f"(one thread each) for {result.tokenizer}\n"
    )
    notes = "".join(_note(e) for e in result.engines)
    return head + format_table(COLUMNS, rows) + notes


def _note(e: EngineResult) -> str:
    out = f"{e.engine}: {e.reason}\n" if e.reason else ""
    f = e.first
    if f is not None:
        out += (
            f"{e.engine}: first difference: dataset {f.dataset!r}, shard {f.shard}, row {f.row}, token {f.position}: "
            f"tokenizers {_ids(f.expected)}, {e.engine} {_ids(f.got)}, text from there {f.excerpt!r}\n"
        )
    return out


def _ids(ids: tuple[int, ...] | None) -> str:
    from zephon.inspection.engine_check import SHOWN_IDS

    if ids is None:
        return "raised"
    return "[" + ", ".join(map(str, ids)) + (", ...]" if len(ids) == SHOWN_IDS else "]")


def _json(result: EngineCheck) -> str:
    data = dataclasses.asdict(result)
    data["ok"] = result.ok
    return json.dumps(data, ensure_ascii=False, indent=1) + "\n"
