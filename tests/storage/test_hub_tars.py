"""WebDataset tar shards on the Hub (the Hub test server): uploaded tars are the dataset's files, planned from
range requests of their headers only, read through the shard cache as every hf:// shard is."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from test_objects_tars import keys_and_captions, plan, tar_bytes

from zephon.specs import CacheOptions, StoreOptions


def test_a_hub_webdataset_plans_from_header_ranges_and_runs_as_its_local_copy(hub_server, tmp_path: Path):
    folder = tmp_path / "wds"
    folder.mkdir()
    shards = {
        "train/00.tar": tar_bytes(0, 30),
        "train/01.tar": tar_bytes(1, 12, image=100_000),
        "train/02.tar.gz": tar_bytes(2, 7, gz=True),
    }
    for name, data in shards.items():
        (folder / name.split("/")[1]).write_bytes(data)
    hub_server.add_dataset("org/pairs", shards)
    local = plan(str(folder), tmp_path / "local-plan")
    hub_server.clear_requests()
    remote = plan("hf://org/pairs/train", tmp_path / "hub-plan")
    assert (local / "samples.parquet").read_bytes() == (remote / "samples.parquet").read_bytes()
    assert pq.read_table(remote / "shards.parquet").column("format").to_pylist() == ["tar", "tar", "tar.gz"]
    ranged = [r for r in hub_server.requests if "/resolve/" in r.path and r.range is not None]
    whole = [r for r in hub_server.requests if "/resolve/" in r.path and r.method == "GET" and r.range is None]
    # a window for 00.tar; for 01.tar a window, then a probe per jpg; the .tar.gz downloaded once (gzip cannot be
    # sought). Bytes: one 64 KiB window of 00.tar (70 KiB: its headers end within it), then 64 KiB + 12 probes of
    # 4 KiB of 01.tar's 1.2 MB — 176 KiB of 1.3 MB
    assert len(whole) == 1 and len(ranged) == 1 + 1 + 12
    assert sum(r.body_bytes for r in ranged) == 2 * (64 << 10) + 12 * (4 << 10)
    cache = StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "cache"), limit_bytes=1 << 30))
    assert keys_and_captions(remote, cache) == keys_and_captions(local)


def test_tar_archives_beside_parquet_files_are_left_out_as_before(hub_server):
    from servers.hub_fixtures import fineweb_shard

    from zephon.storage.hub.client import resolve_hf_dataset

    hub_server.add_dataset(
        "org/mixed", {"train/00.parquet": fineweb_shard(1), "train/images.tar.gz": tar_bytes(0, 3, gz=True)}
    )
    resolved = resolve_hf_dataset("hf://org/mixed/train")
    assert [(f.path_in_repo, f.format) for f in resolved.files] == [("train/00.parquet", "parquet")]
