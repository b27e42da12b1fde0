"""The shard cache touches only its own files: ``zephon cache ls | du | prune`` aimed at the wrong directory
create and delete nothing, and a user's files inside a real cache are never listed, counted or pruned."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from zephon.cli import cli
from zephon.storage.shard_cache import ShardCache
from zephon.storage.shard_cache_lock import CacheLayout, entry_name


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in root.rglob("*")
    }


@pytest.mark.parametrize("command", [["ls"], ["du"], ["prune", "--keep-bytes", "0"]])
def test_cache_commands_on_a_directory_that_is_not_a_cache_change_nothing(command, make_parquet) -> None:
    data = make_parquet("web", [5, 3])
    (data / "shards").mkdir()
    (data / "shards" / "mine.parquet").write_bytes(b"user data")
    before = _tree(data)
    result = CliRunner().invoke(cli, ["cache", *command, "--root", str(data)])
    assert result.exit_code == 1
    assert result.output == (
        f"zephon: error: cache root must be a shard cache (a directory with zephon-cache.lock, shards/, meta/, "
        f"locks/ and tmp/), got {data} — pass the CacheOptions.root the executor used; nothing was created\n"
    )
    assert _tree(data) == before


def test_a_users_files_inside_a_cache_are_not_listed_counted_or_pruned(tmp_path) -> None:
    root = tmp_path / "cache"
    ShardCache(root, None).close()  # an empty cache, as the executor makes it
    layout = CacheLayout(root)
    ours = entry_name("hf/org/ds/abc/train/000.parquet")
    (layout.shards / ours).write_bytes(b"x" * 100)
    (layout.meta(ours)).write_text(
        '{"format": 1, "key": "hf/org/ds/abc/train/000.parquet", "size": 100, "etag": "e"}', encoding="utf-8"
    )
    theirs = {
        layout.shards / "mine.parquet": b"y" * 1000,
        layout.meta_dir / "notes.json": b"{}",
        layout.tmp / "draft.txt": b"z",
        layout.tmp / "x.7.part": b"not an entry's download",
    }
    for path, data in theirs.items():
        path.write_bytes(data)
    runner = CliRunner()
    listed = runner.invoke(cli, ["cache", "ls", "--root", str(root)])
    assert listed.exit_code == 0
    assert [line.split()[-1] for line in listed.output.splitlines()] == ["hf/org/ds/abc/train/000.parquet"]
    du = runner.invoke(cli, ["cache", "du", "--root", str(root)])
    assert du.output == f"100 bytes in 1 shard  {root}\n"
    pruned = runner.invoke(cli, ["cache", "prune", "--root", str(root), "--keep-bytes", "0"])
    assert pruned.output == "freed 100 bytes, 0 bytes left\n"
    assert not (layout.shards / ours).exists()
    for path, data in theirs.items():
        assert path.read_bytes() == data
