"""Bad token stores are refused in one line naming the file, what is wrong and how to fix it — never read half."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon.errors import ConfigError, DatasetError
from zephon.executor.token_stores import detect_format, open_token_store

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "token_stores"


def copy(tmp_path: Path, name: str) -> Path:
    src = FIXTURES / name
    dest = tmp_path / name
    if src.is_dir():
        shutil.copytree(src, dest)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        for sibling in src.parent.glob(src.name + "*"):
            shutil.copy(sibling, dest.parent / sibling.name)
    return dest


@pytest.fixture
def megatron(tmp_path: Path) -> Path:
    for ext in (".idx", ".bin"):
        shutil.copy(FIXTURES / f"megatron/web_text_document{ext}", tmp_path / f"web{ext}")
    return tmp_path / "web"


def patch(path: Path, at: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[at : at + len(data)] = data
    path.write_bytes(bytes(raw))


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and " — " in text, text
    return text


def test_a_truncated_bin_is_named_with_its_expected_size(megatron: Path) -> None:
    bin_ = megatron.with_suffix(".bin")
    bin_.write_bytes(bin_.read_bytes()[:-3])
    with pytest.raises(DatasetError, match=r"web\.bin must be 46 bytes as .*web\.idx says, got 43 \(shorter\)") as exc:
        open_token_store(str(megatron))
    assert "truncated" in one_line(exc)


def test_a_bin_longer_than_its_index_says_is_refused(megatron: Path) -> None:
    with megatron.with_suffix(".bin").open("ab") as f:
        f.write(b"\0\0")
    with pytest.raises(DatasetError, match=r"got 48 \(longer\) — the data file is not the one this index was written"):
        open_token_store(str(megatron))


def test_a_wrong_magic_says_it_is_not_a_megatron_index(megatron: Path) -> None:
    patch(megatron.with_suffix(".idx"), 0, b"NOTANIDX\0")
    with pytest.raises(DatasetError, match=r"web\.idx must start with the Megatron index magic .* got b'NOTANIDX") as e:
        open_token_store(str(megatron))
    assert "preprocess_data.py" in one_line(e)


def test_a_wrong_version_is_refused(megatron: Path) -> None:
    patch(megatron.with_suffix(".idx"), 9, struct.pack("<Q", 2))
    with pytest.raises(DatasetError, match=r"web\.idx must be a Megatron index of version 1, got version 2"):
        open_token_store(str(megatron))


@pytest.mark.parametrize("code", [0, 6, 9, 255])
def test_an_unknown_or_float_dtype_code_is_refused(megatron: Path, code: int) -> None:
    patch(megatron.with_suffix(".idx"), 17, bytes([code]))
    with pytest.raises(
        DatasetError, match=rf"web\.idx must name an integer dtype code \(1 uint8, .*\), got code {code}"
    ):
        open_token_store(str(megatron))


def test_an_index_whose_sizes_disagree_with_its_length_is_refused(megatron: Path) -> None:
    idx = megatron.with_suffix(".idx")
    idx.write_bytes(idx.read_bytes()[:-8])
    with pytest.raises(DatasetError, match=r"web\.idx must be \d+ bytes for its 6 sequences and 7 document indices"):
        open_token_store(str(megatron))


def test_a_document_pointer_past_the_end_is_refused(megatron: Path) -> None:
    patch(megatron.with_suffix(".idx"), 34 + 4 * 6 + 8 * 5, struct.pack("<q", 4096))
    with pytest.raises(DatasetError, match=r"must point sequence 5 at byte 40 of .*web\.bin, got 4096 \(past the end"):
        open_token_store(str(megatron))


def test_datatrove_index_and_data_must_agree(tmp_path: Path) -> None:
    ds = copy(tmp_path, "datatrove/00000_unshuffled.ds")
    index = Path(str(ds) + ".index")
    index.write_bytes(index.read_bytes()[:-8] + struct.pack("<Q", 99))
    with pytest.raises(DatasetError, match=r"\.ds\.index must end its last document at the 23 tokens of .*, got 99"):
        open_token_store(str(ds))


def test_datatrove_data_must_be_whole_tokens_and_loss_one_byte_each(tmp_path: Path) -> None:
    wide = copy(tmp_path, "datatrove/wide")
    loss = wide / "00000_wide.ds.loss"
    loss.write_bytes(loss.read_bytes()[:-1])
    with pytest.raises(DatasetError, match=r"\.ds\.loss must hold one byte per token \(23\), got 22"):
        open_token_store(str(wide))
    ds = copy(tmp_path, "datatrove/00000_unshuffled.ds")
    ds.write_bytes(ds.read_bytes() + b"\0")
    with pytest.raises(DatasetError, match=r"must be a whole number of 2-byte tokens, got 47 bytes"):
        open_token_store(str(ds))


def test_a_numpy_file_whose_size_is_not_a_multiple_of_its_dtype(tmp_path: Path) -> None:
    (tmp_path / "x.npy").write_bytes(np.arange(5, dtype=np.uint16).tobytes())
    with pytest.raises(
        DatasetError, match=r"x\.npy must be a whole number of uint32 ids \(4 bytes each\), got 10 bytes"
    ):
        open_token_store(str(tmp_path / "x.npy"), dtype="uint32", eos_token_id=2)


def test_olmo_needs_its_dtype_and_a_way_to_find_documents(tmp_path: Path) -> None:
    (tmp_path / "x.npy").write_bytes(np.arange(4, dtype=np.uint16).tobytes())
    with pytest.raises(
        DatasetError, match=r"x\.npy must be read with the dtype it was written in, got none — pass dtype="
    ):
        open_token_store(str(tmp_path / "x.npy"))
    with pytest.raises(DatasetError, match=r"must come with its document index .*x\.csv\.gz or an EOS id"):
        open_token_store(str(tmp_path / "x.npy"), dtype="uint16")


@pytest.mark.parametrize("dtype", ["float32", "float64", "bool"])
def test_a_numpy_file_saved_with_a_non_integer_dtype_is_refused(tmp_path: Path, dtype: str) -> None:
    """``np.save`` of float ids (or a mask) records its dtype in the header, which the reader then uses: such a
    file is refused by name (it was read as it is: a store of float32 "ids" reached the packer)."""
    np.save(tmp_path / "x.npy", np.arange(6).astype(dtype))
    with pytest.raises(DatasetError, match=rf"x\.npy must hold integer token ids, got a {dtype} array — save the ids"):
        open_token_store(str(tmp_path / "x.npy"), eos_token_id=2)


def test_an_olmo_sidecar_past_its_data_is_refused(tmp_path: Path) -> None:
    import gzip

    (tmp_path / "x.npy").write_bytes(np.arange(4, dtype=np.uint16).tobytes())
    (tmp_path / "x.csv.gz").write_bytes(gzip.compress(b"0,2\n2,9\n"))
    with pytest.raises(
        DatasetError, match=r"x\.csv\.gz must hold sorted start,end rows within the 4 ids .* got 2,9 in row 1"
    ):
        open_token_store(str(tmp_path / "x.npy"), dtype="uint16")


def test_an_mds_shard_missing_from_its_folder_is_named(tmp_path: Path) -> None:
    store = copy(tmp_path, "mds/int32")
    (store / "shard.00001.mds").unlink()
    with pytest.raises(
        DatasetError, match=r"must have the shard .*int32/shard\.00001\.mds, got none — copy every shard"
    ):
        open_token_store(str(store))


def test_an_mds_shard_of_another_size_than_its_index_says(tmp_path: Path) -> None:
    store = copy(tmp_path, "mds/uint16")
    shard = store / "shard.00000.mds"
    shard.write_bytes(shard.read_bytes()[:-4])
    with pytest.raises(DatasetError, match=r"shard\.00000\.mds must be \d+ bytes as index\.json says, got \d+"):
        open_token_store(str(store))


def test_a_legacy_bytes_column_needs_its_dtype() -> None:
    with pytest.raises(DatasetError, match=r"is raw bytes, got no dtype .* dtype='int64'"):
        open_token_store(str(FIXTURES / "mds/bytes"))


def test_a_truncated_litdata_chunk_is_refused(tmp_path: Path) -> None:
    store = copy(tmp_path, "litdata/tokens")
    chunk = store / "chunk-0-1.bin"
    chunk.write_bytes(chunk.read_bytes()[:-2])
    with pytest.raises(
        DatasetError, match=r"chunk-0-1\.bin must be 32 bytes holding 2 items as index\.json says, got 30"
    ):
        open_token_store(str(store))


def test_a_compressed_litdata_store_is_refused(tmp_path: Path) -> None:
    store = copy(tmp_path, "litdata/tokens")
    meta = json.loads((store / "index.json").read_text())
    meta["config"]["compression"] = "zstd"
    (store / "index.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=r"must describe uncompressed, unencrypted chunks .* compression=None"):
        open_token_store(str(store))


def test_mixed_dtypes_in_one_store_are_refused() -> None:
    with pytest.raises(DatasetError, match=r"megatron' must hold one dtype, got \['int32', 'uint16'\]"):
        open_token_store(str(FIXTURES / "megatron"))
    with pytest.raises(DatasetError, match=r"must hold one tokenizer and token size"):
        open_token_store(str(FIXTURES / "datatrove"))


def test_ids_over_the_vocabulary_name_the_file_and_document() -> None:
    store = open_token_store(str(FIXTURES / "datatrove/wide"), vocab_size=1000)
    with pytest.raises(
        DatasetError, match=r"00000_wide\.ds must be < the tokenizer's vocabulary of 1000, got 40000 in document 4"
    ) as e:
        store.read(0, 6)
    assert "made with another tokenizer" in one_line(e)


def test_an_ambiguous_folder_asks_for_fmt(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "datatrove/00000_unshuffled.ds", tmp_path / "a.ds")
    shutil.copy(FIXTURES / "olmo/part-0-00000.npy", tmp_path / "b.npy")
    assert detect_format(str(tmp_path)) is None
    with pytest.raises(
        DatasetError, match=r"must be of a format its files tell, got files .* — pass fmt= \(one of megatron"
    ):
        open_token_store(str(tmp_path))


def test_bad_options_are_config_errors(tmp_path: Path) -> None:
    path = str(FIXTURES / "olmo/part-1-00000.npy")
    with pytest.raises(ConfigError, match=r"fmt must be one of megatron, .*, got 'arrow'"):
        open_token_store(path, fmt="arrow")
    with pytest.raises(ConfigError, match=r"dtype must be an integer NumPy dtype .* got 'float32'"):
        open_token_store(path, dtype="float32")
    with pytest.raises(ConfigError, match=r"eos_token_id must be an integer ≥ 0 or None, got -1"):
        open_token_store(path, dtype="uint16", eos_token_id=-1)
    with pytest.raises(DatasetError, match=r"must name a file, a file prefix or a folder, got nothing there"):
        open_token_store(str(tmp_path / "nothing"))


@pytest.mark.parametrize(
    ("rows", "want"),
    [
        ([[1, 2]] * 7 + [[3, None, 4]] + [[5]] * 3, r"must hold integer ids only, got a null at row 7 \(id 1\)"),
        ([[1, 2]] * 7 + [None] + [[5]] * 3, r"must hold a list of ids in every row, got none at row 7 — drop"),
    ],
)
def test_a_null_in_a_parquet_token_column_names_its_row_across_row_groups(tmp_path: Path, rows, want) -> None:
    """Row groups of 3 rows: the row is the file's (7), not the group's (1); a null id also names its place."""
    pq.write_table(pa.table({"ids": pa.array(rows, pa.list_(pa.int32()))}), tmp_path / "t.parquet", row_group_size=3)
    with pytest.raises(DatasetError, match=rf"^token column 'ids' of .*t\.parquet {want}"):
        open_token_store(str(tmp_path / "t.parquet"), fmt="parquet", tokens_field="ids")


def test_a_jsonl_token_line_without_the_key_or_with_a_null_id_names_its_row(tmp_path: Path) -> None:
    lines = [{"ids": [1]}] * 4 + [{"text": "no ids"}] + [{"ids": [2]}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(DatasetError, match=r"got none at row 4 \(null, or a line without that key\) — drop or fix"):
        open_token_store(str(tmp_path / "a.jsonl"), fmt="jsonl", tokens_field="ids")
    lines[4] = {"ids": [1, 2, None]}
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(DatasetError, match=r"must hold integer ids only, got a null at row 4 \(id 2\) — drop"):
        open_token_store(str(tmp_path / "a.jsonl"), fmt="jsonl", tokens_field="ids")


def _litdata_chunks_a_mapping(store: Path) -> None:
    index = json.loads((store / "index.json").read_text())
    index["chunks"] = {"0": index["chunks"][0]}
    (store / "index.json").write_text(json.dumps(index))


def _mds_shards_null(store: Path) -> None:
    (store / "index.json").write_text(json.dumps({"version": 2, "shards": None}))


@pytest.mark.parametrize(
    ("fixture", "damage", "fmt"),
    [
        ("litdata/tokens", _litdata_chunks_a_mapping, "litdata"),
        ("mds/uint16", _mds_shards_null, "mds"),
    ],
)
def test_an_index_of_another_shape_is_one_line_naming_the_store(tmp_path: Path, fixture, damage, fmt) -> None:
    """An index whose JSON or text has another shape than the format's (a mapping for a list, a null, a
    count that is not a number) raised AttributeError, TypeError, ValueError from inside the reader."""
    store = copy(tmp_path, fixture)
    damage(store)
    with pytest.raises(
        DatasetError,
        match=rf"^token store '.*' \({fmt}\) must have index files of the layout docs/token-stores.md describes, got "
        r"\w+Error: .* — the index is damaged or written by another tool: write the store again$",
    ):
        open_token_store(str(store), fmt=fmt)


@pytest.mark.parametrize(("removed", "given"), [(".idx", "web"), (".idx", "web.bin"), (".bin", "web.idx")])
def test_half_a_megatron_pair_without_fmt_names_the_missing_file(megatron: Path, removed: str, given: str) -> None:
    """Without fmt= the path was "must exist, got nothing there" (web.bin was there) or "a format its files tell"."""
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    megatron.with_suffix(removed).unlink()
    other = ".bin" if removed == ".idx" else ".idx"
    what = "its index" if removed == ".idx" else "its data file"
    with pytest.raises(
        DatasetError,
        match=rf"^dataset 'web': token store '.*web' must have {what} .*web\{removed}, got none — copy the \{removed} "
        rf"beside the \{other}$",
    ):
        dataset = Dataset.from_path("web", str(megatron.parent / given))
        StaticMixtureWorkSource(datasets=[dataset], mixture=MixtureSpec({"web": 1.0}), seed=1).plan(
            megatron.parent / "p"
        )


def test_an_mds_token_value_that_is_no_1d_array_names_its_shard_and_sample(tmp_path: Path) -> None:
    """The line named neither the shard nor the sample (``… must be 1-D arrays, got a sample of 2 bytes``)."""
    store = copy(tmp_path, "mds/uint16")
    shard = store / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    end_of_first = struct.unpack_from("<I", data, 8)[0]
    struct.pack_into("<I", data, 8, end_of_first + 1)  # sample 0 one byte longer, sample 1 one shorter
    shard.write_bytes(bytes(data))
    with pytest.raises(
        DatasetError,
        match=r"token values of 'ndarray:uint16' in .*shard\.00000\.mds must be 1-D arrays of one id or more \(as "
        r"MDSWriter writes them\), got sample 0 of \d+ bytes — write the shard again with MDSWriter$",
    ):
        open_token_store(str(store), fmt="mds").token_counts()


def test_a_megatron_index_of_no_document_index_says_so(megatron: Path) -> None:
    """A header of 0 sequences and 0 document indices said "must be 34 bytes …, got 34"."""
    idx = megatron.with_suffix(".idx")
    head = bytearray(idx.read_bytes()[:34])
    head[18:34] = bytes(16)  # 0 sequences, 0 document indices
    idx.write_bytes(bytes(head))
    with pytest.raises(DatasetError, match=r"web\.idx must hold at least one document index \(0\), got none — "):
        open_token_store(str(megatron))


def test_a_datatrove_index_that_does_not_rise_names_where(tmp_path: Path) -> None:
    """Ends that fall (and end at the data's tokens) said "must end … at the 23 tokens …, got 23"."""
    store = copy(tmp_path, "datatrove/00000_unshuffled.ds")
    index = store.with_name(store.name + ".index")
    ends = np.frombuffer(index.read_bytes(), dtype="<u8").copy()
    ends[1], ends[2] = ends[2], ends[1]
    index.write_bytes(ends.tobytes())
    with pytest.raises(
        DatasetError, match=r"\.ds\.index must hold document ends rising from 0, got \d+ after \d+ at document 2 — "
    ):
        open_token_store(str(store))


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ("zephon/demo|²\n23\n", r"must start with TOKENIZER\|TOKEN_SIZE \(token size 2 or 4\), got 'zephon/demo\|²'"),
        ("zephon/demo|2\n24\n", r"\.ds\.metadata must count the 23 tokens of .*\.ds, got 24 — the metadata and the data "
         r"disagree"),
    ],
    ids=["token size not ascii digits", "count of another file"],
)  # fmt: skip
def test_datatrove_metadata_must_be_read_as_written_and_count_the_data(tmp_path: Path, metadata, message) -> None:
    """``str.isdigit`` took '²' for a digit (int() then raised ValueError); the token count was never compared."""
    store = copy(tmp_path, "datatrove/00000_unshuffled.ds")
    store.with_name(store.name + ".metadata").write_text(metadata)
    with pytest.raises(DatasetError, match=message):
        open_token_store(str(store))
