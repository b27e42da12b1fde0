"""Row groups decoded on the decode pool (``zephon.executor.read.decode_pool``): the texts, the batches and the errors
are those of decoding one row group at a time on the reader's thread; the setting is checked; a forked child
(a DataLoader worker) decodes on pools of its own."""

from __future__ import annotations

import dataclasses
import multiprocessing
import re
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import batches_per_setting

from zephon.errors import ConfigError, DatasetError
from zephon.executor.read.decode_pool import decode_pool, decode_threads
from zephon.executor.read.shard_reader import ShardReader
from zephon.io import Dataset
from zephon.plan.records import ShardRef
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def shard(tmp_path, rows: int = 600, group: int = 20, *, name: str = "part-0") -> ShardRef:
    """A Parquet shard of ``rows`` distinct texts (every 7th null) in row groups of ``group`` rows, snappy."""
    path = tmp_path / "web" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    texts = [None if r % 7 == 3 else f"document {r} " + "word " * (r % 13) for r in range(rows)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=group)
    return ShardRef(shard_id=0, dataset_id=0, dataset="web", uri=str(path), format="parquet", rows=rows,
                    bytes=path.stat().st_size, fingerprint="")  # fmt: skip


def read(ref: ShardRef, rows: np.ndarray) -> list[str | None]:
    reader = ShardReader([ref], "text", capacity=1, on_bad_document="skip")
    try:
        return reader.texts(np.zeros(len(rows), np.int64), rows)
    finally:
        reader.close()


@pytest.mark.parametrize("threads", ["2", "3", "auto"])
def test_the_pool_reads_the_texts_of_one_thread(tmp_path, monkeypatch, threads) -> None:
    ref = shard(tmp_path)
    rows = np.random.default_rng(5).permutation(600)[:180]  # 30 %, in every row group, in shuffled order
    monkeypatch.setenv("ZEPHON_DECODE_THREADS", "1")
    serial = read(ref, rows)
    monkeypatch.setenv("ZEPHON_DECODE_THREADS", threads)
    assert read(ref, rows) == serial
    expected = [None if r % 7 == 3 else f"document {r} " + "word " * (r % 13) for r in rows.tolist()]
    assert serial == expected


def test_the_pool_decodes_on_its_threads_with_their_own_file_handles(tmp_path, monkeypatch) -> None:
    ref = shard(tmp_path)
    monkeypatch.setenv("ZEPHON_DECODE_THREADS", "2")
    reader = ShardReader([ref], "text", capacity=1, on_bad_document="skip")
    names: set[str] = set()
    parquet = type(reader.open_shard(0).text)
    original = parquet.row_group

    def traced(self, g):
        names.add(threading.current_thread().name)
        return original(self, g)

    monkeypatch.setattr(parquet, "row_group", traced)
    got = reader.texts(np.zeros(30, np.int64), np.arange(0, 600, 20))  # the first row of every row group
    assert got[1] == "document 20 word word word word word word word "
    assert names and all(n.startswith("zephon-decode") for n in names)
    reader.close()


def test_a_shard_opened_on_another_thread_is_read_through_a_handle_of_its_own(tmp_path, monkeypatch) -> None:
    ref = shard(tmp_path)
    monkeypatch.setenv("ZEPHON_DECODE_THREADS", "1")
    reader = ShardReader([ref], "text", capacity=1, on_bad_document="skip")
    opener = threading.Thread(target=reader.open_shard, args=(0,))  # as a calibration opens it for the run
    opener.start()
    opener.join()
    assert reader.texts(np.zeros(2, np.int64), np.array([599, 0])) == [
        "document 599 " + "word " * (599 % 13),
        "document 0 ",
    ]
    reader.close()


