"""MDS datasets as records: a folder written by streaming's own MDSWriter (tests/fixtures/records_mds) planned
shard by shard from index.json and the headers, each sample read back as its columns (images left encoded)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from zephon import Pipeline
from zephon.errors import DatasetError
from zephon.io import Dataset
from zephon.recipe.token_store import looks_like_token_store
from zephon.work import MixtureSpec, StaticMixtureWorkSource

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PAIRS = FIXTURES / "records_mds" / "pairs"
EXPECTED = json.loads((FIXTURES / "records_mds" / "expected.json").read_text())


def plan_of(folder: Path, out: Path) -> Path:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("pairs", str(folder))], mixture=MixtureSpec({"pairs": 1.0}), seed=11
    )
    return source.plan(out)


def test_an_mds_folder_of_images_and_numbers_is_records_and_a_token_folder_stays_a_store():
    assert not looks_like_token_store(str(PAIRS))
    for store in ("int32", "text", "uint16"):  # a token column, or str columns only: token stores as before
        assert looks_like_token_store(str(FIXTURES / "token_stores" / "mds" / store))


def test_mds_samples_come_back_as_their_columns_in_plan_order(tmp_path: Path):
    plan = plan_of(PAIRS, tmp_path / "plan")
    shards = pq.read_table(plan / "shards.parquet").to_pylist()
    assert [s["format"] for s in shards] == ["mds"] * len(shards) and len(shards) == 2
    assert sum(s["rows"] for s in shards) == 7 and all(s["fingerprint"].startswith("mdsindex:") for s in shards)
    records = [r for b in Pipeline.from_plan(plan).batch(microbatch_size=3, collate=list) for r in b.data]
    samples = pq.read_table(plan / "samples.parquet").to_pydict()
    first = [0, shards[0]["rows"]]
    order = [first[s] + r for s, r in zip(samples["shard_id"], samples["row"], strict=True)]
    assert sorted(order) == list(range(7))
    for i, record in zip(order, records, strict=True):
        want = EXPECTED[i]
        assert record["caption"] == want["caption"] and record["label"] == want["label"]
        assert record["raw"] == bytes.fromhex(want["raw"]) and record["score"] == want["score"]
        assert record["meta"] == want["meta"]
        assert hashlib.sha256(record["image"]).hexdigest() == want["image_sha256"]  # the JPEG bytes as stored
        assert hashlib.sha256(record["thumb"]).hexdigest() == want["thumb_sha256"]
        thumb = np.asarray(Image.open(io.BytesIO(record["thumb"])).convert("RGB"))
        assert (thumb == np.random.default_rng(100 + i).integers(0, 256, (4, 4, 3), dtype=np.uint8)).all()
        assert Image.open(io.BytesIO(record["image"])).size == (8, 8)


def test_an_mds_shard_rewritten_after_planning_is_refused(tmp_path: Path):
    folder = tmp_path / "pairs"
    shutil.copytree(PAIRS, folder)
    plan = plan_of(folder, tmp_path / "plan")
    shard = folder / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    data[8:12] = (int.from_bytes(data[8:12], "little") + 1).to_bytes(4, "little")  # a sample boundary moved
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"^dataset 'pairs': MDS shard .*shard\.00000\.mds changed since planning"):
        list(Pipeline.from_plan(plan).batch(microbatch_size=2))


def test_an_mds_shard_cut_short_or_removed_after_planning_is_one_line(tmp_path: Path):
    folder = tmp_path / "pairs"
    shutil.copytree(PAIRS, folder)
    plan = plan_of(folder, tmp_path / "plan")
    shard = folder / "shard.00000.mds"
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(
        DatasetError,
        match=rf"^dataset 'pairs': MDS shard .*shard\.00000\.mds changed since planning: size must be {size} bytes, "
        rf"got {size - 1} — restore the planned data or re-plan$",
    ):
        list(Pipeline.from_plan(plan).batch(microbatch_size=2))
    shard.unlink()
    with pytest.raises(DatasetError, match=r"shard\.00000\.mds must exist as planned, got No such file .* — restore"):
        list(Pipeline.from_plan(plan).batch(microbatch_size=2))


def test_a_pickled_mds_column_is_refused_in_one_line(tmp_path: Path):
    plan = plan_of(FIXTURES / "records_mds" / "pickled", tmp_path / "plan")
    with pytest.raises(DatasetError, match=r"column 'obj' must have one of the encodings .* got 'pkl' — .*never does"):
        list(Pipeline.from_plan(plan).batch(microbatch_size=1))


def test_an_mds_sample_that_does_not_decode_is_one_line_or_skipped_and_counted(tmp_path: Path):
    folder = tmp_path / "pairs"
    shutil.copytree(PAIRS, folder)
    plan = plan_of(folder, tmp_path / "plan")
    shard = folder / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    at = data.index("caption 2 é".encode())
    data[at] = 0xFF  # not UTF-8: the payload changed, the header and the index did not
    shard.write_bytes(bytes(data))
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': MDS shard .*shard\.00000\.mds row 2 column 'caption' must decode, got .*utf-8.* — "
        r"restore the shard, or skip and count",
    ):
        list(Pipeline.from_plan(plan).batch(microbatch_size=2, collate=list))
    pipe = Pipeline.from_plan(plan).options(on_bad_document="skip").batch(microbatch_size=2, collate=list)
    captions = sorted(r["caption"] for b in pipe for r in b.data)
    assert captions == sorted(e["caption"] for i, e in enumerate(EXPECTED) if i != 2)
    assert pipe.stats().skipped == {"bad_sample": 1}


def test_a_text_pipeline_over_records_shards_is_refused_in_one_line(tmp_path: Path):
    from zephon.demo import demo_tokenizer_path
    from zephon.errors import ConfigError

    plan = plan_of(PAIRS, tmp_path / "plan")
    pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=demo_tokenizer_path(), field="caption")
    with pytest.raises(
        ConfigError, match=r"shard .*shard\.0000\d\.mds is an MDS shard of records, got a reader of text"
    ):
        list(pipe.pack_flat(max_length=17).batch(microbatch_size=2))


def records_of(plan: Path) -> list[dict]:
    return [r for b in Pipeline.from_plan(plan).batch(microbatch_size=3, collate=list) for r in b.data]


@pytest.mark.parametrize("algorithm", ["zstd", "gz", "bz2"])
def test_compressed_mds_shards_read_whole_give_the_samples_of_the_raw_shards(tmp_path: Path, algorithm: str):
    folder = FIXTURES / "records_mds" / "compressed" / algorithm
    plan = plan_of(folder, tmp_path / "plan")
    shards = pq.read_table(plan / "shards.parquet").to_pylist()
    assert [(Path(s["uri"]).name, s["rows"]) for s in shards] == [
        (f"shard.00000.mds.{algorithm}", 5),
        (f"shard.00001.mds.{algorithm}", 2),
    ]
    assert [s["bytes"] for s in shards] == [(folder / Path(s["uri"]).name).stat().st_size for s in shards]
    assert all(s["fingerprint"].startswith("mdsindex:") for s in shards)
    raw = plan_of(PAIRS, tmp_path / "raw")
    order = ["position", "shard_id", "row", "epoch"]  # deals differ: they follow the shards' bytes on disk
    want = pq.read_table(raw / "samples.parquet", columns=order).to_pydict()
    assert pq.read_table(plan / "samples.parquet", columns=order).to_pydict() == want
    assert records_of(plan) == records_of(raw)


def test_a_compression_zephon_does_not_decode_is_refused_at_planning_in_one_line(tmp_path: Path):
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': MDS shard .*/compressed/br/shard\.00000\.mds\.br must be compressed with one of "
        r"zstd, gz, bz2 \(or not at all\), got 'br' — rewrite the dataset with MDSWriter\(compression='zstd'\) or "
        r"None$",
    ):
        plan_of(FIXTURES / "records_mds" / "compressed" / "br", tmp_path / "plan")


def test_a_compressed_shard_changed_or_damaged_is_one_line_at_run_time_and_at_planning(tmp_path: Path):
    folder = tmp_path / "packed"
    shutil.copytree(FIXTURES / "records_mds" / "compressed" / "zstd", folder)
    plan = plan_of(folder, tmp_path / "plan")
    shard = folder / "shard.00001.mds.zstd"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, same header: the digest of the compressed bytes tells
    shard.write_bytes(bytes(data))
    with pytest.raises(
        DatasetError, match=r"^dataset 'pairs': MDS shard .*shard\.00001\.mds\.zstd changed since planning: it must "
    ):
        records_of(plan)
    shard.write_bytes(bytes(len(data)))  # zeros: not a zstd frame
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': MDS shard .*shard\.00001\.mds\.zstd must decompress with zstd, got .* — the shard is "
        r"damaged; copy it again$",
    ):
        plan_of(folder, tmp_path / "again")


def test_a_folder_missing_a_shard_index_json_lists_is_one_line(tmp_path: Path):
    folder = tmp_path / "pairs"
    shutil.copytree(PAIRS, folder)
    (folder / "shard.00001.mds").unlink()
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': MDS shard .*/pairs/shard\.00001\.mds must exist as index\.json lists, got no such "
        r"file — copy every shard index\.json lists$",
    ):
        plan_of(folder, tmp_path / "plan")


def test_a_compressed_shard_that_decompresses_to_another_size_than_index_json_says_is_one_line(tmp_path: Path):
    folder = tmp_path / "packed"
    shutil.copytree(FIXTURES / "records_mds" / "compressed" / "gz", folder)
    index = json.loads((folder / "index.json").read_text())
    index["shards"][1]["raw_data"]["bytes"] = 9999
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': MDS shard .*/shard\.00001\.mds\.gz must decompress to 9999 bytes as index\.json says, "
        r"got 2060 — the shard is from another write; copy it again$",
    ):
        plan_of(folder, tmp_path / "plan")


def test_where_and_cost_over_an_mds_datasets_own_columns_read_its_samples_at_planning(tmp_path: Path, s3):
    """label is -3, 7, 17, ... 57; score 0.0, 0.25, ... 1.5 (samples 0-4 in shard 0, 5-6 in shard 1)."""

    def planned(folder: str, out: Path, **selection: str) -> tuple[list[tuple[int, int]], list[int]]:
        ds = Dataset.from_path("pairs", folder, **selection)
        source = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"pairs": 1.0}), seed=11)
        samples = pq.read_table(source.plan(out) / "samples.parquet").to_pydict()
        return sorted(zip(samples["shard_id"], samples["row"], strict=True)), samples["tokens"]

    rows, _ = planned(str(PAIRS), tmp_path / "where", where="label > 10 AND score < 1.2 AND caption LIKE 'caption%'")
    assert rows == [(0, 2), (0, 3), (0, 4)]
    rows, costs = planned(str(PAIRS), tmp_path / "cost", cost="label + 3 + octet_length(image) * 0")
    assert rows == [(s, r) for s, n in ((0, 5), (1, 2)) for r in range(n)]
    by_row = dict(zip(rows, sorted(costs), strict=True))
    assert sorted(by_row.values()) == [e["label"] + 3 for e in EXPECTED]
    s3.upload_dir(PAIRS, "pairs/")  # on an object store: the same selection
    remote, _ = planned(s3.url("pairs/"), tmp_path / "s3", where="label > 10 AND score < 1.2")
    assert remote == [(0, 2), (0, 3), (0, 4)]
    with pytest.raises(DatasetError, match=r"^dataset 'pairs': [^\n]*must be a number ≥ 0 [^\n]*got negative"):
        planned(str(PAIRS), tmp_path / "bad", cost="label")


def test_a_malformed_index_json_is_named_in_one_line_not_taken_for_a_token_store(tmp_path: Path):
    folder = tmp_path / "pairs"
    shutil.copytree(PAIRS, folder)
    (folder / "index.json").write_text("{bad")
    with pytest.raises(DatasetError, match=r"^dataset 'pairs': \S+index\.json must be an MDS index \(JSON with a "
                       r"list of shards\), got JSONDecodeError: [^\n]* — write it again with MDSWriter$"):  # fmt: skip
        plan_of(folder, tmp_path / "plan")
    assert not (tmp_path / "plan").exists()


def test_a_record_dataloader_with_workers_hands_out_a_list_collates_batches_as_the_pipeline(tmp_path: Path):
    plan = plan_of(PAIRS, tmp_path / "plan")
    pipe = Pipeline.from_plan(plan).batch(microbatch_size=2, collate=list)
    want = [[r["label"] for r in b.data] for b in pipe]
    documents = dict(pipe.stats().documents)
    assert sum(documents.values()) == sum(len(b) for b in want)
    for workers in (0, 2):
        fresh = Pipeline.from_plan(plan).batch(microbatch_size=2, collate=list)
        got = [[r["label"] for r in data] for data in fresh.dataloader(num_workers=workers)]
        assert got == want and len(want) == 4
        assert fresh.stats().documents == documents  # the records the loader handed out, from every worker
