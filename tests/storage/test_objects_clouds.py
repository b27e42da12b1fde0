"""The same guarantees on every cloud, each against its own real server on 127.0.0.1: S3 (moto), GCS
(fake-gcs-server, through STORAGE_EMULATOR_HOST) and Azure (Azurite, through AZURE_STORAGE_CONNECTION_STRING).

A plan over the bucket equals the plan over a local copy (samples.parquet byte for byte), its batches equal the
local run's in cache mode and in range mode, and an object rewritten after planning is refused by name.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl_dataset, write_parquet_dataset
from test_objects_s3 import cache_io, run, source

from zephon.errors import DatasetError
from zephon.io import Dataset
from zephon.specs import StoreOptions
from zephon.storage.objects.reads import REQUESTS


def test_plans_and_batches_equal_the_local_copy(bucket, tmp_path, tokenizer_dir) -> None:
    web = write_parquet_dataset(tmp_path / "local", "web", [33, 21, 40], row_group_size=7)
    code = write_jsonl_dataset(tmp_path / "local", "code", [30, 26], compression="zst")
    bucket.upload_dir(web, "data/web/")
    bucket.upload_dir(code, "data/code/")
    local = source(Dataset.from_path("web", str(web)), Dataset.from_path("code", str(code)))
    spelled = {"s3": "s3", "gs": "gcs", "az": "az"}[bucket.cloud]  # gcs:// is pasted as often as gs://
    remote = source(
        Dataset.from_path("web", f"{spelled}://{bucket.name}/data/web/"),
        Dataset.from_path("code", bucket.url("data/code/*.jsonl.zst")),
    )
    a, b = local.plan(tmp_path / "a"), remote.plan(tmp_path / "b")
    assert (a / "samples.parquet").read_bytes() == (b / "samples.parquet").read_bytes()
    shards = pq.read_table(b / "shards.parquet").to_pylist()
    assert all(s["uri"].startswith(f"{bucket.cloud}://{bucket.name}/data/") for s in shards)
    assert all(s["fingerprint"].startswith("etag:") for s in shards)
    if bucket.cloud == "gs":  # GCS pins the generation too: GETs read exactly that generation
        assert all("@" in s["fingerprint"] for s in shards)
    expected = run(a, tokenizer_dir)
    REQUESTS.clear()
    assert run(b, tokenizer_dir, cache_io(tmp_path)) == expected
    assert REQUESTS["whole"] == 5  # each object downloaded once into the cache
    assert run(b, tokenizer_dir, StoreOptions(remote_read="range")) == expected


def test_an_object_rewritten_after_planning_is_refused(bucket, tmp_path, tokenizer_dir) -> None:
    web = write_parquet_dataset(tmp_path / "local", "web", [20, 20])
    bucket.upload_dir(web, "web/")
    plan = source(Dataset.from_path("web", bucket.url("web/"))).plan(tmp_path / "plan")
    other = write_parquet_dataset(tmp_path / "other", "web", [20, 21])
    bucket.put("web/part-00000.parquet", (other / "part-00000.parquet").read_bytes() + b"")
    bucket.put("web/part-00001.parquet", (other / "part-00001.parquet").read_bytes())
    for io in (cache_io(tmp_path), StoreOptions(remote_read="range")):
        with pytest.raises(
            DatasetError,
            match=rf"^object {bucket.cloud}://{bucket.name}/web/part-0000[01]\.parquet "
            "changed since planning",
        ):
            run(plan, tokenizer_dir, io)
