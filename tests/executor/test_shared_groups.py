"""Decoded row groups shared by a rank's DataLoader workers (``zephon.executor.read.shared_groups``): one process
claims and decodes, the others map its file; every failure (no room, a claimant that died, a corrupt row group)
leaves each reader decoding for itself with the same texts and errors; the loader's directory goes with it."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon.errors import ConfigError, DatasetError
from zephon.executor.read.shard_reader import ShardReader
from zephon.executor.read.shared_groups import (
    SharedRowGroups,
    make_share_directory,
    remove_share_directory,
    share_enabled,
)
from zephon.plan.records import ShardRef


def shard(tmp_path: Path, rows: int = 300, group: int = 50) -> ShardRef:
    """A Parquet shard of distinct texts (every 7th null) in row groups of ``group`` rows."""
    path = tmp_path / "web" / "part-0.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    texts = [None if r % 7 == 3 else f"document {r} " + "word " * (r % 13) for r in range(rows)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=group)
    return ShardRef(shard_id=3, dataset_id=0, dataset="web", uri=str(path), format="parquet", rows=rows,
                    bytes=path.stat().st_size, fingerprint="")  # fmt: skip


def expected(rows: np.ndarray) -> list[str | None]:
    return [None if r % 7 == 3 else f"document {r} " + "word " * (r % 13) for r in rows.tolist()]


def reader(ref: ShardRef, share: SharedRowGroups | None) -> ShardReader:
    r = ShardReader([ref], "text", capacity=1, on_bad_document="skip")
    if share is not None:
        r.attach_share(share)
    return r


def texts(r: ShardReader, rows: np.ndarray) -> list[str | None]:
    return r.texts(np.full(len(rows), 3, np.int64), rows)


COLUMN = pa.array(["a", None, "ccc"])


def test_one_process_claims_the_others_map_what_it_published(tmp_path) -> None:
    a, b = SharedRowGroups(str(tmp_path)), SharedRowGroups(str(tmp_path))
    assert a.get(3, 0) is None
    fd = a.claim(3, 0)
    assert fd is not None
    assert b.claim(3, 0) is None and a.claim(3, 0) is None  # one claim, whoever asks (threads of a too)
    a.publish(3, 0, fd, COLUMN)
    got = b.get(3, 0)
    assert got is not None and got.equals(COLUMN)
    assert a.counts == {"decoded": 1, "mapped": 0, "unshared": 0}
    assert b.counts == {"decoded": 0, "mapped": 1, "unshared": 0}
    assert sorted(os.listdir(tmp_path)) == ["3-0.arrow", "3-0.claim"]  # no lock or temporary file left
    a.forget(3)
    assert os.listdir(tmp_path) == [] and got.to_pylist() == ["a", None, "ccc"]  # the mapped copy stays valid


def test_a_waiter_returns_when_the_claimant_publishes(tmp_path) -> None:
    a, b = SharedRowGroups(str(tmp_path)), SharedRowGroups(str(tmp_path))
    fd = a.claim(3, 1)
    assert fd is not None
    got: list[pa.Array | None] = []
    waiter = threading.Thread(target=lambda: got.append(b.wait(3, 1)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not got  # held by the claim's lock, not polling an absent file
    a.publish(3, 1, fd, COLUMN)
    waiter.join()
    assert got[0] is not None and got[0].equals(COLUMN)


def test_a_claimant_that_dies_releases_its_waiters(tmp_path) -> None:
    child = os.fork()
    if child == 0:  # claims, then dies without publishing (a killed worker)
        fd = SharedRowGroups(str(tmp_path)).claim(3, 2)
        os._exit(0 if fd is not None else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    b = SharedRowGroups(str(tmp_path))
    assert b.wait(3, 2) is None  # the kernel dropped the dead claimant's lock: the caller decodes it itself


def test_without_room_nothing_is_published_and_the_waiters_decode(tmp_path) -> None:
    a = SharedRowGroups(str(tmp_path), margin=1 << 62)  # more than any /dev/shm has free
    b = SharedRowGroups(str(tmp_path))
    fd = a.claim(3, 0)
    assert fd is not None
    a.publish(3, 0, fd, COLUMN)
    assert a.closed and a.counts["unshared"] == 1 and a.claim(3, 1) is None  # publishes nothing more
    assert b.wait(3, 0) is None and os.listdir(tmp_path) == []  # claim removed: b decodes it itself
    fd = b.claim(3, 0)
    assert fd is not None  # and may publish it, having room
    b.publish(3, 0, fd, COLUMN)
    assert a.get(3, 0) is not None  # a still maps what others publish


def test_two_readers_of_one_shard_decode_each_row_group_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ZEPHON_DECODE_THREADS", "1")
    ref = shard(tmp_path)
    share_dir = tmp_path / "share"
    share_dir.mkdir()
    first, second = SharedRowGroups(str(share_dir)), SharedRowGroups(str(share_dir))
    r1, r2 = reader(ref, first), reader(ref, second)
    rows = np.random.default_rng(4).permutation(300)[:120]
    assert texts(r1, rows[:60]) == expected(rows[:60])
    assert texts(r2, rows) == expected(rows)  # maps what r1 decoded, decodes (and publishes) the rest
    assert first.counts["decoded"] + second.counts["decoded"] == 6  # 6 row groups, each decoded once
    assert second.counts["mapped"] == first.counts["decoded"] > 0
    assert texts(r1, rows) == expected(rows)  # r1's own and r2's published groups
    assert first.counts["mapped"] == second.counts["decoded"]
    r1.close()  # closing the shard unlinks what r1 published; r2 still holds its mapped copies
    assert texts(r2, rows[::-1].copy()) == expected(rows[::-1])
    r2.close()
    assert os.listdir(share_dir) == []


def test_a_lone_reader_maps_what_was_published_and_decodes_the_rest_without_claiming(tmp_path) -> None:
    """A lone worker (``num_workers=1``, ``closed`` from its start): the loader's published row groups mapped; the
    others decoded on the decode pool as without a share — no claim, no publish, no wait."""
    ref = shard(tmp_path)
    share_dir = tmp_path / "share"
    share_dir.mkdir()
    loader = SharedRowGroups(str(share_dir))
    first = reader(ref, None)  # the loader's calibration: row groups 0 and 1 decoded, then published
    assert texts(first, np.arange(0, 100)) == expected(np.arange(0, 100))
    assert first.publish_decoded(loader) == 2
    lone = SharedRowGroups(str(share_dir), closed=True)
    assert lone.claim(3, 4) is None
    r = reader(ref, lone)
    rows = np.arange(300)[::-1].copy()
    assert texts(r, rows) == expected(rows)
    assert lone.counts == {"decoded": 0, "mapped": 2, "unshared": 4}  # the other 4 decoded here, published by none
    assert sorted(os.listdir(share_dir)) == ["3-0.arrow", "3-0.claim", "3-1.arrow", "3-1.claim"]  # the loader's
    r.close()
    loader.forget_all()
    assert os.listdir(share_dir) == []


def test_a_corrupt_row_group_raises_the_error_of_a_reader_without_a_share(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ZEPHON_DECODE_THREADS", "1")
    ref = shard(tmp_path)
    path = Path(ref.uri)
    data = bytearray(path.read_bytes())
    for g in (4, 2):  # two corrupt row groups: the first in order, 2, is the one reported
        offset = pq.ParquetFile(path).metadata.row_group(g).column(0).data_page_offset
        data[offset : offset + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    share_dir = tmp_path / "share"
    share_dir.mkdir()
    other = SharedRowGroups(str(share_dir))
    fd = other.claim(3, 2)  # another worker holds row group 2's claim, then gives it up (its decode failed)
    assert fd is not None
    other.abandon(3, 2, fd)
    r = reader(ref, SharedRowGroups(str(share_dir)))
    with pytest.raises(DatasetError, match=r"row group 2 \(rows 100-149\) must decode, got .* the file is corrupt"):
        texts(r, np.arange(300)[::-1].copy())
    assert texts(r, np.array([5, 60])) == expected(np.array([5, 60]))  # the good row groups still read
    r.close()


def test_the_loaders_directory_and_its_removal(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("ZEPHON_SHARE_ROW_GROUPS", raising=False)
    assert share_enabled()
    directory = make_share_directory()
    if directory is None:
        pytest.skip("no writable /dev/shm here")
    Path(directory, "1-0.arrow").write_bytes(b"x")
    remove_share_directory(directory)
    assert not os.path.exists(directory)
    mine = tmp_path / "zephon-rowgroups-data"  # a user's folder of that name elsewhere: never removed
    mine.mkdir()
    remove_share_directory(str(mine))
    assert mine.exists()
    monkeypatch.setenv("ZEPHON_SHARE_ROW_GROUPS", "off")
    assert make_share_directory() is None
    monkeypatch.setenv("ZEPHON_SHARE_ROW_GROUPS", "maybe")
    with pytest.raises(ConfigError, match='ZEPHON_SHARE_ROW_GROUPS must be "on" or "off", got \'maybe\''):
        share_enabled()


def test_a_calibrations_decoded_row_groups_are_published_for_the_workers(tmp_path) -> None:
    """The loader's process publishes what its ``num_steps()`` decoded (``ShardReader.publish_decoded``): a
    worker's reader maps those row groups instead of decoding them, and gets the same texts."""
    ref = shard(tmp_path)
    calibrated = reader(ref, None)
    first = np.arange(0, 120, 3)  # rows of row groups 0-2
    assert texts(calibrated, first) == expected(first)
    directory = tmp_path / "share"
    directory.mkdir()
    loader = SharedRowGroups(str(directory))
    assert calibrated.publish_decoded(loader) == 3
    assert calibrated.publish_decoded(SharedRowGroups(str(directory))) == 0  # claimed already: never twice
    worker = SharedRowGroups(str(directory))
    w = reader(ref, worker)
    rows = np.arange(0, 300, 5)  # row groups 0-5: 0-2 published, 3-5 this worker's own
    assert texts(w, rows) == expected(rows)
    assert worker.counts == {"decoded": 3, "mapped": 3, "unshared": 0}
    loader.forget_all()  # what the loader does once every worker has handed over its first item
    assert sorted(os.listdir(directory)) == [f"3-{g}.{kind}" for g in (3, 4, 5) for kind in ("arrow", "claim")]
    assert texts(w, rows) == expected(rows)  # the worker's mapped copies stay valid


