"""Finding shards and scanning their metadata."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from zephon.errors import ConfigError, DatasetError
from zephon.io import Dataset


def test_directory_glob_and_single_file_find_the_same_shards(make_parquet) -> None:
    directory = make_parquet("web", [3, 4])
    (directory / "README.md").write_text("side file")
    by_dir = Dataset.from_path("web", directory)
    by_glob = Dataset.from_path("web", str(directory / "*.parquet"))
    single = Dataset.from_path("web", directory / "part-00001.parquet")
    assert [f.uri for f in by_dir.files] == [f.uri for f in by_glob.files]
    assert [f.uri for f in single.files] == [str(directory / "part-00001.parquet")]
    assert [s.rows for s in by_dir.shards()] == [3, 4]
    assert [s.row_groups for s in by_dir.shards()] == [1, 1]


@pytest.mark.parametrize("compression", ["", "gz", "zst"])
def test_jsonl_formats_are_detected_and_counted(make_jsonl, compression) -> None:
    ds = Dataset.from_path("code", make_jsonl("code", [5, 2], compression=compression))
    assert {f.format for f in ds.files} == {f"jsonl.{compression}" if compression else "jsonl"}
    assert [s.rows for s in ds.shards()] == [5, 2]


@pytest.mark.parametrize("suffix", [".json.gz", ".json.zst"])
def test_json_lines_named_json_gz_or_zst_are_read_as_jsonl(tmp_path, tokenizer_dir, suffix) -> None:
    """C4 (``c4-train.00000-of-01024.json.gz``) and Dolma (``.json.gz``, ``.json.zst``) name JSON lines so: the
    same batches as the same lines named ``.jsonl.gz``."""
    import gzip
    import json

    import zstandard

    from zephon import Pipeline
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    lines = "".join(json.dumps({"text": f"document {i} " * (i % 7 + 1), "url": f"u{i}"}) + "\n" for i in range(30))
    pack = gzip.compress if suffix == ".json.gz" else zstandard.ZstdCompressor().compress
    runs = []
    for folder, name in (("named", f"c4-train.00000-of-00002{suffix}"), ("jsonl", f"part-0{suffix.replace('json', 'jsonl')}")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_bytes(pack(lines.encode()))
        ds = Dataset.from_path("web", tmp_path / folder)
        assert [f.format for f in ds.files] == [f"jsonl{suffix[5:]}"] and [s.rows for s in ds.shards()] == [30]
        src = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=3)
        pipe = Pipeline(src).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=33).batch(microbatch_size=2)
        runs.append([b.tokens.tolist() for b in pipe])
    assert runs[0] == runs[1] and len(runs[0]) > 3


def test_a_json_gz_beside_parquet_shards_stays_a_side_file(make_parquet) -> None:
    """Before .json.gz was read as JSON lines, a stats.json.gz beside Parquet shards was ignored: it still is (and
    named in the warning), not a mixed-formats error that would break a plan that worked."""
    import gzip

    from zephon.errors import ZephonWarning

    directory = make_parquet("web", [2, 3])
    (directory / "stats.json.gz").write_bytes(gzip.compress(b'{"rows": 5}'))
    with pytest.warns(ZephonWarning, match=r"1 file\(s\) beside its shards are not read, .*stats.json.gz"):
        assert [f.format for f in Dataset.from_path("web", directory).files] == ["parquet", "parquet"]


@pytest.mark.parametrize("text", ['[\n  {"text": "a"},\n  {"text": "b"}\n]\n', '[{"text": "a"}, {"text": "b"}]'])
def test_one_json_array_in_place_of_json_lines_is_refused_as_the_whole_file(tmp_path, text) -> None:
    """``json.dump`` of a list (Alpaca's data): every line, or its one line, would be a bad document."""
    import gzip

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "alpaca.json.gz").write_bytes(gzip.compress(text.encode()))
    with pytest.raises(DatasetError, match=r"^dataset 'web': shard \S+alpaca.json.gz must be readable jsonl.gz, got one "
                       r"JSON array, not JSON lines \(one object per line\): convert it with jq -c '\.\[\]' FILE > "
                       r"FILE.jsonl — re-export or remove the file$"):
        Dataset.from_path("web", tmp_path / "d").shards()
    (tmp_path / "d" / "alpaca.json.gz").unlink()
    (tmp_path / "d" / "ok.jsonl").write_text('[1, 2]\n{"text": "a"}\n')  # a JSONL whose first row is bad: a row
    assert [s.rows for s in Dataset.from_path("web", tmp_path / "d").shards()] == [2]


