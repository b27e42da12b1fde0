"""Every token-store reader reads the fixtures its format's own writer made, token for token and count for count.

The fixtures (tests/fixtures/token_stores/, README there) were written by megatron-core, datatrove, litdata and
mosaicml-streaming themselves; each token store holds ``DOCS``, each text store ``TEXTS``.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon.executor.token_stores import FORMATS, TokenStore, detect_format, open_token_store

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "token_stores"
DOCS = [[1, 17, 23, 2], [1, 5, 2], [1, 300, 301, 302, 303, 2], [1, 2], [1, 40000, 7, 9, 2], [1, 65000, 2]]
COUNTS = [4, 3, 6, 2, 5, 3]
TEXTS = ["the first document", "zwei", "", "a longer third document, with ünïcödé", "end"]

# (fixture path, options, format, dtype, parts)
TOKEN_STORES = [
    ("megatron/web_text_document", {}, "megatron", "uint16", 1),
    ("megatron/split_sentence", {}, "megatron", "int32", 1),
    ("megatron/split_sentence.idx", {}, "megatron", "int32", 1),
    ("megatron/split_sentence.bin", {}, "megatron", "int32", 1),
    ("datatrove/00000_unshuffled.ds", {}, "datatrove", "uint16", 1),
    ("datatrove/wide", {}, "datatrove", "uint32", 1),
    ("olmo/part-0-00000.npy", {"dtype": "uint32"}, "olmo", "uint32", 1),
    ("olmo/part-1-00000.npy", {"dtype": "uint16", "eos_token_id": 2}, "olmo", "uint16", 1),
    ("litdata/tokens", {}, "litdata", "uint16", 3),
    ("mds/int32", {}, "mds", "int32", 2),
    ("mds/uint16", {}, "mds", "uint16", 1),
    ("mds/bytes", {"dtype": "int64"}, "mds", "int64", 1),
    ("mds/zstd", {}, "mds", "uint16", 1),
]


def all_documents(store: TokenStore) -> list[list[int]]:
    return store.read(0, store.num_documents).to_lists()


@pytest.mark.parametrize(("path", "options", "fmt", "dtype", "parts"), TOKEN_STORES, ids=[t[0] for t in TOKEN_STORES])
def test_each_writer_s_store_reads_back_token_for_token(path, options, fmt, dtype, parts) -> None:
    assert detect_format(str(FIXTURES / path)) == fmt
    store = open_token_store(str(FIXTURES / path), **options)
    assert (store.format, store.holds, str(store.dtype), len(store.parts)) == (fmt, "tokens", dtype, parts)
    assert store.num_documents == 6 and store.token_counts().tolist() == COUNTS and store.num_tokens == 23
    assert all_documents(store) == DOCS
    assert store.read(0, 6).tokens.dtype == np.dtype(dtype)


@pytest.mark.parametrize(("path", "options", "fmt", "dtype", "parts"), TOKEN_STORES, ids=[t[0] for t in TOKEN_STORES])
def test_every_document_range_reads_exactly_its_documents(path, options, fmt, dtype, parts) -> None:
    store = open_token_store(str(FIXTURES / path), **options)
    for start in range(7):
        for stop in range(start, 7):
            docs = store.read(start, stop)
            assert docs.to_lists() == DOCS[start:stop]
            assert docs.lengths.tolist() == COUNTS[start:stop]
            assert docs.offsets[0] == 0 and len(docs) == stop - start


def test_fmt_is_explicit_or_an_alias_and_the_same_store_opens() -> None:
    path = str(FIXTURES / "olmo/part-0-00000.npy")
    for fmt in ("olmo", "numpy", "dolma"):
        assert all_documents(open_token_store(path, fmt=fmt, dtype="uint32")) == DOCS
    assert set(FORMATS) == {"megatron", "olmo", "datatrove", "litdata", "mds", "parquet", "jsonl"}


def test_megatron_documents_span_their_sequences() -> None:
    """split_sentence holds documents of 1 to 3 sequences; a document is all of them, as the index says."""
    store = open_token_store(str(FIXTURES / "megatron/split_sentence"))
    assert store.parts[0].doc_starts.tolist() == [0, 4, 7, 13, 15, 20, 23]
    assert store.read(4, 5).to_lists() == [[1, 40000, 7, 9, 2]]


def test_datatrove_store_names_its_tokenizer_and_keeps_its_loss_mask() -> None:
    store = open_token_store(str(FIXTURES / "datatrove/wide"))
    assert store.tokenizer == "zephon/demo"
    docs = store.read(0, 6)
    expected = []
    for i, doc in enumerate(DOCS):
        mask = [True] * len(doc)
        mask[: i % 3] = [False] * min(i % 3, len(doc))
        expected.extend(mask)
    assert docs.loss_mask is not None and docs.loss_mask.tolist() == expected
    assert store.read(2, 4).loss_mask.tolist() == expected[7:15]
    assert open_token_store(str(FIXTURES / "datatrove/00000_unshuffled.ds")).read(0, 6).loss_mask is None


def test_olmo_sidecar_rows_are_the_documents_even_with_gaps(tmp_path: Path) -> None:
    ids = np.asarray([1, 5, 2, 99, 1, 7, 7, 2, 9], dtype=np.uint16)
    ids.tofile(tmp_path / "a.npy")
    with gzip.open(tmp_path / "a.csv.gz", "wt") as f:
        f.write("0,3\n4,8\n8,9\n")
    store = open_token_store(str(tmp_path / "a.npy"), dtype="uint16")
    assert store.token_counts().tolist() == [3, 4, 1]
    assert all_documents(store) == [[1, 5, 2], [1, 7, 7, 2], [9]]
    assert store.read(0, 2).to_lists() == [[1, 5, 2], [1, 7, 7, 2]]


def test_olmo_boundaries_by_eos_or_by_eos_then_bos_keep_every_id(tmp_path: Path) -> None:
    ids = np.asarray([1, 5, 2, 1, 7, 2, 7, 2, 1, 9], dtype=np.uint32)
    ids.tofile(tmp_path / "b.npy")
    by_eos = open_token_store(str(tmp_path / "b.npy"), dtype="uint32", eos_token_id=2)
    assert all_documents(by_eos) == [[1, 5, 2], [1, 7, 2], [7, 2], [1, 9]]  # the tail after the last EOS is kept
    by_pair = open_token_store(str(tmp_path / "b.npy"), dtype="uint32", eos_token_id=2, bos_token_id=1)
    assert all_documents(by_pair) == [[1, 5, 2], [1, 7, 2, 7, 2], [1, 9]]


def test_an_empty_olmo_file_found_by_eos_is_no_document(tmp_path: Path) -> None:
    """An empty part had one start and no end: a store of 1 document and 0 counts, whose numbering shifted every
    later part's (a plan of the folder missed the next file's last document; reading it raised IndexError)."""
    (tmp_path / "s").mkdir()
    np.zeros(0, np.uint16).tofile(tmp_path / "s" / "a.npy")
    np.asarray([1, 5, 0, 1, 7, 7, 0, 9, 0], np.uint16).tofile(tmp_path / "s" / "b.npy")
    alone = open_token_store(str(tmp_path / "s" / "a.npy"), fmt="olmo", dtype="uint16", eos_token_id=0)
    assert alone.num_documents == 0 and alone.token_counts().tolist() == []
    store = open_token_store(str(tmp_path / "s"), fmt="olmo", dtype="uint16", eos_token_id=0)
    assert store.num_documents == 3 and store.token_counts().tolist() == [3, 4, 2]
    assert all_documents(store) == [[1, 5, 0], [1, 7, 7, 0], [9, 0]]


def test_a_numpy_file_with_a_header_is_read_past_it(tmp_path: Path) -> None:
    np.save(tmp_path / "c.npy", np.asarray([1, 4, 2, 1, 2], dtype=np.uint16))
    store = open_token_store(str(tmp_path / "c.npy"), eos_token_id=2)
    assert store.dtype == np.uint16 and all_documents(store) == [[1, 4, 2], [1, 2]]


@pytest.mark.parametrize("path", ["litdata/text", "litdata/text_plain", "mds/text"])
def test_text_stores_give_their_texts(path: str) -> None:
    store = open_token_store(str(FIXTURES / path))
    assert store.holds == "text" and store.dtype is None and store.num_documents == 5
    assert store.read_texts(0, 5) == TEXTS
    assert store.read_texts(1, 4) == TEXTS[1:4]
    with pytest.raises(Exception, match="holds text"):
        store.token_counts()


def test_a_folder_of_stores_of_one_format_is_one_store_in_path_order(tmp_path: Path) -> None:
    for name in ("b_second", "a_first"):
        for ext in (".idx", ".bin"):
            shutil.copy(FIXTURES / f"megatron/web_text_document{ext}", tmp_path / f"{name}{ext}")
    store = open_token_store(str(tmp_path))
    assert store.format == "megatron" and len(store.parts) == 2 and store.num_documents == 12
    assert store.parts[0].prefix.endswith("a_first")
    assert store.read(4, 8).to_lists() == DOCS[4:] + DOCS[:2]  # across the two parts


def _token_table(dtype: pa.DataType) -> pa.Table:
    return pa.table({"id": list(range(6)), "input_ids": pa.array(DOCS, type=pa.list_(dtype))})


@pytest.mark.parametrize("dtype", [pa.int32(), pa.uint16(), pa.int64()])
def test_parquet_token_column_reads_across_row_groups(tmp_path: Path, dtype: pa.DataType) -> None:
    pq.write_table(_token_table(dtype), tmp_path / "t.parquet", row_group_size=4)
    assert detect_format(str(tmp_path / "t.parquet")) == "parquet"
    store = open_token_store(str(tmp_path / "t.parquet"))
    assert store.dtype == np.dtype(dtype.to_pandas_dtype()) and store.token_counts().tolist() == COUNTS
    assert all_documents(store) == DOCS and store.read(3, 5).to_lists() == DOCS[3:5]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_jsonl_token_column_named_tokens(tmp_path: Path, suffix: str) -> None:
    text = "".join(json.dumps({"tokens": d, "meta": "x"}) + "\n" for d in DOCS).encode()
    (tmp_path / f"t{suffix}").write_bytes(gzip.compress(text) if suffix.endswith(".gz") else text)
    store = open_token_store(str(tmp_path / f"t{suffix}"))
    assert store.format == "jsonl" and store.dtype == np.int64
    assert store.token_counts().tolist() == COUNTS and all_documents(store) == DOCS


def test_tokens_field_picks_the_column(tmp_path: Path) -> None:
    table = pa.table({"a": pa.array([[5], [6, 7]], type=pa.list_(pa.int32())), "input_ids": [[1], [2]]})
    pq.write_table(table, tmp_path / "t.parquet")
    assert open_token_store(str(tmp_path / "t.parquet"), tokens_field="a").read(0, 2).to_lists() == [[5], [6, 7]]


def test_reading_checks_ids_against_the_vocabulary_only_when_asked() -> None:
    path = str(FIXTURES / "megatron/web_text_document")
    assert all_documents(open_token_store(path, vocab_size=65001)) == DOCS
    store = open_token_store(path, vocab_size=50000)
    assert store.read(0, 4).to_lists() == DOCS[:4]  # ids < 50000 there
    with pytest.raises(
        Exception,
        match=r"web_text_document\.bin must be < the tokenizer's vocabulary of 50000, got 65000 in document 5 \(token 1\)",
    ):
        store.read(5, 6)


def test_the_interface_refuses_ranges_outside_the_store() -> None:
    store = open_token_store(str(FIXTURES / "megatron/web_text_document"))
    assert store.read(3, 3).to_lists() == []
    with pytest.raises(Exception, match=r"must lie within 0\.\.6, got 2\.\.7"):
        store.read(2, 7)


def test_a_folder_named_as_dot_lists_only_its_own_files(tmp_path: Path, monkeypatch) -> None:
    shutil.copytree(FIXTURES / "mds/uint16", tmp_path / "store")
    monkeypatch.chdir(tmp_path / "store")
    store = open_token_store(".")
    assert store.format == "mds" and store.read(0, 6).to_lists() == DOCS
