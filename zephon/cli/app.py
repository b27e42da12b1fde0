"""The ``zephon`` command group: a thin layer over library functions that notebooks and users call directly.

Commands (documented in docs/cli.md), each in its own module::

    zephon plan CONFIG -o PLAN_DIR [--overwrite]          zephon.cli.plan_commands
    zephon count CONFIG                                   zephon.cli.plan_commands
    zephon sql PLAN_DIR QUERY [--format ...] [-o FILE]    zephon.cli.sql_command
    zephon show / audit                                   zephon.cli.inspect_commands
    zephon diff                                           zephon.cli.diff_command
    zephon cache ls / du / prune                          zephon.cli.cache_commands
    zephon engines check [CONFIG] --tokenizer TOK         zephon.cli.engine_commands
    zephon tokenize CONFIG|PATHS -o OUT_DIR               zephon.cli.tokenize_command

Shared options, one-line errors and table formatting are in ``zephon.cli.output``. Library modules are
imported inside the commands so that ``zephon --help`` stays fast.
"""

from __future__ import annotations

import sys

import click

from zephon.cli.cache_commands import cache
from zephon.cli.diff_command import diff
from zephon.cli.engine_commands import engines
from zephon.cli.inspect_commands import audit, show
from zephon.cli.plan_commands import count, plan
from zephon.cli.sql_command import sql
from zephon.cli.tokenize_command import tokenize

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="zephon", prog_name="zephon", message="%(prog)s %(version)s")
def cli() -> None:
    """Zephon: plan a training-data curriculum once, inspect it with SQL, stream it as token batches."""


for _command in (plan, count, tokenize, sql, show, audit, diff, cache, engines):
    cli.add_command(_command)


def main() -> None:
    """Entry point of the ``zephon`` console script."""
    cli.main(prog_name="zephon")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
