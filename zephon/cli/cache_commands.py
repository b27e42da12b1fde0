"""``zephon cache ls | du | prune``: inspect and trim a shard cache directory (``zephon.storage.shard_cache``).

The cache is the one the executor fills from ``CacheOptions(root=...)``; these commands take the same root
and use the cache's own locks, so they are safe while training runs: an entry in use is never pruned. They open
an existing cache only (a directory without the cache's lock file and folders is refused, and nothing is created
in it), and they touch only the cache's own files: entries named by ``entry_name`` and their sidecars.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from zephon.cli.output import one_line_errors
from zephon.storage.shard_cache import ShardCache

ROOT = click.option(
    "--root",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The cache directory (CacheOptions.root).",
)


@click.group(name="cache")
def cache() -> None:
    """Inspect and trim the shard cache that remote shards are downloaded into."""


@cache.command(name="ls")
@ROOT
def ls(root: Path) -> None:
    """List cached shards: size, last access (UTC), in use, key."""

    with one_line_errors():
        entries = ShardCache(root, None, create=False).entries()
    for e in entries:
        when = dt.datetime.fromtimestamp(e.last_access, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        click.echo(f"{e.size:>14}  {when}  {'in use' if e.in_use else 'idle  '}  {e.key}")


@cache.command(name="du")
@ROOT
def du(root: Path) -> None:
    """Print the cache's total size: bytes and entries."""

    with one_line_errors():
        c = ShardCache(root, None, create=False)
        total, count = c.total_bytes(), len(c.entries())
    click.echo(f"{total} bytes in {count} shard{'s' if count != 1 else ''}  {root}")


@cache.command(name="prune")
@ROOT
@click.option(
    "--keep-bytes",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Evict idle shards, least recently used first, until the cache holds at most this many bytes.",
)
def prune(root: Path, keep_bytes: int) -> None:
    """Evict idle shards (never one in use) down to --keep-bytes."""

    with one_line_errors():
        c = ShardCache(root, None, create=False)
        freed = c.prune(keep_bytes=keep_bytes)
        left = c.total_bytes()
    click.echo(f"freed {freed} bytes, {left} bytes left")