def test_jsonl_blank_lines_and_crlf_are_handled(tmp_path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_bytes(b'{"text":"a"}\r\n\n{"text":"b"}\n{"text":"c"}')
    assert [s.rows for s in Dataset.from_path("a", f).shards()] == [3]


def test_jsonl_index_is_cached_so_a_second_scan_does_not_reread(make_jsonl) -> None:
    directory = make_jsonl("code", [4])
    shard = directory / "part-00000.jsonl"
    first = Dataset.from_path("code", directory).shards()[0]
    # Rewrite the file with other content of the same size and mtime: a rescan would see 1 row.
    st = os.stat(shard)
    data = shard.read_bytes()
    shard.write_bytes(b" " * (len(data) - 1) + b"\n")
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert Dataset.from_path("code", directory).shards()[0] == first


def test_parquet_fingerprint_changes_when_the_file_changes(make_parquet) -> None:
    directory = make_parquet("web", [3])
    before = Dataset.from_path("web", directory).shards()[0].fingerprint
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["x", "y", "z"]}), directory / "part-00000.parquet")
    assert Dataset.from_path("web", directory).shards()[0].fingerprint != before


def test_empty_directory_is_refused(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="dataset 'web': directory .* must contain shard files, got an empty"):
        Dataset.from_path("web", tmp_path / "empty")


def test_unknown_format_is_refused(tmp_path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "data.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="must be Parquet or JSONL .* got unknown format for .*data.csv"):
        Dataset.from_path("web", tmp_path / "d")
    (tmp_path / "saved").mkdir()  # what datasets.save_to_disk writes: the refusal says how to convert it
    (tmp_path / "saved" / "data-00000-of-00001.arrow").write_bytes(b"ARROW1")
    (tmp_path / "saved" / "state.json").write_text("{}")
    with pytest.raises(DatasetError, match=r"data-00000-of-00001.arrow' and 1 more — convert them or point the path "
                       r"at the data files \(Arrow files of datasets.save_to_disk: datasets.load_from_disk\(DIR\)"
                       r".to_parquet\('web.parquet'\)\)$"):
        Dataset.from_path("web", tmp_path / "saved")


def test_files_beside_the_shards_that_look_like_data_are_named_in_a_warning(make_parquet, make_jsonl) -> None:
    import warnings

    from zephon.errors import ZephonWarning

    directory = make_parquet("web", [2, 3])
    for side in ("README.md", "dataset_info.json", "state.json", "LICENSE", "checksums.sha256"):
        (directory / side).write_text("metadata")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # metadata beside the shards: no warning
        assert len(Dataset.from_path("web", directory).files) == 2
    (directory / "data-00000-of-00001.arrow").write_bytes(b"ARROW1")  # datasets.save_to_disk's
    (directory / "more.json").write_text('{"text": "a"}\n')
    with pytest.warns(ZephonWarning, match=r"^dataset 'web': 2 file\(s\) beside its shards are not read, in a format "
                      r"Zephon does not read: '\S+data-00000-of-00001.arrow', '\S+more.json' — convert them to "
                      r"Parquet or JSONL if they are data, or move them out of the dataset's folder$"):
        assert len(Dataset.from_path("web", directory).files) == 2
    lines = make_jsonl("code", [2])
    (lines / "part-00001.jsonl.bz2").write_bytes(b"BZh9")  # a compression Zephon does not read
    with pytest.warns(ZephonWarning, match=rf"1 file\(s\) .*'\S+part-00001.jsonl.bz2' — .* move them out of {lines}$"):
        assert len(Dataset.from_path("code", lines).files) == 1
    (lines / "part-00001.jsonl.bz2").unlink()
    (lines / "web_text_document.bin").write_bytes(b"\0")  # Megatron's ids: a token store, said so
    with pytest.warns(ZephonWarning, match=r"; token ids \(.bin/.idx, .npy\) are a token store: "
                      r"Dataset.from_path\(NAME, PATH, fmt='megatron'\|'olmo'\)$"):
        Dataset.from_path("code", lines)


def test_mixed_formats_are_refused(make_parquet, tmp_path) -> None:
    directory = make_parquet("web", [2])
    (directory / "extra.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(DatasetError, match="must share one format, got mixed jsonl and parquet"):
        Dataset.from_path("web", directory)


def test_missing_path_and_empty_glob_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="must exist, got nothing there"):
        Dataset.from_path("web", tmp_path / "nope")
    with pytest.raises(DatasetError, match="must match at least one file"):
        Dataset.from_path("web", str(tmp_path / "*.parquet"))


@pytest.mark.parametrize("path", ["", "  ", None, b"/data/web", 3])
def test_a_path_that_is_not_a_path_is_one_line_before_anything_is_listed(tmp_path, monkeypatch, path) -> None:
    """An empty path is not the working directory (its files would be listed as the dataset's), and None or
    bytes are not the relative path their str() makes."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.parquet").write_bytes(b"")
    want = rf"^dataset 'web': path must be a non-empty string or pathlib.Path, got {re.escape(repr(path))} — pass"
    with pytest.raises(ConfigError, match=want):
        Dataset.from_path("web", path)


def test_truncated_parquet_is_refused_with_the_file_named(tmp_path) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DatasetError, match="shard .*bad.parquet must be a readable Parquet file"):
        Dataset.from_path("web", tmp_path / "bad.parquet").shards()


def test_bad_dataset_names_are_refused(make_parquet) -> None:
    with pytest.raises(ConfigError, match="dataset name must be"):
        Dataset.from_path("has space", make_parquet("web", [1]))