@pytest.mark.parametrize("threads", ["1", "3"])
def test_the_first_corrupt_row_group_in_order_is_the_one_reported(tmp_path, monkeypatch, threads) -> None:
    ref = shard(tmp_path)
    path = tmp_path / "web" / "part-0.parquet"
    data = bytearray(path.read_bytes())
    for g in (9, 4):  # two corrupt row groups: the error names the first one, 4, whichever thread fails first
        offset = pq.ParquetFile(path).metadata.row_group(g).column(0).data_page_offset
        data[offset : offset + 8] = b"\xff" * 8  # the page header: same size, same footer
    path.write_bytes(bytes(data))
    monkeypatch.setenv("ZEPHON_DECODE_THREADS", threads)
    with pytest.raises(DatasetError, match=r"row group 4 \(rows 80-99\) must decode, got .* the file is corrupt"):
        read(ref, np.arange(600)[::-1].copy())  # rows of every row group, the last first
    assert read(ref, np.array([5, 30])) == ["document 5 " + "word " * 5, "document 30 " + "word " * 4]


def test_decode_threads_setting(monkeypatch) -> None:
    monkeypatch.delenv("ZEPHON_DECODE_THREADS", raising=False)
    assert 1 <= decode_threads() <= 4
    monkeypatch.setenv("ZEPHON_DECODE_THREADS", "1")
    assert decode_pool() is None
    monkeypatch.setenv("ZEPHON_DECODE_THREADS", "3")
    assert decode_threads() == 3 and decode_pool() is decode_pool()
    for bad in ("0", "many", "-2"):
        monkeypatch.setenv("ZEPHON_DECODE_THREADS", bad)
        with pytest.raises(
            ConfigError,
            match=rf'^ZEPHON_DECODE_THREADS must be "auto" or a number of threads ≥ 1, got {re.escape(repr(bad))} — ',
        ):
            decode_threads()


def _child_reads(ref: ShardRef, out) -> None:
    out.put(read(ref, np.arange(0, 600, 50)))


def test_a_forked_child_decodes_on_a_pool_of_its_own(tmp_path, monkeypatch) -> None:
    ref = shard(tmp_path)
    monkeypatch.setenv("ZEPHON_DECODE_THREADS", "2")
    expected = read(ref, np.arange(0, 600, 50))  # the parent's pool exists, its threads started
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child_reads, args=(ref, out))
    child.start()
    child.join(timeout=60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive, "the child hung on the parent's pool, whose threads it does not have"
    assert out.get(timeout=5) == expected


def test_decode_threads_never_change_a_batch(tmp_path, make_parquet, tokenizer_dir, monkeypatch) -> None:
    web = make_parquet("web", [230, 170, 300], row_group_size=7)
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web))], mixture=MixtureSpec({"web": 1.0}), seed=3, lanes=2
    )
    plan = source.plan(tmp_path / "plan")
    runs = batches_per_setting(monkeypatch, plan, tokenizer_dir, "ZEPHON_DECODE_THREADS", ("1", "2", "4"))
    assert runs[0] and runs[0] == runs[1] == runs[2]


def test_texts_of_interleaved_shards_come_back_in_the_order_asked(tmp_path, monkeypatch) -> None:
    """Rows of two shards — one of a single row group, one of many — asked interleaved and shuffled come back in
    the order asked (``ShardReader.texts`` puts each shard's reads back with one gather, issue #29 hot path)."""
    monkeypatch.setenv("ZEPHON_DECODE_THREADS", "1")
    one = shard(tmp_path, rows=300, group=300, name="part-0")
    many = shard(tmp_path, rows=300, group=20, name="part-1")
    refs = [one, dataclasses.replace(many, shard_id=1)]
    rng = np.random.default_rng(7)
    shard_ids = rng.integers(0, 2, size=250)
    rows = rng.integers(0, 300, size=250)
    reader = ShardReader(refs, "text", capacity=2, on_bad_document="skip")
    try:
        got = reader.texts(shard_ids, rows)
        again = reader.texts(shard_ids[:1], rows[:1])  # one shard, one row
    finally:
        reader.close()
    expected = [None if r % 7 == 3 else f"document {r} " + "word " * (r % 13) for r in rows.tolist()]
    assert got == expected and again == expected[:1]
