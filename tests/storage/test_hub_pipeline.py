"""hf:// datasets end to end: pinned at load, planned from footers only, read through the shard cache."""

from __future__ import annotations

import gzip
import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from servers.hub_fixtures import fineweb_shard
from tokenizers import Tokenizer

from zephon import Pipeline
from zephon.errors import ConfigError, DatasetError, HubError
from zephon.io import Dataset
from zephon.specs import CacheOptions, StoreOptions
from zephon.storage.shard_cache import ShardCache
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource

FINEWEB = "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train"


def full_downloads(hub) -> list[str]:
    """Resolve requests that transferred a whole file (GET without a Range header)."""
    return [r.path for r in hub.requests if "/resolve/" in r.path and r.method == "GET" and r.range is None]


def fineweb_source(seed: int = 42, **kw) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path("fineweb_edu", FINEWEB)], mixture=MixtureSpec({"fineweb_edu": 1.0}), seed=seed, **kw
    )


def test_loading_pins_the_revision_and_the_plan_records_it(reference_hub, tmp_path) -> None:
    _, commits = reference_hub
    ds = Dataset.from_path("fineweb_edu", FINEWEB)
    assert ds.pinned == f"hf://HuggingFaceFW/fineweb-edu@{commits['fineweb_main']}~original/sample-10BT/train"
    assert [f.uri for f in ds.files] == [
        f"hf://datasets/HuggingFaceFW/fineweb-edu@{commits['fineweb_main']}/sample/10BT/00{i}_00000.parquet"
        for i in range(3)
    ]
    plan = fineweb_source().plan(tmp_path / "plan")
    m = json.loads((plan / "plan.json").read_text())
    assert m["datasets"][0]["path"] == FINEWEB and m["datasets"][0]["pinned"] == ds.pinned
    # The pinned form is itself a path that resolves to the same files.
    assert [f.uri for f in Dataset.from_path("again", ds.pinned).files] == [f.uri for f in ds.files]


def test_planning_a_parquet_dataset_reads_footers_only(reference_hub, tmp_path) -> None:
    hub, _ = reference_hub
    hub.clear_requests()
    fineweb_source().plan(tmp_path / "plan")
    assert full_downloads(hub) == []
    ranged = [r for r in hub.requests if r.range is not None]
    assert len(ranged) == 6  # two range requests (tail, footer) per shard
    total = sum(f.size for f in Dataset.from_path("x", FINEWEB).files)
    assert sum(r.body_bytes for r in ranged) < total / 4
    # A second plan reuses the cached footers: no file request at all.
    hub.clear_requests()
    fineweb_source(seed=7).plan(tmp_path / "plan2")
    assert [r for r in hub.requests if "/resolve/" in r.path] == []


def stream_of(batches) -> np.ndarray:
    return np.concatenate([b.tokens[i, : b.lengths[i]] for b in batches for i in range(len(b))])


def test_pipeline_reads_remote_shards_through_a_bounded_cache(reference_hub, tmp_path, tokenizer_dir) -> None:
    hub, _ = reference_hub
    # One packing lane: rows are the plan-order token stream cut into rows.
    plan = fineweb_source(shuffle=ShuffleSpec(window_shards=1), lanes=1).plan(tmp_path / "plan")
    sizes = [f.size for f in Dataset.from_path("x", FINEWEB).files]
    limit = max(sizes) * 2 + 16  # holds two of the three shards
    cache = CacheOptions(enabled=True, root=str(tmp_path / "cache"), limit_bytes=limit)
    pipe = (
        Pipeline.from_plan(plan)
        .options(io_options=StoreOptions(cache=cache))
        .tokenize(tokenizer_id=tokenizer_dir, field="text")
        .pack_flat(max_length=65)
        .batch(microbatch_size=4)
    )
    batches = list(pipe)
    # Independent check: tokenize the planned rows read straight from the server's files.
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    shards = pq.read_table(plan / "shards.parquet").to_pylist()
    samples = pq.read_table(plan / "samples.parquet").to_pylist()
    files = hub.files_at("HuggingFaceFW/fineweb-edu")
    texts = {
        s["shard_id"]: pq.read_table(io.BytesIO(files[s["uri"].split("@", 1)[1].split("/", 1)[1]]))
        .column("text")
        .to_pylist()
        for s in shards
    }
    expected = [
        t for s in samples for t in [*tok.encode(texts[s["shard_id"]][s["row"]], add_special_tokens=False).ids, 0]
    ]
    assert np.array_equal(stream_of(batches), np.array(expected))
    assert ShardCache(tmp_path / "cache", limit).total_bytes() <= limit
    # Each shard downloaded once (window 1: shards are read one after another).
    downloads = full_downloads(hub)
    assert sorted(downloads) == sorted(set(downloads)) and len(downloads) == 3


def test_remote_plan_without_the_cache_is_refused(reference_hub, tmp_path, tokenizer_dir) -> None:
    plan = fineweb_source().plan(tmp_path / "plan")
    pipe = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=65).batch(microbatch_size=2)
    )
    with pytest.raises(ConfigError, match="remote shards must be read through the shard cache"):
        next(iter(pipe))


def test_a_shard_larger_than_the_cache_limit_fails_at_start(reference_hub, tmp_path, tokenizer_dir) -> None:
    plan = fineweb_source().plan(tmp_path / "plan")
    cache = CacheOptions(enabled=True, root=str(tmp_path / "cache"), limit_bytes=1000)
    pipe = (
        Pipeline.from_plan(plan)
        .options(io_options=StoreOptions(cache=cache))
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=65)
        .batch(microbatch_size=2)
    )
    hub, _ = reference_hub
    hub.clear_requests()
    with pytest.raises(DatasetError, match="limit"):
        next(iter(pipe))
    assert full_downloads(hub) == []


