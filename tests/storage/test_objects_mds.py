"""MDS datasets of records on object stores (a real S3 server, moto; GCS's emulator): planned from index.json and
each shard's header by range GETs, read by one range GET per sample carrying the object's pin (or through the
shard cache); compressed shards read whole; a shard rewritten or removed since planning is one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from zephon import Pipeline
from zephon.errors import DatasetError
from zephon.io import Dataset
from zephon.specs import CacheOptions, StoreOptions
from zephon.storage.objects.reads import REQUESTS
from zephon.work import MixtureSpec, StaticMixtureWorkSource

MDS = Path(__file__).resolve().parents[1] / "fixtures" / "records_mds"
PAIRS = MDS / "pairs"


def plan(url: str, out: Path) -> Path:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("pairs", url)], mixture=MixtureSpec({"pairs": 1.0}), seed=11
    )
    return source.plan(out)


def records(plan_dir: Path, io_options: StoreOptions | None = None) -> list[dict]:
    pipe = Pipeline.from_plan(plan_dir)
    if io_options is not None:
        pipe = pipe.options(io_options=io_options)
    return [r for b in pipe.batch(microbatch_size=3, collate=list) for r in b.data]


def shard_rows(plan_dir: Path) -> list[dict]:
    return pq.read_table(plan_dir / "shards.parquet").to_pylist()


def requests() -> dict[str, int]:
    return {k: v for k, v in REQUESTS.items() if v}


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zcache"))


def test_an_mds_folder_on_s3_plans_from_its_index_and_headers_and_runs_as_its_local_copy(s3, tmp_path):
    s3.upload_dir(PAIRS, "pairs/")
    local = plan(str(PAIRS), tmp_path / "local-plan")
    REQUESTS.clear()
    remote = plan(s3.url("pairs/"), tmp_path / "s3-plan")
    # planning: one LIST, one GET of index.json, one header GET per shard (4 × (samples + 2) bytes): no payload
    assert requests() == {"list": 1, "mds_index": 1, "mds_header": 2}
    assert (local / "samples.parquet").read_bytes() == (remote / "samples.parquet").read_bytes()
    here, there = shard_rows(local), shard_rows(remote)
    assert [r["uri"] for r in there] == [s3.url("pairs/shard.00000.mds"), s3.url("pairs/shard.00001.mds")]
    assert all(r["fingerprint"].startswith("etag:") for r in there)
    drop = ("uri", "fingerprint")
    assert [{k: v for k, v in r.items() if k not in drop} for r in there] == [
        {k: v for k, v in r.items() if k not in drop} for r in here
    ]
    REQUESTS.clear()
    again = plan(s3.url("pairs/"), tmp_path / "s3-plan-again")  # each shard checked is remembered by its pin
    assert requests() == {"list": 1, "mds_index": 1}
    assert (again / "shards.parquet").read_bytes() == (remote / "shards.parquet").read_bytes()
    want = records(local)
    REQUESTS.clear()
    assert records(remote) == want  # range mode: the header once per shard, then one GET per sample
    assert requests() == {"mds_header": 2, "mds_samples": 7}
    cached = StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "shards"), limit_bytes=1 << 30))
    REQUESTS.clear()
    assert records(remote, cached) == want  # cache mode: each shard downloaded whole, once
    assert requests() == {"whole": 2}


def test_a_run_on_s3_resumes_mid_run_with_the_batches_it_had_left(s3, tmp_path):
    s3.upload_dir(PAIRS, "pairs/")
    remote = plan(s3.url("pairs/"), tmp_path / "s3-plan")
    full = records(remote)
    pipe = Pipeline.from_plan(remote).batch(microbatch_size=3, collate=list)
    it = iter(pipe)
    head = [r for _ in range(1) for r in next(it).data]
    state = pipe.state_dict()
    assert (state["step"], state["microbatch"]) == (1, 0)
    again = Pipeline.from_plan(remote).batch(microbatch_size=3, collate=list)
    again.load_state_dict(state)
    assert head + [r for b in again for r in b.data] == full


@pytest.mark.parametrize("algorithm", ["zstd", "gz", "bz2"])
def test_compressed_mds_shards_on_s3_are_read_whole_and_decompressed(s3, tmp_path, algorithm):
    folder = MDS / "compressed" / algorithm
    s3.upload_dir(folder, "packed/")
    local = plan(str(folder), tmp_path / "local-plan")
    REQUESTS.clear()
    remote = plan(s3.url("packed/"), tmp_path / "s3-plan")
    assert requests() == {"list": 1, "mds_index": 1, "whole": 2}  # a compressed shard cannot be read by range
    assert (local / "samples.parquet").read_bytes() == (remote / "samples.parquet").read_bytes()
    assert [r["uri"].rpartition("/")[2] for r in shard_rows(remote)] == [
        f"shard.0000{i}.mds.{algorithm}" for i in range(2)
    ]
    want = records(plan(str(PAIRS), tmp_path / "raw-plan"))  # the same samples, written uncompressed
    assert records(local) == want
    REQUESTS.clear()
    assert records(remote) == want
    assert requests() == {"whole": 2}


def test_an_mds_shard_rewritten_on_s3_after_planning_is_refused_by_its_pin(s3, tmp_path):
    s3.upload_dir(PAIRS, "pairs/")
    remote = plan(s3.url("pairs/"), tmp_path / "s3-plan")
    data = bytearray((PAIRS / "shard.00000.mds").read_bytes())
    data[-1] ^= 0xFF  # same size, same header: only the store's ETag tells
    s3.put("pairs/shard.00000.mds", bytes(data))
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': object s3://[^ ]+/pairs/shard\.00000\.mds changed since planning: its ETag must match "
        r"the plan's pin, got another version \(HTTP 412\) — restore the planned object or re-plan$",
    ):
        records(remote)


def test_an_mds_shard_missing_from_s3_is_one_line_at_planning_and_at_run_time(s3, s3_server, tmp_path):
    s3.upload_dir(PAIRS, "pairs/")
    remote = plan(s3.url("pairs/"), tmp_path / "s3-plan")
    s3_server.client().delete_object(Bucket=s3.name, Key="pairs/shard.00001.mds")
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': object s3://[^ ]+/pairs/shard\.00001\.mds must exist, got HTTP 404 [^\n]*$",
    ):
        records(remote)
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': MDS shard s3://[^/]+/pairs/shard\.00001\.mds must exist as index\.json lists, got no "
        r"such object — upload every shard index\.json lists$",
    ):
        plan(s3.url("pairs/"), tmp_path / "again")


def test_bad_mds_folders_on_s3_are_one_line_naming_the_dataset_and_object(s3, tmp_path):
    s3.upload_dir(PAIRS, "nameless/")
    s3_server_delete = s3.server.client().delete_object
    s3_server_delete(Bucket=s3.name, Key="nameless/index.json")
    with pytest.raises(DatasetError, match=r"^dataset 'pairs': MDS folder s3://[^/]+/nameless/ must hold index\.json"):
        plan(s3.url("nameless/"), tmp_path / "p1")
    s3.upload_dir(PAIRS, "broken/")
    s3.put("broken/index.json", b'{"shards": [{"format": "mds"')
    with pytest.raises(
        DatasetError, match=r"^dataset 'pairs': s3://[^/]+/broken/index\.json must be an MDS index .*JSON"
    ):
        plan(s3.url("broken/"), tmp_path / "p2")
    s3.upload_dir(PAIRS, "short/")
    size = (PAIRS / "shard.00001.mds").stat().st_size
    s3.put("short/shard.00001.mds", (PAIRS / "shard.00001.mds").read_bytes()[: size - 10])
    with pytest.raises(
        DatasetError, match=r"^dataset 'pairs': MDS shard s3://[^ ]+/short/shard\.00001\.mds must be 2060 "
    ):
        plan(s3.url("short/"), tmp_path / "p3")
    s3.upload_dir(MDS.parent / "token_stores" / "mds" / "int32", "tokens/")
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': s3://[^ ]+/tokens/index\.json must describe MDS records .* got a token store's columns "
        r"— read it as a token store: Dataset\.from_path\(\.\.\., fmt=\"mds\"\)$",
    ):
        plan(s3.url("tokens/"), tmp_path / "p5")
    s3.upload_dir(MDS / "compressed" / "br", "brotli/")
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': MDS shard s3://[^ ]+/brotli/shard\.00000\.mds\.br must be compressed "
        r"with one of zstd, gz, bz2 \(or not at all\), got 'br'",
    ):
        plan(s3.url("brotli/"), tmp_path / "p4")


def test_a_header_that_disagrees_with_index_json_is_one_line(s3, tmp_path):
    folder = tmp_path / "pairs"
    shutil.copytree(PAIRS, folder)
    data = bytearray((folder / "shard.00000.mds").read_bytes())
    data[0:4] = (4).to_bytes(4, "little")  # 4 samples where index.json says 5
    (folder / "shard.00000.mds").write_bytes(bytes(data))
    s3.upload_dir(folder, "pairs/")
    with pytest.raises(
        DatasetError, match=r"^dataset 'pairs': MDS shard s3://[^ ]+/shard\.00000\.mds must hold 5 samples"
    ):
        plan(s3.url("pairs/"), tmp_path / "plan")


@pytest.mark.parametrize("bucket", ["gs"], indirect=True)  # S3 above; Azure's emulator runs in CI only
def test_mds_on_gcs_plans_and_runs_as_on_s3(bucket, tmp_path, monkeypatch):
    gcs = bucket
    gcs.upload_dir(PAIRS, "pairs/")
    local, remote = plan(str(PAIRS), tmp_path / "local-plan"), plan(gcs.url("pairs/"), tmp_path / "gs-plan")
    assert (local / "samples.parquet").read_bytes() == (remote / "samples.parquet").read_bytes()
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "a-training-node"))
    assert records(remote) == records(local)
