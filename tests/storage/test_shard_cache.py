"""The shard cache: atomic downloads, safe names, cross-process locks, plan-aware eviction, prefetch.

Processes are started with multiprocessing "spawn"; fetch calls are counted through a file of marks
(one line per call: ``start|end key pid monotonic-time``) that every process appends to.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import wait
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from zephon.errors import ConfigError, DatasetError
from zephon.specs import CacheOptions
from zephon.storage.shard_cache import CacheEntrySpec, ShardCache
from zephon.storage.shard_cache_lock import entry_name

SPAWN = mp.get_context("spawn")


# ---------------------------------------------------------------- helpers (module level: spawn imports them)
def content(key: str, size: int) -> bytes:
    """The bytes of a shard, derived from its key."""
    return hashlib.shake_256(key.encode("utf-8", "surrogatepass")).digest(size)


def spec(
    key: str,
    size: int = 1000,
    *,
    marks: str | Path | None = None,
    etag: str = "e1",
    delay_s: float = 0.0,
    write: bytes | None = None,
    fail: str = "",
    verify: Callable[[str], None] | None = None,
) -> CacheEntrySpec:
    """A spec whose fetch marks each call in ``marks``, sleeps ``delay_s``, then writes the shard."""

    def fetch(path: str) -> None:
        if marks is not None:
            _mark(marks, f"start {key} {os.getpid()} {time.monotonic()}")
        if fail:
            raise RuntimeError(fail)
        time.sleep(delay_s)
        Path(path).write_bytes(content(key, size) if write is None else write)
        if marks is not None:
            _mark(marks, f"end {key} {os.getpid()} {time.monotonic()}")

    return CacheEntrySpec(key=key, size=size, etag=etag, fetch=fetch, verify=verify)


def _mark(marks: str | Path, line: str) -> None:
    with open(marks, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def fetches(marks: Path) -> list[str]:
    """Keys of the fetch calls so far, in order."""
    if not marks.exists():
        return []
    return [line.split()[1] for line in marks.read_text().splitlines() if line.startswith("start")]


def stored_files(root: Path) -> dict[str, list[str]]:
    return {d: sorted(p.name for p in (root / d).iterdir()) for d in ("shards", "meta", "tmp")}


def shard_bytes_on_disk(root: Path) -> int:
    """Bytes of complete shards, by scanning the directory (temporaries excluded)."""
    total = 0
    for entry in os.scandir(root / "shards"):
        with contextlib.suppress(FileNotFoundError):
            total += entry.stat().st_size
    return total


def drain(cache: ShardCache) -> None:
    """Wait until the prefetches queued so far have run (test hook on the cache's futures)."""
    wait(list(cache._prefetcher.pending), timeout=10)


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


# ---------------------------------------------------------------- download, check, reuse
def test_acquire_downloads_once_then_reuses_by_size_and_etag(tmp_path: Path) -> None:
    root, marks = tmp_path / "cache", tmp_path / "marks"
    with ShardCache(root, 10_000) as cache, cache.acquire(spec("hf/o/d/c/000.parquet", marks=marks)) as shard:
        assert shard.path.parent == root / "shards" and shard.path.name.endswith("-000.parquet")
        assert shard.path.read_bytes() == content("hf/o/d/c/000.parquet", 1000)
        meta = json.loads((root / "meta" / f"{shard.path.name}.json").read_text())
        assert meta == {"format": 1, "key": "hf/o/d/c/000.parquet", "size": 1000, "etag": "e1"}
    with ShardCache(root, 10_000) as again, again.acquire(spec("hf/o/d/c/000.parquet", marks=marks)):
        pass
    assert fetches(marks) == ["hf/o/d/c/000.parquet"]


def test_entry_with_another_etag_is_replaced(tmp_path: Path) -> None:
    root, marks = tmp_path / "cache", tmp_path / "marks"
    with ShardCache(root, 10_000) as cache:
        cache.acquire(spec("k", marks=marks, etag="old", write=b"o" * 1000)).close()
        with cache.acquire(spec("k", marks=marks, etag="new")) as shard:
            assert shard.path.read_bytes() == content("k", 1000)
        assert [(e.key, e.etag) for e in cache.entries()] == [("k", "new")]
    assert fetches(marks) == ["k", "k"]


def test_size_mismatch_raises_with_key_sizes_and_fix_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with ShardCache(root, 10_000) as cache:
        with pytest.raises(DatasetError, match=r"'s/1' must be 1000 bytes as planned, got 600 bytes .* new plan"):
            cache.acquire(spec("s/1", write=b"x" * 600))
        assert stored_files(root) == {"shards": [], "meta": [], "tmp": []}
        assert cache.total_bytes() == 0


def test_verify_and_fetch_failures_raise_dataset_error_and_leave_nothing(tmp_path: Path) -> None:
    def reject(path: str) -> None:
        raise ValueError("sha256 mismatch")

    root = tmp_path / "cache"
    with ShardCache(root, 10_000) as cache:
        with pytest.raises(DatasetError, match=r"'s/1' must pass verification, got ValueError: sha256 mismatch"):
            cache.acquire(spec("s/1", verify=reject))
        with pytest.raises(DatasetError, match=r"'s/2' must download, got RuntimeError: offline — check"):
            cache.acquire(spec("s/2", fail="offline"))
        assert stored_files(root) == {"shards": [], "meta": [], "tmp": []}


def _killed_download(root: str, started: str) -> None:
    def fetch(path: str) -> None:
        Path(path).write_bytes(b"partial")
        Path(started).touch()
        time.sleep(60)

    ShardCache(root, 10_000).acquire(CacheEntrySpec(key="big/000.parquet", size=1000, etag="e", fetch=fetch))


def test_killed_download_is_never_visible_and_its_leftover_is_cleaned(tmp_path: Path) -> None:
    root, started = tmp_path / "cache", tmp_path / "started"
    child = SPAWN.Process(target=_killed_download, args=(str(root), str(started)))
    child.start()
    try:
        wait_until(started.exists)
        files = stored_files(root)
        assert files["shards"] == [] and len(files["tmp"]) == 1 and files["tmp"][0].endswith(".part")
        assert ShardCache(root, 10_000, wait_timeout_s=1).total_bytes() == 0  # the live download is not touched
        assert len(stored_files(root)["tmp"]) == 1
    finally:
        child.kill()
        child.join(10)
    with ShardCache(root, 10_000) as cache:  # the next start deletes the orphaned temporary
        assert stored_files(root) == {"shards": [], "meta": [], "tmp": []}
        with cache.acquire(spec("big/000.parquet")) as shard:
            assert shard.path.read_bytes() == content("big/000.parquet", 1000)


# ---------------------------------------------------------------- names
@pytest.mark.parametrize(
    "key",
    [
        "../../etc/passwd",
        "/etc/passwd",
        "..",
        ".",
        "a/b/../../../../x.parquet",
        "dir/",
        "back\\slash\\..\\..\\x",
        "データ/résumé train.parquet",
        "\u202egnp.exe",
        "tab\tnewline\n.jsonl",
        "\udcff-lone-surrogate",
        "x" * 400 + ".parquet",
        ".hidden",
    ],
)
def test_any_key_gets_a_safe_file_name_inside_the_root(tmp_path: Path, key: str) -> None:
    root = tmp_path / "cache"
    with ShardCache(root, 10_000) as cache, cache.acquire(spec(key, size=10)) as shard:
        assert shard.path.resolve().parent == (root / "shards").resolve()
        assert len(shard.path.name) <= 97 and not shard.path.name.startswith(".")
        assert all(c.isascii() and (c.isalnum() or c in "._-") for c in shard.path.name)
        assert shard.path.read_bytes() == content(key, 10)
        assert [e.key for e in cache.entries()] == [key]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


# ---------------------------------------------------------------- processes
def _acquire_same(root: str, marks: str, barrier: Barrier) -> None:
    cache = ShardCache(root, 10_000)
    barrier.wait(timeout=15)
    with cache.acquire(spec("shared/000.parquet", 2000, marks=marks, delay_s=0.3)) as shard:
        assert shard.path.read_bytes() == content("shared/000.parquet", 2000)


def test_shard_wanted_by_several_processes_is_downloaded_once(tmp_path: Path) -> None:
    root, marks = tmp_path / "cache", tmp_path / "marks"
    barrier = SPAWN.Barrier(4)
    procs = [SPAWN.Process(target=_acquire_same, args=(str(root), str(marks), barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(20)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert fetches(marks) == ["shared/000.parquet"]


def _hold(root: str, holding: str, release: str) -> None:
    with ShardCache(root, 1000).acquire(spec("a")):
        Path(holding).touch()
        wait_until(Path(release).exists, 15)


def test_shard_in_use_by_another_process_is_never_evicted(tmp_path: Path) -> None:
    root, holding, release = tmp_path / "cache", tmp_path / "holding", tmp_path / "release"
    child = SPAWN.Process(target=_hold, args=(str(root), str(holding), str(release)))
    child.start()
    try:
        wait_until(holding.exists)
        cache = ShardCache(root, 1000, wait_timeout_s=0.3)
        with pytest.raises(DatasetError, match=r"'b' \(1000 bytes\) must fit .* 1000 bytes are in use by open shards"):
            cache.acquire(spec("b"))
        assert cache.prune() == 0
        assert [(e.key, e.in_use) for e in cache.entries()] == [("a", True)]
    finally:
        release.touch()
        child.join(10)
    assert child.exitcode == 0
    assert [(e.key, e.in_use) for e in cache.entries()] == [("a", False)]
    with cache.acquire(spec("b")):
        assert [e.key for e in cache.entries()] == ["b"]


def _stress_worker(root: str, marks: str, worker: int, limit: int, sizes: list[int]) -> None:
    keys = [f"stress/{i:03d}.parquet" for i in range(len(sizes))]
    specs = {k: spec(k, s, marks=marks, delay_s=0.002) for k, s in zip(keys, sizes, strict=True)}
    rng = random.Random(1234 + worker)
    order = [rng.choice(keys) for _ in range(20)]
    with ShardCache(root, limit, wait_timeout_s=10, poll_interval_s=0.005) as cache:
        for position, key in enumerate(order):
            upcoming = order[position:]
            next_use = {k: position + upcoming.index(k) for k in set(upcoming)}
            if position % 3 == 0:
                cache.prefetch([specs[k] for k in upcoming[1:3]], next_use=next_use)
            with cache.acquire(specs[key], next_use=next_use) as shard:
                on_disk = shard_bytes_on_disk(Path(root))
                assert on_disk <= limit, f"{on_disk} bytes on disk > limit {limit}"
                assert shard.path.read_bytes() == content(key, specs[key].size), f"{key} corrupt"
                time.sleep(rng.random() * 0.005)


def test_four_processes_share_a_small_cache_without_corruption_or_deadlock(tmp_path: Path) -> None:
    root, marks = tmp_path / "cache", tmp_path / "marks"
    sizes = [random.Random(7).randint(1024, 4096) for _ in range(8)]
    limit = 3 * 4096
    assert sum(sizes) > limit
    procs = [SPAWN.Process(target=_stress_worker, args=(str(root), str(marks), w, limit, sizes)) for w in range(4)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 20
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "deadlock: workers still running after 20 s"
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert shard_bytes_on_disk(root) <= limit
    # No shard was ever downloaded by two processes at once.
    spans: dict[str, list[tuple[float, float]]] = {}
    open_at: dict[tuple[str, str], float] = {}
    for kind, key, pid, t in (line.split() for line in marks.read_text().splitlines()):
        if kind == "start":
            open_at[key, pid] = float(t)
        else:
            spans.setdefault(key, []).append((open_at.pop((key, pid)), float(t)))
    for key, intervals in spans.items():
        intervals.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(intervals)), key
    assert len(spans) == 8


# ---------------------------------------------------------------- eviction
def _present(cache: ShardCache) -> list[str]:
    return [e.key for e in cache.entries()]


def test_eviction_follows_the_plan_as_in_the_module_docstring(tmp_path: Path) -> None:
    """The worked example of the docstring of ``zephon.storage.shard_cache_evict``."""
    marks = tmp_path / "marks"
    specs = {k: spec(k, marks=marks) for k in "abcd"}
    with ShardCache(tmp_path / "cache", 3000) as cache:
        for k in "abc":
            cache.acquire(specs[k]).close()
        cache.acquire(specs["d"], next_use={"a": 5, "b": 4, "c": 6, "d": 3}).close()
        assert _present(cache) == ["a", "b", "d"]
        cache.acquire(specs["b"], next_use={"a": 5, "b": 4, "c": 6}).close()
        cache.acquire(specs["a"], next_use={"a": 5, "c": 6}).close()
        cache.acquire(specs["c"], next_use={"c": 6}).close()
        assert _present(cache) == ["a", "b", "c"]
        assert cache.total_bytes() == 3000
    assert fetches(marks) == ["a", "b", "c", "d", "c"]


def test_entry_in_use_is_skipped_and_the_next_farthest_is_evicted(tmp_path: Path) -> None:
    with ShardCache(tmp_path / "cache", 3000) as cache:
        for k in "abc":
            cache.acquire(spec(k)).close()
        with cache.acquire(spec("c")):
            cache.acquire(spec("d"), next_use={"a": 5, "b": 4, "c": 6, "d": 3}).close()
            assert _present(cache) == ["b", "c", "d"]


def test_waiting_for_room_times_out_with_a_clear_error_or_proceeds_when_freed(tmp_path: Path) -> None:
    with ShardCache(tmp_path / "cache", 1000, wait_timeout_s=0.2) as cache:
        held = cache.acquire(spec("a"))
        started = time.monotonic()
        with pytest.raises(DatasetError, match=r"got no room after waiting 0.2 s: 1000 bytes are in use .* — close"):
            cache.acquire(spec("b"))
        assert 0.2 <= time.monotonic() - started < 2
        assert _present(cache) == ["a"]
    with ShardCache(tmp_path / "cache", 1000, wait_timeout_s=5) as cache:
        held = cache.acquire(spec("a"))
        threading.Timer(0.2, held.close).start()
        with cache.acquire(spec("b")):
            assert _present(cache) == ["b"]


def test_check_fits_names_the_shard_its_size_the_limit_and_the_fix(tmp_path: Path) -> None:
    with ShardCache(tmp_path / "cache", 4096) as cache:
        cache.check_fits([spec("small", 4096)])
        with pytest.raises(
            DatasetError,
            match=r"shard 'big/1' must fit in the shard cache, got 5000 bytes > limit_bytes=4096 \(and 1 more\) — "
            r"raise CacheOptions.limit_bytes to at least 6000",
        ):
            cache.check_fits([spec("small", 10), spec("big/1", 5000), spec("big/2", 6000)])
        with pytest.raises(DatasetError, match="'big/1' must fit"):
            cache.acquire(spec("big/1", 5000))
    ShardCache(tmp_path / "other", None).check_fits([spec("huge", 1 << 40)])


def test_entries_total_bytes_and_prune_are_exact_on_a_known_state(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with ShardCache(root, 10_000) as cache:
        for i, (k, size) in enumerate([("a", 100), ("b", 200), ("c", 300)]):
            with cache.acquire(spec(k, size, etag=f"t{k}")) as shard:
                pass
            os.utime(shard.path, ns=(1_700_000_000_000_000_000 + i * 10**9,) * 2)
        held = cache.acquire(spec("b", 200, etag="tb"))
        os.utime(held.path, ns=(1_700_000_001_000_000_000,) * 2)
        infos = cache.entries()
        assert [(e.key, e.size, e.etag, e.last_access, e.in_use) for e in infos] == [
            ("a", 100, "ta", 1_700_000_000.0, False),
            ("b", 200, "tb", 1_700_000_001.0, True),
            ("c", 300, "tc", 1_700_000_002.0, False),
        ]
        assert [e.path for e in infos] == [root / "shards" / entry_name(k) for k in "abc"]
        assert cache.total_bytes() == 600
        assert cache.prune(keep_bytes=300) == 400  # a (oldest) then c; b is in use
        assert (_present(cache), cache.total_bytes()) == (["b"], 200)
        assert cache.prune() == 0
        held.close()
        assert cache.prune() == 200
        assert (_present(cache), cache.total_bytes()) == ([], 0)
        with pytest.raises(ConfigError, match="keep_bytes must be ≥ 0, got -1"):
            cache.prune(keep_bytes=-1)


def test_reopening_with_a_smaller_limit_prunes_least_recently_used_first(tmp_path: Path) -> None:
    with ShardCache(tmp_path / "cache", 10_000) as cache:
        for k in "abc":
            cache.acquire(spec(k)).close()
    with ShardCache(tmp_path / "cache", 2500) as cache:
        assert (_present(cache), cache.total_bytes()) == (["b", "c"], 2000)


# ---------------------------------------------------------------- prefetch
def test_prefetch_downloads_in_the_background_and_acquire_reuses_it(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    specs = [spec(f"p/{i}", marks=marks, delay_s=0.2) for i in range(3)]
    with ShardCache(tmp_path / "cache", 10_000) as cache:
        started = time.monotonic()
        cache.prefetch(specs, next_use={s.key: i for i, s in enumerate(specs)})
        assert time.monotonic() - started < 0.1  # never blocks the caller
        wait_until(lambda: len(cache.entries()) == 3)
        for s in specs:
            cache.acquire(s).close()
    assert sorted(fetches(marks)) == ["p/0", "p/1", "p/2"]


def test_prefetch_never_evicts_a_shard_needed_sooner(tmp_path: Path) -> None:
    with ShardCache(tmp_path / "cache", 2000) as cache:
        cache.acquire(spec("a")).close()
        cache.acquire(spec("b")).close()
        cache.prefetch([spec("c")], next_use={"a": 1, "b": 2, "c": 3})
        drain(cache)
        assert _present(cache) == ["a", "b"]
        cache.prefetch([spec("c")])  # without next_use: free space only
        drain(cache)
        assert _present(cache) == ["a", "b"]
        cache.prefetch([spec("c")], next_use={"a": 1, "c": 2, "b": 5})
        drain(cache)
        assert _present(cache) == ["a", "c"]


def test_prefetch_stops_at_the_first_shard_that_does_not_fit(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    with ShardCache(tmp_path / "cache", 2000, prefetch_workers=1) as cache:
        cache.prefetch([spec("a", 1000, marks=marks), spec("b", 1500, marks=marks), spec("c", 500, marks=marks)])
        drain(cache)
        assert _present(cache) == ["a"]
    assert fetches(marks) == ["a"]


def test_prefetch_threads_reserve_room_in_plan_order(tmp_path: Path) -> None:
    # Two threads: b (second) must never take the room a (first) needs, however the threads are scheduled.
    for attempt in range(10):
        marks = tmp_path / f"marks{attempt}"
        with ShardCache(tmp_path / f"cache{attempt}", 2000, prefetch_workers=2) as cache:
            cache.prefetch([spec("a", 1000, marks=marks), spec("b", 1500, marks=marks), spec("c", 500, marks=marks)])
            drain(cache)
            assert _present(cache) == ["a"], attempt
        assert fetches(marks) == ["a"], attempt


def test_prefetch_stops_before_a_shard_someone_else_is_about_to_download(tmp_path: Path) -> None:
    from zephon.storage.shard_cache_lock import entry_name, exclusive

    marks = tmp_path / "marks"
    with ShardCache(tmp_path / "cache", 1500, prefetch_workers=2) as cache:
        # Another downloader holds a's lock and has not reserved room yet: b must not take it.
        with exclusive(cache._layout.download_lock(entry_name("a"))):
            cache.prefetch([spec("a", 1000, marks=marks), spec("b", 1000, marks=marks)])
            drain(cache)
        assert _present(cache) == [] and fetches(marks) == []
        cache.prefetch([spec("a", 1000, marks=marks), spec("b", 1000, marks=marks)])
        drain(cache)
        assert _present(cache) == ["a"] and fetches(marks) == ["a"]


def test_prefetch_error_is_raised_by_the_acquire_of_that_shard(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    with ShardCache(tmp_path / "cache", 10_000) as cache:
        cache.prefetch([spec("bad", marks=marks, fail="HTTP 503"), spec("good", marks=marks)])
        drain(cache)
        cache.acquire(spec("good", marks=marks)).close()
        with pytest.raises(DatasetError, match=r"'bad' must download, got RuntimeError: HTTP 503"):
            cache.acquire(spec("bad", marks=marks))
        assert sorted(fetches(marks)) == ["bad", "good"]  # the error was kept, not refetched
        cache.acquire(spec("bad", marks=marks, etag="e1", fail="")).close()  # the next acquire retries


def test_close_releases_pins_and_refuses_further_use(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", 10_000)
    shard = cache.acquire(spec("a"))
    cache.close()
    assert shard.closed
    assert [e.in_use for e in ShardCache(tmp_path / "cache", 10_000).entries()] == [False]
    with pytest.raises(ConfigError, match="must be open, got a closed cache"):
        cache.acquire(spec("a"))


def test_from_options_needs_an_enabled_cache(tmp_path: Path) -> None:
    options = CacheOptions(enabled=True, root=str(tmp_path / "cache"), limit_bytes=1234)
    with ShardCache.from_options(options) as cache:
        assert (cache.root, cache.limit_bytes) == (tmp_path / "cache", 1234)
    with pytest.raises(ConfigError, match="CacheOptions must have enabled=True"):
        ShardCache.from_options(CacheOptions())


def test_cache_cli_lists_sizes_and_prunes(tmp_path) -> None:
    from click.testing import CliRunner

    from zephon.cli import cli

    cache = ShardCache(tmp_path / "c", None)
    for i, size in enumerate((10, 20)):
        spec = CacheEntrySpec(
            key=f"hf/o/n/{i}", size=size, etag=f"e{i}", fetch=lambda p, size=size: Path(p).write_bytes(b"x" * size)
        )
        cache.acquire(spec).close()
    runner = CliRunner()
    ls = runner.invoke(cli, ["cache", "ls", "--root", str(tmp_path / "c")])
    assert ls.exit_code == 0 and [line.split()[0] for line in ls.output.splitlines()] == ["10", "20"]
    assert all(line.endswith(f"idle    hf/o/n/{i}") for i, line in enumerate(ls.output.splitlines()))
    du = runner.invoke(cli, ["cache", "du", "--root", str(tmp_path / "c")])
    assert du.output == f"30 bytes in 2 shards  {tmp_path / 'c'}\n"
    pruned = runner.invoke(cli, ["cache", "prune", "--root", str(tmp_path / "c"), "--keep-bytes", "20"])
    assert pruned.output == "freed 10 bytes, 20 bytes left\n"
