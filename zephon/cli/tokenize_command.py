"""``zephon tokenize``: raw datasets written once as Megatron-compatible token stores, one prefix per shard.

A thin layer over ``zephon.planner.tokenize.run.tokenize_datasets``. The inputs are a CONFIG file (its
``datasets:``, and its ``tokenizer:`` section as the default tokenizer settings) and/or dataset paths: ``PATH``
(the dataset is named after it: ``data/web`` → ``web``, ``demo/prose-*.parquet`` → ``prose``) or ``NAME=PATH``.
``--tokenizer`` / ``--field`` replace the CONFIG's tokenizer id / text field. Prints one summary line and one
line per dataset; exit 1 with one line on any failure (finished stores stay, a rerun resumes).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING

import click

from zephon.cli.output import CommandError, count_of, one_line_errors, warning_lines

if TYPE_CHECKING:
    from zephon.recipe.dataset import Dataset
    from zephon.specs import TokenizeSpec

_CONFIG_SUFFIXES = (".yaml", ".yml", ".toml")
_NAME_THEN_PATH = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9_.\-]*)=(?P<path>.+)$")


@click.command(name="tokenize")
@click.argument("inputs", nargs=-1, required=True, metavar="CONFIG|[NAME=]PATH...")
@click.option(
    "-o", "--output", "out_dir", required=True, type=click.Path(path_type=Path), help="Folder of the token stores."
)
@click.option(
    "--tokenizer",
    "tokenizer_id",
    default=None,
    metavar="TOK",
    help="A tokenizer directory, tokenizer.json or Hub id (default: CONFIG's tokenizer.id).",
)
@click.option("--field", default=None, help="The text column or key (default: CONFIG's tokenizer.field, else text).")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Worker processes (default: all cores).")
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Tokenize in local worker processes, or as Ray tasks (RAY_ADDRESS, else a local Ray instance).",
)
@click.option(
    "--progress/--no-progress", default=None, help="Show a progress bar (default: when stderr is a terminal)."
)
@click.option(
    "--overwrite", is_flag=True, help="Replace stores an earlier run wrote from other input (never your files)."
)
def tokenize(
    inputs: tuple[str, ...],
    out_dir: Path,
    tokenizer_id: str | None,
    field: str | None,
    workers: int | None,
    engine: str,
    progress: bool | None,
    overwrite: bool,
) -> None:
    """Tokenize every document of the datasets once into Megatron .bin/.idx stores under OUT_DIR/<dataset>/.

    One prefix per input shard (OUT_DIR/<dataset>/<shard>), document i = row i, each ending in the EOS the
    executor appends; ids exactly as training encodes them. Readable by megatron-core's IndexedDataset and by
    Zephon's token-store readers. Killed runs resume: finished stores are checked and kept.
    """
    with one_line_errors(), warning_lines():
        datasets, spec = _inputs(inputs, tokenizer_id, field)
        from zephon.planner.tokenize.run import tokenize_datasets

        report = tokenize_datasets(
            datasets, spec, out_dir, workers=workers, engine=engine, progress=progress, overwrite=overwrite
        )
    click.echo(
        f"tokenized {count_of(report.written, 'shard')} ({report.kept} kept) → {out_dir}: "
        f"{count_of(report.documents, 'document')}, {count_of(report.tokens, 'token')}, {report.dtype}"
    )
    width = max(len(d.dataset) for d in report.datasets)
    for d in report.datasets:
        cut = f"  truncated {d.truncated} ({d.truncated_tokens} tokens cut by max_tokens)" if d.truncated else ""
        click.echo(
            f"  {d.dataset:<{width}}  stores {len(d.prefixes)}  documents {d.documents}  tokens {d.tokens}{cut}  "
            f"→ {out_dir / d.dataset}"
        )


def _inputs(inputs: tuple[str, ...], tokenizer_id: str | None, field: str | None) -> tuple[list[Dataset], TokenizeSpec]:
    """The datasets of the CONFIG files and paths, and the tokenizer settings."""
    from zephon.recipe.dataset import Dataset
    from zephon.specs import TokenizeSpec

    datasets: list[Dataset] = []
    spec: TokenizeSpec | None = None
    for item in inputs:
        if item.lower().endswith(_CONFIG_SUFFIXES) and "=" not in item:
            from zephon.config_file import load_plan_config

            loaded = load_plan_config(item)
            datasets.extend(loaded.source.datasets)
            if spec is None:
                spec = loaded.tokenize
            continue
        match = _NAME_THEN_PATH.match(item)
        name, path = (match["name"], match["path"]) if match else (_name_of(item), item)
        datasets.append(Dataset.from_path(name, path))
    if spec is None:
        if tokenizer_id is None:
            raise CommandError(
                "--tokenizer must name a tokenizer, got none (and no tokenizer: in a CONFIG) — pass --tokenizer TOK"
            )
        spec = TokenizeSpec(tokenizer_id=tokenizer_id, field=field or "text")
    else:
        spec = dataclasses.replace(spec, tokenizer_id=tokenizer_id or spec.tokenizer_id, field=field or spec.field)
    return datasets, spec


def _name_of(path: str) -> str:
    """A dataset's name from its path: the last part without its format suffix (a glob: the part before the
    wildcard, else its folder's name; ``hf://…/NAME@REV``: ``NAME``)."""
    from zephon.storage.local import SUPPORTED_SUFFIXES

    parts = [p for p in path.rstrip("/").split("/") if p]
    last = parts[-1] if parts else ""
    if re.search(r"[*?\[]", last):
        last = re.split(r"[*?\[]", last, maxsplit=1)[0].rstrip("-_.") or (parts[-2] if len(parts) > 1 else "")
    last = last.split("@", 1)[0]
    lower = last.lower()
    suffix = next((s for s in SUPPORTED_SUFFIXES if lower.endswith(s)), "")
    name = last[: len(last) - len(suffix)] if suffix else last
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", name):
        raise CommandError(f"dataset path {path!r} must give a dataset name, got {name!r} — pass NAME={path}")
    return name
