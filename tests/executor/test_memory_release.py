"""Memory the shard reader holds and gives back (``zephon.executor.read.parquet``,
``zephon.executor.read.memory_release``): an open Parquet shard keeps its decoded row groups once, as Arrow, and a
closed one gives them back; releasing freed memory never changes a batch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import batches_per_setting

from zephon.errors import ConfigError
from zephon.executor.read.memory_release import release_enabled, release_memory
from zephon.executor.read.shard_reader import ShardReader
from zephon.io import Dataset
from zephon.plan.records import ShardRef
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def wide_shard(tmp_path, rows: int = 3000, size: int = 1000) -> ShardRef:
    """One Parquet shard of ``rows`` texts of ``size`` characters, row groups of 1,000 rows."""
    path = tmp_path / "web" / "part-0.parquet"
    path.parent.mkdir(parents=True)
    texts = [f"{r:06d} " + "é" * (size - 7) for r in range(rows)]  # not ASCII: a Python str takes 2 bytes a char
    pq.write_table(pa.table({"text": texts}), path, row_group_size=1000)
    return ShardRef(shard_id=0, dataset_id=0, dataset="web", uri=str(path), format="parquet", rows=rows,
                    bytes=path.stat().st_size, fingerprint="")  # fmt: skip


def test_an_open_shard_holds_its_decoded_row_groups_once_as_arrow_and_gives_them_back(tmp_path) -> None:
    ref = wide_shard(tmp_path)
    reader = ShardReader([ref], "text", capacity=1)
    before = pa.total_allocated_bytes()
    got = reader.texts(np.zeros(3, np.int64), np.array([2500, 7, 1999]))
    assert [t[:6] for t in got] == ["002500", "000007", "001999"]
    held = pa.total_allocated_bytes() - before
    utf8 = 3 * 1000 * (7 + 2 * 993)  # all three row groups, as UTF-8 bytes (é is 2 bytes)
    assert utf8 <= held < utf8 * 1.1  # the text once, not as Python strings (4 MB more here) or a second copy
    reader.close()
    release_memory()
    assert pa.total_allocated_bytes() - before < 64 * 1024  # closed: given back


def test_release_memory_setting(monkeypatch) -> None:
    assert release_enabled()
    monkeypatch.setenv("ZEPHON_RELEASE_MEMORY", "off")
    assert not release_enabled()
    release_memory()  # does nothing
    monkeypatch.setenv("ZEPHON_RELEASE_MEMORY", "sometimes")
    with pytest.raises(ConfigError, match=r'ZEPHON_RELEASE_MEMORY must be a size such as 256MiB \(GB = 10\^9 bytes, GiB = 2\^30\), or "on" or "off", got'):
        release_memory()
    from zephon.executor.read import memory_release as mr

    for value, slack in (("on", mr.SLACK_BYTES), ("256MiB", 256 << 20), (" 1 GiB", 1 << 30), ("1GB", 10**9), ("off", None)):
        monkeypatch.setenv("ZEPHON_RELEASE_MEMORY", value)
        assert mr.release_slack() == slack and release_enabled() == (slack is not None)


def test_releasing_memory_never_changes_a_batch(tmp_path, make_parquet, tokenizer_dir, monkeypatch) -> None:
    web = make_parquet("web", [23, 17, 30], row_group_size=5)
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web))], mixture=MixtureSpec({"web": 1.0}), seed=1, lanes=2
    )
    plan = source.plan(tmp_path / "plan")
    runs = batches_per_setting(monkeypatch, plan, tokenizer_dir, "ZEPHON_RELEASE_MEMORY", ("on", "off", "1KiB"))
    assert runs[0] == runs[1] == runs[2] and runs[0]


def test_freed_memory_is_handed_back_only_once_the_resident_set_grew_by_the_slack(monkeypatch) -> None:
    """Trimming returns pages the run faults in again; ``release_now_and_then`` releases only when the resident set
    has grown ``SLACK_BYTES`` since the latest release (every check where it cannot be read)."""
    from zephon.executor.read import memory_release as mr

    mib = 1 << 20
    assert mr.SLACK_BYTES >> 20 == 64
    readings = iter([600 * mib, 550 * mib, 613 * mib, 614 * mib, 560 * mib, 620 * mib, None, None, 100 * mib, 90 * mib])
    released: list[int] = []
    monkeypatch.setattr(mr, "resident_bytes", lambda: next(readings))
    monkeypatch.setattr(mr, "release_memory", lambda: released.append(1))
    monkeypatch.setattr(mr, "INTERVAL_S", 0.0)
    monkeypatch.setattr(mr, "_trimmed", [-mr.SLACK_BYTES])
    monkeypatch.setattr(mr, "_last", [0.0])
    got = []
    for _ in range(5):
        before = len(released)
        mr.release_now_and_then()
        got.append((len(released) - before, mr._trimmed[0] // mib))
    # first check: released (600 → 550); 613 < 550 + 64: kept; 614: released (→ 560); 620 < 624: kept;
    # unreadable: released, and the next reading (100 MB) releases again (→ 90)
    assert got == [(1, 550), (0, 550), (1, 560), (0, 560), (1, -64)]
    mr.release_now_and_then()
    assert (len(released), mr._trimmed[0] // mib) == (4, 90)
    monkeypatch.setenv("ZEPHON_RELEASE_MEMORY", "256MiB")  # a slack of the user's: 90 + 256 is the next trim
    readings = iter([345 * mib, 346 * mib, 120 * mib])
    mr.release_now_and_then()
    assert (len(released), mr._trimmed[0] // mib) == (4, 90)
    mr.release_now_and_then()
    assert (len(released), mr._trimmed[0] // mib) == (5, 120)
    monkeypatch.setenv("ZEPHON_RELEASE_MEMORY", "off")
    mr.release_now_and_then()  # off: not even a reading
    assert len(released) == 5 and next(readings, "none left") == "none left"


def test_a_reader_closed_for_good_hands_its_decoded_shards_back_at_once(tmp_path, monkeypatch) -> None:
    """A loader's parent closes the runner ``num_steps()`` kept once its workers take over, and a planner's
    calibration closes its reader: every decoded shard is freed together, and a release throttled as within a run
    (``release_now_and_then``: released a moment ago) kept it resident — 2.1 GB in a loader's parent over a
    20-dataset mixture. ``ShardReader.close`` hands it back at once (the resident set falls by most of it)."""
    from zephon.executor.read import memory_release as mr

    if not mr.release_enabled() or mr.resident_bytes() is None:
        pytest.skip("no release or no resident set to read here")
    ref = wide_shard(tmp_path, rows=16_000, size=2000)  # ~63 MB of UTF-8 text in 16 row groups
    reader = ShardReader([ref], "text", capacity=1)
    monkeypatch.setattr(mr, "_last", [float("inf")])  # as if released a moment ago: every throttled release skipped
    got = reader.texts(np.zeros(16, np.int64), np.arange(0, 16_000, 1000))
    assert [t[:6] for t in got] == [f"{r:06d}" for r in range(0, 16_000, 1000)]
    held = mr.resident_bytes()
    reader.close()
    freed = held - mr.resident_bytes()
    assert freed > 40 << 20, f"closing the reader handed back {freed >> 20} MiB of ~63 MiB decoded"