def test_a_moved_branch_does_not_change_what_a_plan_reads(reference_hub, tmp_path, tokenizer_dir) -> None:
    from servers.hub_fixtures import fineweb_shard

    hub, commits = reference_hub
    plan = fineweb_source().plan(tmp_path / "plan")
    cache = CacheOptions(enabled=True, root=str(tmp_path / "cache"), limit_bytes=1 << 30)

    def run() -> np.ndarray:
        pipe = (
            Pipeline.from_plan(plan)
            .options(io_options=StoreOptions(cache=cache))
            .tokenize(tokenizer_id=tokenizer_dir)
            .pack_flat(max_length=65)
            .batch(microbatch_size=4)
        )
        return stream_of(list(pipe))

    before = run()
    new = hub.commit("HuggingFaceFW/fineweb-edu", {"sample/10BT/000_00000.parquet": fineweb_shard(99)}, keep=True)
    assert new != commits["fineweb_main"]
    assert (
        Dataset.from_path("x", FINEWEB).pinned
        != Dataset.from_path("y", FINEWEB.replace("/sample", f"@{commits['fineweb_main']}/sample")).pinned
    )
    # Same plan, fresh cache: the pinned commit is still what is read.
    cache = CacheOptions(enabled=True, root=str(tmp_path / "cache2"), limit_bytes=1 << 30)
    assert np.array_equal(run(), before)


def test_show_reads_remote_text_through_the_shard_cache(reference_hub, tmp_path) -> None:
    from click.testing import CliRunner

    from zephon.cli import cli

    plan = fineweb_source(shuffle=ShuffleSpec(enabled=False)).plan(tmp_path / "plan")
    result = CliRunner().invoke(cli, ["show", str(plan), "--step", "0", "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    first_text = (
        pq.read_table(
            io.BytesIO(reference_hub[0].files_at("HuggingFaceFW/fineweb-edu")["sample/10BT/000_00000.parquet"])
        )
        .column("text")[0]
        .as_py()
    )
    assert first_text[:20] in result.output


C4_README = """---
configs:
- config_name: en
  data_files:
  - split: train
    path: "en/c4-train.*.json.gz"
  - split: validation
    path: "en/c4-validation.*.json.gz"
---
"""


def test_c4s_json_gz_uploads_are_read_as_json_lines(hub_server, tmp_path, tokenizer_dir) -> None:
    """allenai/c4 uploads its documents as ``en/c4-train.NNNNN-of-01024.json.gz`` (JSON lines, gzip): the files
    Zephon reads locally are read from the Hub — they were taken for unsupported, so the path fell back to the
    Hub's conversion, which for C4 is partial and refused: the corpus could not be read at all."""
    texts = [[f"c4 shard {s} document {i} " + "word " * (i % 7) for i in range(40)] for s in range(2)]
    files = {
        f"en/c4-train.0000{s}-of-01024.json.gz": gzip.compress(
            "".join(
                json.dumps({"text": t, "timestamp": "2019-04-25T12:57:54Z", "url": "u"}) + "\n" for t in shard
            ).encode()
        )
        for s, shard in enumerate(texts)
    }
    files["en/c4-validation.00000-of-00008.json.gz"] = gzip.compress(b'{"text": "held out"}\n')
    files["stats.json.gz"] = gzip.compress(b'{"documents": 80}\n')  # outside the split's patterns: not read
    hub_server.add_dataset("allenai/c4", files, readme=C4_README)
    ds = Dataset.from_path("c4", "hf://allenai/c4/en/train")
    assert [(f.uri.rsplit("/", 1)[-1], f.format) for f in ds.files] == [
        ("c4-train.00000-of-01024.json.gz", "jsonl.gz"),
        ("c4-train.00001-of-01024.json.gz", "jsonl.gz"),
    ]
    assert "~original/en/train" in ds.pinned
    plan = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"c4": 1.0}), seed=3, lanes=1).plan(
        tmp_path / "plan"
    )
    cache = CacheOptions(enabled=True, root=str(tmp_path / "cache"), limit_bytes=1 << 20)
    pipe = (
        Pipeline.from_plan(plan)
        .options(io_options=StoreOptions(cache=cache))
        .tokenize(tokenizer_id=tokenizer_dir, field="text")
        .pack_flat(max_length=4096)
        .batch(microbatch_size=1)
    )
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    shard_texts = {
        s["shard_id"]: texts[int(s["uri"].split("c4-train.")[1][:5])]
        for s in pq.read_table(plan / "shards.parquet").to_pylist()
    }
    expected = [
        t
        for s in pq.read_table(plan / "samples.parquet").to_pylist()
        for t in [*tok.encode(shard_texts[s["shard_id"]][s["row"]], add_special_tokens=False).ids, 0]
    ]
    assert np.array_equal(stream_of(pipe), np.array(expected))
    assert pipe.stats().documents["c4"] == 80


def test_a_json_gz_beside_parquet_uploads_is_not_read_as_the_splits_data(hub_server) -> None:
    """Beside Parquet files a ``.json.gz`` is a side file of another kind (local paths leave it out): the split
    is not a mix of both — with the files unsupported as a whole, the default source reads the conversion, and
    ``~original`` names the file."""
    hub_server.add_dataset(
        "org/mixed", {"data/train-0.parquet": fineweb_shard(1), "data/train-stats.json.gz": gzip.compress(b"{}\n")}
    )
    with pytest.raises(HubError, match=r"got 'data/train-stats.json.gz' \(1 unsupported of 2\)"):
        Dataset.from_path("m", "hf://org/mixed@~original/train")
