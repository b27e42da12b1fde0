"""A full disk or a read-only cache directory: a clear error (what, where, the fix) and nothing half-written.

Two ways to get there:

* real file systems — a 40 KiB tmpfs (full) and a tmpfs remounted read-only, mounted by the test (tests run as
  root; the tests skip where ``mount`` is not permitted, e.g. an unprivileged container);
* simulated — the lowest-level write (``numpy.save``/``savez``, ``os.fsync``, a fetch's ``write``) monkeypatched
  to write part of its bytes, then raise ``OSError(ENOSPC)`` or ``OSError(EROFS)``; these always run.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon import Pipeline
from zephon.errors import StorageError
from zephon.executor.encode.text import Encoder
from zephon.io import Dataset
from zephon.planner.counts.lengths import token_counts
from zephon.specs import CacheOptions, StoreOptions, TokenizeSpec
from zephon.storage.shard_cache import CacheEntrySpec, ShardCache
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource

FINEWEB = "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train"
DISK_FULL = re.escape("got a full disk (ENOSPC: no space left on device) — free space on that file system")
READ_ONLY = re.escape("got a read-only file system (EROFS) — make that file system writable")


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); the simulated tests cover this code")


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 40 KiB tmpfs (10 pages), unmounted afterwards."""
    mnt = tmp_path / "tiny"
    mount_tmpfs(mnt, "40k")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def remount_read_only(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, capture_output=True)


def all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def jsonl_dataset(root: Path) -> Path:
    (root / "web").mkdir(parents=True)
    lines = "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(20))
    (root / "web" / "part-0.jsonl").write_text(lines)
    return root / "web"


def one_dataset(path: Path | str, **kw) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(path))], mixture=MixtureSpec({"web": 1}), seed=0, **kw
    )


# ---------------------------------------------------------------- real file systems
def test_shard_cache_on_a_full_disk_fails_clearly_and_keeps_only_complete_shards(
    reference_hub, tmpfs, tmp_path, tokenizer_dir
) -> None:
    hub, _ = reference_hub
    plan = one_dataset(FINEWEB, shuffle=ShuffleSpec(window_shards=1), lanes=1).plan(tmp_path / "plan")
    cache = CacheOptions(enabled=True, root=str(tmpfs / "cache"), limit_bytes=1 << 30)  # more than the disk has
    pipe = (
        Pipeline.from_plan(plan)
        .options(io_options=StoreOptions(cache=cache))
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=65)
        .batch(microbatch_size=4)
    )
    with pytest.raises(StorageError) as failed:
        list(pipe)
    message = str(failed.value)
    # The disk fills during a download (the .part) or, when a download just fit, while its sidecar is written.
    assert re.match(
        rf"shard 'hf/HuggingFaceFW/fineweb-edu/\w+/sample/10BT/\w+\.parquet' must be written to {re.escape(str(tmpfs))}/cache/(tmp/\S+\.part|meta/\S+\.json), {DISK_FULL}, or point CacheOptions.root at another disk, or lower CacheOptions.limit_bytes to the space it has$",
        message,
    ), message
    files = all_files(tmpfs / "cache")
    assert not [f for f in files if f.startswith("tmp/")]  # the partial download is gone
    entries = ShardCache(cache.root, None).entries()
    assert 1 <= len(entries) < 3
    served = hub.files_at("HuggingFaceFW/fineweb-edu")
    for entry in entries:  # what remains is complete and correct
        assert entry.path.read_bytes() == served[entry.key.split("/", 4)[4]]


def test_read_only_cache_directories_fail_clearly(tmpfs, tmp_path, monkeypatch) -> None:
    (tmpfs / "zephon").mkdir()
    remount_read_only(tmpfs)
    with pytest.raises(
        StorageError,
        match=rf"^the shard cache must be written to {re.escape(str(tmpfs))}/cache, {READ_ONLY}, or point CacheOptions.root at another disk",
    ):
        ShardCache(tmpfs / "cache", 1000)
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmpfs / "zephon"))
    with pytest.raises(
        StorageError,
        match=rf"^the JSONL index cache must be written to {re.escape(str(tmpfs))}/zephon/jsonl-index/\w+\.npz, {READ_ONLY}, or set ZEPHON_CACHE_DIR to a writable directory with free space$",
    ):
        one_dataset(jsonl_dataset(tmp_path / "data")).plan(tmp_path / "plan")


