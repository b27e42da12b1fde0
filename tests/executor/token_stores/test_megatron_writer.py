"""MegatronWriter writes what megatron-core writes: the committed fixture, byte for byte; Megatron's dtype rule;
ids that do not fit refused; nothing but its own temporaries ever removed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zephon.errors import DatasetError
from zephon.executor.token_stores import open_token_store
from zephon.executor.token_stores.megatron_writer import (
    MegatronWriter,
    index_bytes,
    megatron_dtype,
    sweep_temporaries,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "token_stores" / "megatron"
DOCS = [[1, 17, 23, 2], [1, 5, 2], [1, 300, 301, 302, 303, 2], [1, 2], [1, 40000, 7, 9, 2], [1, 65000, 2]]


def write(prefix: Path, docs: list[list[int]], dtype: object, batches: int = 1) -> None:
    with MegatronWriter(prefix, np.dtype(dtype)) as writer:
        for part in np.array_split(np.arange(len(docs)), batches):
            chunk = [docs[i] for i in part]
            ids = np.concatenate([np.asarray(d, np.int64) for d in chunk]) if chunk else np.empty(0, np.int64)
            writer.add(ids, np.array([len(d) for d in chunk], np.int64))
        writer.finish()
        writer.commit()


@pytest.mark.parametrize("batches", [1, 4])
def test_the_writer_reproduces_megatron_core_s_own_store_byte_for_byte(tmp_path, batches) -> None:
    write(tmp_path / "web_text_document", DOCS, np.uint16, batches)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"web_text_document{suffix}").read_bytes() == (
            FIXTURES / f"web_text_document{suffix}"
        ).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["web_text_document.bin", "web_text_document.idx"]


def test_the_worked_example_of_the_module_docstring(tmp_path) -> None:
    write(tmp_path / "x", [[1, 17, 2], [1, 2]], np.uint16)
    assert (tmp_path / "x.bin").read_bytes() == bytes.fromhex("0100 1100 0200 0100 0200")
    idx = (tmp_path / "x.idx").read_bytes()
    assert len(idx) == 82 and idx[:9] == b"MMIDIDX\x00\x00" and idx[17] == 8
    assert np.frombuffer(idx[34:42], "<i4").tolist() == [3, 2]
    assert np.frombuffer(idx[42:58], "<i8").tolist() == [0, 6]
    assert np.frombuffer(idx[58:], "<i8").tolist() == [0, 1, 2]


def test_megatron_s_dtype_rule_uint16_below_65500_ids_else_int32() -> None:
    assert [str(megatron_dtype(v)) for v in (256, 50257, 65499, 65500, 65536, 128256)] == [
        "uint16",
        "uint16",
        "uint16",
        "int32",
        "int32",
        "int32",
    ]


def test_int32_and_empty_stores_read_back(tmp_path) -> None:
    write(tmp_path / "wide", [[1, 100000, 2], [], [1, 2]], np.int32)
    store = open_token_store(str(tmp_path / "wide"))
    assert str(store.dtype) == "int32" and store.read(0, 3).to_lists() == [[1, 100000, 2], [], [1, 2]]
    write(tmp_path / "none", [], np.uint16)
    assert (tmp_path / "none.bin").stat().st_size == 0
    assert open_token_store(str(tmp_path / "none")).num_documents == 0
    assert index_bytes(np.empty(0, np.int64), np.dtype(np.uint16))[26:34] == (1).to_bytes(8, "little")


def test_an_id_the_dtype_cannot_hold_is_refused_and_nothing_is_left(tmp_path) -> None:
    with pytest.raises(DatasetError, match=r"must hold ids from 0 that fit uint16 .*got id 70000"):
        write(tmp_path / "x", [[1, 70000, 2]], np.uint16)
    with pytest.raises(DatasetError, match=r"got id -1"):
        write(tmp_path / "y", [[1, -1]], np.int32)
    assert list(tmp_path.iterdir()) == []


def test_sweeping_removes_only_the_writer_s_temporaries(tmp_path) -> None:
    killed = MegatronWriter(tmp_path / "a" / "part", np.dtype(np.uint16))  # a writer "killed" before commit
    killed.add(np.array([1, 2]), np.array([2]))
    killed._file.close()
    (tmp_path / "a" / "mine.bin").write_bytes(b"user")
    (tmp_path / "a" / ".hidden").write_bytes(b"user")
    removed = sweep_temporaries(tmp_path)
    assert [p.name for p in removed] == [killed.bin_tmp.name]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [".hidden", "mine.bin"]