def test_a_directory_left_by_a_loader_that_no_longer_runs_is_removed_by_the_next(monkeypatch) -> None:
    """A loader's process ended by SIGTERM (preemption, a scheduler, ``timeout``) or SIGKILL left its
    ``/dev/shm/zephon-rowgroups-*`` behind, with whatever its workers had published. The next loader's directory
    is made after removing those of this namespace's processes that no longer run — nothing else."""
    import subprocess
    import sys

    from zephon.executor.read.shared_groups import pid_namespace

    monkeypatch.delenv("ZEPHON_SHARE_ROW_GROUPS", raising=False)
    probe = make_share_directory()
    if probe is None:
        pytest.skip("no writable /dev/shm here")
    remove_share_directory(probe)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)
    names = {
        "dead": f"zephon-rowgroups-{pid_namespace()}-{dead}-abc",
        "alive": f"zephon-rowgroups-{pid_namespace()}-{os.getpid()}-abc",
        "other namespace": f"zephon-rowgroups-1-{dead}-abc",
        "no pid": "zephon-rowgroups-abc123",
    }
    made = {k: Path("/dev/shm", n) for k, n in names.items()}
    try:
        for path in made.values():
            path.mkdir()
            (path / "1-0.arrow").write_bytes(b"x")
        new = make_share_directory()
        assert new is not None and os.path.basename(new).startswith(f"zephon-rowgroups-{pid_namespace()}-{os.getpid()}-")
        remove_share_directory(new)
        assert {k for k, path in made.items() if path.exists()} == {"alive", "other namespace", "no pid"}
    finally:
        for path in made.values():
            shutil.rmtree(path, ignore_errors=True)
