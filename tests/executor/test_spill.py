"""Decoded row groups past ``ZEPHON_DECODED_MEMORY`` kept in files, mapped (``zephon.executor.read.spill``): the
reader's own memory for decoded text stays within the budget, the batches never change, and the files go with the
reader — and only ours."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import batches_per_setting

from zephon.errors import ConfigError, ZephonWarning
from zephon.executor.read import spill
from zephon.executor.read.shard_reader import ShardReader
from zephon.io import Dataset
from zephon.plan.records import ShardRef
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def shard(path, shard_id: int, rows: int = 4000, size: int = 300) -> ShardRef:
    """A Parquet shard of ``rows`` texts of ``size`` characters in row groups of 1,000 rows (~300 KB each)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    texts = [f"{shard_id}:{r:05d} " + "abcdefghij" * ((size - 9) // 10) for r in range(rows)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=1000)
    return ShardRef(shard_id=shard_id, dataset_id=0, dataset="web", uri=str(path), format="parquet", rows=rows,
                    bytes=path.stat().st_size, fingerprint="")  # fmt: skip


def test_row_groups_past_the_budget_are_files_mapped_and_go_with_the_reader(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(spill.BUDGET_ENV, "700KiB")
    (tmp_path / "spill").mkdir()
    monkeypatch.setenv(spill.DIR_ENV, str(tmp_path / "spill"))
    monkeypatch.setattr(spill, "_warned", set())  # the warning comes once a process
    refs = [shard(tmp_path / "web" / f"part-{i}.parquet", i) for i in range(2)]
    reader = ShardReader(refs, "text", capacity=2)
    rows = np.array([10, 1500, 2500, 3500, 20, 1600, 2600, 3600])
    ids = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    with pytest.warns(ZephonWarning, match="kept in files under .*spill/zephon-decoded-"):
        got = reader.texts(ids, rows)
    assert [t.split(" ")[0] for t in got] == [f"{s}:{r:05d}" for s, r in zip(ids, rows, strict=True)]
    held = reader._spill
    assert held is not None and held.directory is not None
    assert 0 < held.held <= 700 << 10  # two row groups of ~300 KB in memory, the budget kept
    assert held.spilled > 1 << 20  # the other six in files
    files = sorted(os.listdir(held.directory))
    assert len(files) == 6 and all(f.endswith(".arrow") for f in files)
    assert reader.texts(np.array([1]), np.array([3601])) == [f"1:03601 {'abcdefghij' * 29}"]  # read from a file
    directory = held.directory
    reader.close()
    assert not os.path.exists(directory) and held.held == 0 and held.spilled == 0


def test_a_budget_never_changes_a_batch(tmp_path, make_parquet, tokenizer_dir, monkeypatch) -> None:
    (tmp_path / "spill").mkdir()
    monkeypatch.setenv(spill.DIR_ENV, str(tmp_path / "spill"))
    monkeypatch.setattr(spill, "_warned", set())  # the warning comes once a process
    data = make_parquet("web", [1500, 1500, 1500], row_group_size=150)
    source = StaticMixtureWorkSource(datasets=[Dataset.from_path("web", str(data))], mixture=MixtureSpec({"web": 1}), seed=3)
    plan = source.plan(tmp_path / "plan")
    with pytest.warns(ZephonWarning, match="ZEPHON_DECODED_MEMORY"):
        runs = batches_per_setting(monkeypatch, plan, tokenizer_dir, spill.BUDGET_ENV, ("off", "20KiB"))
    assert runs[0] == runs[1] and runs[0]
    assert os.listdir(tmp_path / "spill") == []  # every run's directory removed with its reader


def test_the_budget_setting_and_its_default(monkeypatch) -> None:
    for value, want in (("2GiB", 2 << 30), ("512mib", 512 << 20), ("1000000", 1_000_000), ("1.5G", 1_500_000_000), ("1.5GiB", 3 << 29)):
        monkeypatch.setenv(spill.BUDGET_ENV, value)
        assert spill.budget() == want
    monkeypatch.setenv(spill.BUDGET_ENV, "off")
    assert spill.budget() is None and spill.Spill.from_env() is None
    monkeypatch.setenv(spill.BUDGET_ENV, "lots")
    with pytest.raises(ConfigError, match=r"^ZEPHON_DECODED_MEMORY must be a size such as 2GiB .*got 'lots'"):
        spill.budget()
    monkeypatch.delenv(spill.BUDGET_ENV)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    one = spill.budget()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    two = spill.default_budget()
    assert one is not None and one >= spill.MIN_BUDGET
    assert two == spill.MIN_BUDGET or abs(two - one // 2) <= 1  # a quarter of the memory, shared by 2 ranks


def test_no_room_on_disk_keeps_the_row_group_in_memory_and_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(spill, "free_bytes", lambda path: 1 << 20)
    monkeypatch.setattr(spill, "_warned", set())
    keeper = spill.Spill(0, str(tmp_path / "spill"))
    column = pa.array(["a" * 1000] * 10)
    with pytest.warns(ZephonWarning, match=r"1024 MiB left free there beside twice the row group, got 1 MiB free — "):
        kept = keeper.keep(0, 0, column)
    assert kept is column and keeper.held == column.nbytes and keeper.spilled == 0


def test_only_the_row_group_files_of_this_machines_dead_processes_are_removed(tmp_path, monkeypatch) -> None:
    """A process killed mid-run leaves its spill directory; the next spill removes its row group files and then
    the directory — and nothing else: not a file a spill did not write, not another machine's directory (a spill
    root on a shared file system), not a name that only looks like ours."""
    from zephon.executor.read.shared_groups import pid_namespace

    root = tmp_path / "spill"
    dead = 2**22 + 12345  # above any PID this machine hands out
    here = f"zephon-decoded-{spill._host()}-{pid_namespace()}"
    names = {
        "dead": f"{here}-{dead}-abcd1234",
        "dead, with a file of its owner's": f"{here}-{dead}-efgh5678",
        "alive": f"{here}-{os.getpid()}-abcd1234",
        "another machine": f"zephon-decoded-elsewhere-{pid_namespace()}-{dead}-abcd1234",
        "another namespace": f"zephon-decoded-{spill._host()}-1-{dead}-abcd1234",
        "a look-alike": f"{here}-{dead}-my data",
        "not ours": f"data-{dead}",
    }
    for name in names.values():
        (root / name).mkdir(parents=True)
        (root / name / "3-1.arrow").write_bytes(b"x")
    (root / names["dead, with a file of its owner's"] / "precious.txt").write_text("x")
    assert spill.remove_spills_of([dead + 1]) == 0  # the loader's: its workers' PIDs only
    keeper = spill.Spill(0, str(root))
    monkeypatch.setattr(spill, "_warned", {"spill"})  # (said once a process: not again here)
    keeper.keep(0, 0, pa.array(["x" * 100]))
    left = set(os.listdir(root))
    assert names["dead"] not in left
    kept = root / names["dead, with a file of its owner's"]
    assert sorted(os.listdir(kept)) == ["precious.txt"]  # the row group file went, the rest stayed
    for name in ("alive", "another machine", "another namespace", "a look-alike", "not ours"):
        assert (root / names[name] / "3-1.arrow").exists(), name
    own = os.path.basename(keeper.directory or "")
    assert own in left
    keeper.close()
    assert set(os.listdir(root)) == left - {own}


def test_a_dataloader_workers_default_budget_is_its_share_of_the_ranks(monkeypatch) -> None:
    """Each DataLoader worker is a process reading (and decoding) its own shards: by default the rank's budget is
    split among them, so a rank's workers together hold no more than the rank would."""
    from zephon.executor import cores

    monkeypatch.delenv(spill.BUDGET_ENV, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    rank = spill.default_budget()
    monkeypatch.setattr(cores, "_workers", [4])
    assert abs(spill.default_budget() - max(spill.MIN_BUDGET, rank // 4)) <= 1


def test_a_mistyped_spill_dir_is_never_made_and_the_default_one_goes_when_empty(tmp_path, monkeypatch) -> None:
    """``ZEPHON_SPILL_DIR`` must exist: a mistyped path is not created (the row group stays in memory, with a
    warning); the default root, made when first needed, is removed with the directory in it when that leaves it
    empty — a run, or a read-only command such as ``zephon show``, leaves nothing behind."""
    column = pa.array(["x" * 100])
    missing = tmp_path / "typo" / "deeper"
    monkeypatch.setenv(spill.DIR_ENV, str(missing))
    monkeypatch.setattr(spill, "_warned", set())
    keeper = spill.Spill(0, spill.spill_root())
    with pytest.warns(ZephonWarning, match=r"ZEPHON_SPILL_DIR must be an existing directory, got .*typo/deeper"):
        assert keeper.keep(0, 0, column) is column
    keeper.close()
    assert not (tmp_path / "typo").exists()
    monkeypatch.delenv(spill.DIR_ENV)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(spill.tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.setattr(spill, "_warned", {"spill"})
    if spill._file_system(str(tmp_path)) in ("tmpfs", "ramfs"):
        pytest.skip("the temporary directory is memory here: the default root is the cache's")
    keeper = spill.Spill(0, spill.spill_root())
    assert keeper.root == str(tmp_path / "tmp" / "zephon-decoded")
    assert keeper.keep(0, 0, column) is not column  # a mapped file
    keeper.close()
    assert not os.path.exists(keeper.root)