# ---------------------------------------------------------------- simulated (always run)
def enospc(path: object) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_count_arrays_on_a_full_disk_leave_nothing_half_written(tmp_path, tokenizer_dir, monkeypatch) -> None:
    from zephon.planner.prepare import shard_refs

    (tmp_path / "web").mkdir()
    pq.write_table(pa.table({"text": ["a b c", "d e"]}), tmp_path / "web" / "p.parquet")
    refs = [r for group in shard_refs(one_dataset(tmp_path / "web")) for r in group]
    real_save = np.save

    def save(file, array, *args, **kwargs) -> None:  # writes half of the array's bytes, then the disk is full
        real_save(file, array, *args, **kwargs)
        data = Path(file).read_bytes()
        Path(file).write_bytes(data[: len(data) // 2])
        raise enospc(file)

    monkeypatch.setattr(np, "save", save)
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir)
    with pytest.raises(
        StorageError,
        match=rf"^the token-count cache must be written to \S+/token-counts/\w+\.npy, {DISK_FULL}, or set ZEPHON_CACHE_DIR",
    ):
        token_counts(refs, spec, Encoder(spec), workers=1)
    assert all_files(Path(os.environ["ZEPHON_CACHE_DIR"]) / "token-counts") == []
    monkeypatch.setattr(np, "save", real_save)
    arrays, report = token_counts(refs, spec, Encoder(spec), workers=1)  # once there is room: counted
    assert report.counted == 1 and len(arrays[0]) == 2


def test_read_only_jsonl_index_simulated(tmp_path, monkeypatch) -> None:
    def savez(file, **arrays) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))

    monkeypatch.setattr(np, "savez", savez)
    with pytest.raises(StorageError, match=rf"^the JSONL index cache must be written to \S+\.npz, {READ_ONLY}"):
        one_dataset(jsonl_dataset(tmp_path / "data")).plan(tmp_path / "plan")
    assert all_files(Path(os.environ["ZEPHON_CACHE_DIR"])) == []


def test_shard_cache_download_that_fills_the_disk_is_removed(tmp_path) -> None:
    def fetch(path: str) -> None:
        with open(path, "wb") as f:
            f.write(b"x" * 600)
            raise enospc(path)

    root = tmp_path / "cache"
    with ShardCache(root, 10_000) as cache:
        with pytest.raises(
            StorageError,
            match=rf"^shard 'k/000.parquet' must be written to {re.escape(str(root))}/tmp/\S+\.part, {DISK_FULL}, or point CacheOptions.root",
        ):
            cache.acquire(CacheEntrySpec(key="k/000.parquet", size=1000, etag="e", fetch=fetch))
        assert [f for f in all_files(root) if not f.startswith("locks/")] == ["zephon-cache.lock"]
        assert cache.total_bytes() == 0


def test_hub_download_with_a_failing_fsync_is_removed(reference_hub, tmp_path, monkeypatch) -> None:
    from zephon.storage.hub.client import download_remote_file, resolve_hf_dataset

    file = resolve_hf_dataset(FINEWEB).files[0]
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(enospc(f"fd {fd}")))
    dest = tmp_path / "out" / "x.parquet"
    with pytest.raises(
        StorageError,
        match=rf"^the download of sample/10BT/000_00000.parquet of dataset HuggingFaceFW/fineweb-edu at \w+ must be written to {re.escape(str(dest))}\.part-\d+, {DISK_FULL}, or download to another directory",
    ):
        download_remote_file(file, str(dest))
    assert list((tmp_path / "out").iterdir()) == []
    spec_root = tmp_path / "cache"
    with ShardCache(spec_root, None) as cache:  # through the cache: the cache words the fix
        from zephon.executor.read.shard_reader import remote_spec
        from zephon.plan.records import ShardRef

        ref = ShardRef(
            shard_id=0,
            dataset_id=0,
            dataset="web",
            uri=f"hf://datasets/{file.repo_id}@{file.revision}/{file.path_in_repo}",
            format="parquet",
            rows=100,
            bytes=file.size,
            fingerprint=f"etag:{file.etag}",
        )
        with pytest.raises(
            StorageError,
            match=rf"must be written to {re.escape(str(spec_root))}/tmp/\S+\.part, {DISK_FULL}, or point CacheOptions.root",
        ):
            cache.acquire(remote_spec(ref))
        assert cache.total_bytes() == 0 and list((spec_root / "tmp").iterdir()) == []


def test_planning_into_an_unwritable_cache_directory_is_a_storage_error(tmp_path, monkeypatch, tokenizer_dir) -> None:
    import errno
    import os as _os

    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon import Pipeline
    from zephon.errors import StorageError
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "d" / "a.parquet")
    src = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("a", tmp_path / "d")], mixture=MixtureSpec({"a": 1}), seed=0
    )
    real_mkdir = _os.mkdir

    def refuse(path, *args, **kwargs):  # the plans directory sits on a read-only file system
        if "plans" in str(path):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(_os, "mkdir", refuse)
    pipe = Pipeline(src).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=8).batch(microbatch_size=1)
    with pytest.raises(StorageError, match="the plan bundle must be written to .*plans.* got a read-only file system"):
        _ = pipe.plan_dir
