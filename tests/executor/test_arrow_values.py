"""Arrow values as Python values (``zephon.executor.read.arrow_values``): the same values as ``to_pylist`` for
strings and everything else, and a ``NotUTF8`` in place of each value whose bytes are not UTF-8."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from support.raw_strings import raw_strings

from zephon.executor.read.arrow_values import NotUTF8, python_values


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_strings_are_to_pylists_values(kind) -> None:
    array = pa.array(["a", None, "héllo", "", "日本語"], type=kind)
    for part in (array, array.slice(1, 3), array.take(pa.array([4, 0, 1])), array.slice(0, 0)):
        got, bad = python_values(part)
        assert got == part.to_pylist() and not bad
        assert all(type(v) is str for v in got if v is not None)


def test_other_types_and_chunked_arrays_are_to_pylists_values() -> None:
    records = pa.array([{"text": "x", "n": 1}, None, {"text": None, "n": 2}])
    assert python_values(records) == (records.to_pylist(), False)
    assert python_values(pa.nulls(3)) == ([None, None, None], False)
    chunked = pa.chunked_array([pa.array(["a", "b"]), pa.array([None, "c"])])
    assert python_values(chunked) == (["a", "b", None, "c"], False)


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_bytes_that_are_not_utf8_become_not_utf8_in_their_place(kind) -> None:
    array = raw_strings([b"ok", b"caf\xe9", None, b"\xff\xfe", b"fine"], kind)
    with pytest.raises(UnicodeDecodeError):
        array.to_pylist()  # what the reader used to let out as a traceback
    got, bad = python_values(array)
    assert bad and got == ["ok", NotUTF8(byte=0xE9, offset=3), None, NotUTF8(byte=0xFF, offset=0), "fine"]
    taken, bad = python_values(array.take(pa.array([4, 1])))
    assert bad and taken == ["fine", NotUTF8(byte=0xE9, offset=3)]


def test_a_record_holding_bytes_that_are_not_utf8_is_one_not_utf8() -> None:
    text = raw_strings([b"good", b"\xc3("])
    records = pa.StructArray.from_arrays([text, pa.array([1, 2])], names=["text", "n"])
    got, bad = python_values(records)
    assert bad and got == [{"text": "good", "n": 1}, NotUTF8(byte=0xC3, offset=0)]


def test_the_shard_reader_reports_the_row_in_reads_and_in_a_whole_shards_pass(tmp_path) -> None:
    """Reads (training) and ``iter_shard`` (the planner's count pass) alike: one line naming the row, or, under
    the skip policy, None in its place and the row counted."""
    import pyarrow.parquet as pq

    from zephon.errors import DatasetError
    from zephon.executor.read.shard_reader import ShardReader
    from zephon.plan.records import ShardRef

    path = tmp_path / "web" / "part-0.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"text": raw_strings([b"a b", b"c", b"d\x80", b"e"])}), path, row_group_size=2)
    ref = ShardRef(shard_id=0, dataset_id=0, dataset="web", uri=str(path), format="parquet", rows=4,
                   bytes=path.stat().st_size, fingerprint="")  # fmt: skip
    raising = ShardReader([ref], "text", capacity=1)
    message = (
        r"^dataset 'web': shard .*part-0\.parquet row 2 must be UTF-8 text, got byte 0x80 at byte 1 of field 'text'"
    )
    with pytest.raises(DatasetError, match=message):
        raising.texts(np.zeros(2, np.int64), np.array([3, 2]))
    with pytest.raises(DatasetError, match=message):
        list(raising.iter_shard(0))
    skipped: list[tuple[int, str]] = []
    skipping = ShardReader(
        [ref], "text", capacity=1, on_bad_document="skip", on_skip=lambda r, row, why: skipped.append((row, why))
    )
    assert skipping.texts(np.zeros(4, np.int64), np.array([3, 2, 1, 0])) == ["e", None, "c", "a b"]
    assert skipped == [(2, "not_utf8")]
