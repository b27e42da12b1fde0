"""MDS datasets of records on the Hub (the Hub test server): the split's index.json names the shards, each planned
from one range request of its header, read through the shard cache as every hf:// shard is."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_objects_mds import MDS, PAIRS, plan, records

from zephon.errors import DatasetError
from zephon.specs import CacheOptions, StoreOptions


def upload(hub_server, repo: str, folder: Path) -> None:
    hub_server.add_dataset(repo, {f"train/{p.name}": p.read_bytes() for p in sorted(folder.iterdir())})


def test_a_hub_mds_split_plans_from_index_json_and_headers_and_runs_as_its_local_copy(hub_server, tmp_path):
    upload(hub_server, "org/pairs", PAIRS)
    local = plan(str(PAIRS), tmp_path / "local-plan")
    hub_server.clear_requests()
    remote = plan("hf://org/pairs/train", tmp_path / "hub-plan")
    assert (local / "samples.parquet").read_bytes() == (remote / "samples.parquet").read_bytes()
    shards = pq.read_table(remote / "shards.parquet").to_pylist()
    assert [s["uri"].rpartition("/")[2] for s in shards] == ["shard.00000.mds", "shard.00001.mds"]
    assert [s["format"] for s in shards] == ["mds", "mds"] and all(s["fingerprint"].startswith("etag:") for s in shards)
    files = [r for r in hub_server.requests if "/resolve/" in r.path and r.method == "GET"]
    # index.json (840 bytes), then each shard's header: 4 × (5 + 2) and 4 × (2 + 2) bytes — no sample bytes
    assert [r.body_bytes for r in files] == [840, 28, 16]
    cache = StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "cache"), limit_bytes=1 << 30))
    assert records(remote, cache) == records(local)


def test_a_compressed_hub_mds_split_is_downloaded_to_plan_and_runs(hub_server, tmp_path):
    upload(hub_server, "org/packed", MDS / "compressed" / "zstd")
    remote = plan("hf://org/packed/train", tmp_path / "hub-plan")
    assert pq.read_table(remote / "shards.parquet").column("bytes").to_pylist() == [1543, 1064]
    cache = StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "cache"), limit_bytes=1 << 30))
    assert records(remote, cache) == records(plan(str(PAIRS), tmp_path / "local-plan"))


def test_a_hub_mds_split_missing_a_shard_is_one_line(hub_server, tmp_path):
    hub_server.add_dataset(
        "org/partial", {f"train/{n}": (PAIRS / n).read_bytes() for n in ("index.json", "shard.00000.mds")}
    )
    with pytest.raises(
        DatasetError, match=r"^MDS shard hf://datasets/org/partial@[0-9a-f]{40}/train/shard\.00001\.mds must exist"
    ):
        plan("hf://org/partial/train", tmp_path / "plan")


def test_a_hub_mds_run_resumes_mid_run_with_the_batches_it_had_left(hub_server, tmp_path):
    from zephon import Pipeline

    upload(hub_server, "org/resumed", PAIRS)
    remote = plan("hf://org/resumed/train", tmp_path / "hub-plan")
    cache = StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "cache"), limit_bytes=1 << 30))

    def pipe():
        return Pipeline.from_plan(remote).options(io_options=cache).batch(microbatch_size=2, collate=list)

    full = [r["caption"] for b in pipe() for r in b.data]
    first = pipe()
    it = iter(first)
    head = [r["caption"] for _ in range(2) for r in next(it).data]
    state = first.state_dict()
    assert (state["step"], state["microbatch"]) == (2, 0)
    again = pipe()
    again.load_state_dict(state)
    assert head + [r["caption"] for b in again for r in b.data] == full
    assert sorted(full) == sorted(f"caption {i} é" for i in range(7))
