"""WebDataset tar shards on object stores (a real S3 server, moto): planned from range GETs of the headers only,
indexed once per pin, read by one range GET per sample; a shard rewritten since planning is one line."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from zephon import Pipeline
from zephon.errors import DatasetError
from zephon.io import Dataset
from zephon.specs import CacheOptions, StoreOptions
from zephon.storage.objects.reads import REQUESTS
from zephon.storage.tar_index import tar_index
from zephon.storage.tar_windows import ranged_tar_index
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def tar_bytes(shard: int, samples: int, image: int = 300, *, gz: bool = False) -> bytes:
    """``{key}.jpg`` (``image`` bytes, not a real JPEG: nothing is decoded here) and ``{key}.txt`` per sample."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz" if gz else "w") as tar:
        for i in range(samples):
            key = f"{shard:02d}{i:04d}"
            for ext, payload in (("jpg", bytes([i % 251]) * image), ("txt", f"caption {shard}-{i}".encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def plan(url: str, out: Path) -> Path:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("pairs", url)], mixture=MixtureSpec({"pairs": 1.0}), seed=3
    )
    return source.plan(out)


def keys_and_captions(plan_dir: Path, io_options: StoreOptions | None = None) -> list[tuple[str, bytes]]:
    pipe = Pipeline.from_plan(plan_dir)
    if io_options is not None:
        pipe = pipe.options(io_options=io_options)
    batches = pipe.batch(microbatch_size=4)
    return [(k, t) for b in batches for k, t in zip(b.data["__key__"], b.data["txt"], strict=True)]


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    folder = tmp_path / "wds"
    folder.mkdir()
    (folder / "00.tar").write_bytes(tar_bytes(0, 30))
    (folder / "01.tar").write_bytes(tar_bytes(1, 12))
    (folder / "02.tar.gz").write_bytes(tar_bytes(2, 7, gz=True))
    return folder


def test_header_windows_fetch_64_kib_over_small_payloads_and_4_kib_past_large_ones():
    small = tar_bytes(0, 200, image=100)  # 200 samples, 4 blocks each: 400 KiB of tar
    reads: list[tuple[int, int]] = []

    def read(data: bytes):
        def get(start: int, end: int) -> bytes:
            reads.append((start, end))
            return data[start:end]

        return get

    index, requests = ranged_tar_index(read(small), len(small), "tar", "shard")
    assert len(index) == 200 and requests == len(reads)
    assert requests == -(-len(small) // (64 << 10))  # one window after another: 7 GETs for 200 samples
    reads.clear()
    large = tar_bytes(0, 10, image=100_000)  # a 100 KB payload between samples: skipped by a new, small GET
    index, requests = ranged_tar_index(read(large), len(large), "tar", "shard")
    assert requests == 11  # the first 64 KiB window, then one 4 KiB probe per jpg skipped (10 samples)
    assert [e - s for s, e in reads] == [64 << 10] + [4 << 10] * 10
    assert index.bytes_read == (64 << 10) + 10 * (4 << 10)  # 104 KiB read of a 1 MB shard
    with open_tar(large) as local:
        assert index.fingerprint == local.fingerprint  # the same listing digest as a local walk
        assert (index.offsets == local.offsets).all() and (index.sizes == local.sizes).all()


class open_tar:
    """The local index of ``data`` (written to a temporary file)."""

    def __init__(self, data: bytes) -> None:
        import tempfile

        self._dir = tempfile.TemporaryDirectory()
        self.path = Path(self._dir.name) / "x.tar"
        self.path.write_bytes(data)

    def __enter__(self):
        return tar_index(str(self.path), "tar", self.path.stat().st_size, "shard")

    def __exit__(self, *exc: object) -> None:
        self._dir.cleanup()


def test_a_webdataset_on_s3_plans_from_headers_and_runs_as_its_local_copy(s3, shards, tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zcache"))
    s3.upload_dir(shards, "wds/")
    local = plan(str(shards), tmp_path / "local-plan")
    REQUESTS.clear()
    remote = plan(s3.url("wds/"), tmp_path / "s3-plan")
    assert (local / "samples.parquet").read_bytes() == (remote / "samples.parquet").read_bytes()
    rows = pq.read_table(remote / "shards.parquet").to_pylist()
    assert [r["rows"] for r in rows] == [30, 12, 7] and all(r["fingerprint"].startswith("etag:") for r in rows)
    # planning: one header window per plain shard (each < 64 KiB), one whole GET for the .tar.gz
    assert (REQUESTS["tar_headers"], REQUESTS["whole"], REQUESTS["list"]) == (2, 1, 1)
    want = keys_and_captions(local)
    REQUESTS.clear()
    assert keys_and_captions(remote) == want  # range mode: the index by pin, one GET per sample
    assert REQUESTS["tar_headers"] == 0 and REQUESTS["tar_members"] == 30 + 12 and REQUESTS["whole"] == 1
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "a-training-node"))  # no index kept: rebuilt by header GETs
    REQUESTS.clear()
    assert keys_and_captions(remote) == want
    assert REQUESTS["tar_headers"] == 2 and REQUESTS["tar_members"] == 42
    cached = StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "shards"), limit_bytes=1 << 30))
    REQUESTS.clear()
    assert keys_and_captions(remote, cached) == want  # cache mode: each shard downloaded whole, once
    assert REQUESTS["whole"] == 3 and REQUESTS["tar_members"] == 0


def test_a_tar_object_rewritten_after_planning_is_refused_in_one_line(s3, shards, tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zcache"))
    s3.upload_dir(shards, "wds/")
    remote = plan(s3.url("wds/"), tmp_path / "s3-plan")
    s3.put("wds/00.tar", tar_bytes(5, 30))  # same size, other bytes: another ETag
    with pytest.raises(DatasetError, match=r"^[^\n]*wds/00\.tar[^\n]*changed[^\n]*$"):
        keys_and_captions(remote)


def test_webdataset_shards_on_each_cloud_plan_and_run_by_ranges(bucket, shards, tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zcache"))
    bucket.upload_dir(shards, "wds/")
    local, remote = plan(str(shards), tmp_path / "local-plan"), plan(bucket.url("wds/"), tmp_path / "remote-plan")
    assert (local / "samples.parquet").read_bytes() == (remote / "samples.parquet").read_bytes()
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "a-training-node"))
    assert keys_and_captions(remote) == keys_and_captions(local)
