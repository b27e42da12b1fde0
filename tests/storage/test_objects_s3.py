"""s3:// datasets against a real S3 server (moto) on 127.0.0.1: planned from footers, pinned, read two ways.

The bar: a plan over ``s3://`` and the same plan over a local copy of the same files schedule the same
documents (samples.parquet byte for byte) and give the same batches, in cache mode and in range mode.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl_dataset, write_parquet_dataset

from zephon import Pipeline
from zephon.errors import DatasetError
from zephon.io import Dataset
from zephon.specs import CacheOptions, StoreOptions
from zephon.storage.objects.reads import REQUESTS
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource


def source(*datasets: Dataset, seed: int = 7, **kw) -> StaticMixtureWorkSource:
    weights = {d.name: 1.0 / len(datasets) for d in datasets}
    return StaticMixtureWorkSource(datasets=list(datasets), mixture=MixtureSpec(weights), seed=seed, **kw)


def run(plan: Path, tokenizer_dir: str, io: StoreOptions | None = None) -> str:
    """A hash of every batch of the plan's run: tokens, lengths."""
    pipe = Pipeline.from_plan(plan)
    if io is not None:
        pipe = pipe.options(io_options=io)
    pipe = pipe.tokenize(tokenizer_id=tokenizer_dir, field="text").pack_flat(max_length=33).batch(microbatch_size=4)
    digest = hashlib.sha256()
    n = 0
    for batch in pipe:
        digest.update(np.ascontiguousarray(batch.tokens).tobytes())
        digest.update(np.ascontiguousarray(batch.lengths).tobytes())
        n += 1
    assert n > 0
    return digest.hexdigest()


def cache_io(tmp_path: Path) -> StoreOptions:
    return StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "cache"), limit_bytes=1 << 30))


@pytest.fixture
def corpus(tmp_path: Path, s3) -> dict[str, tuple[Path, str]]:
    """Local datasets and their copies in the bucket: name → (local directory, s3 prefix)."""
    root = tmp_path / "local"
    made = {
        "web": write_parquet_dataset(root, "web", [37, 20, 51, 8], row_group_size=6),
        "code": write_jsonl_dataset(root, "code", [35, 32], compression=""),
        "books": write_jsonl_dataset(root, "books", [22, 19, 27], compression="gz"),
        "wiki": write_jsonl_dataset(root, "wiki", [31, 33], compression="zst"),
    }
    out = {}
    for name, directory in made.items():
        s3.upload_dir(directory, f"corpora/{name}/")
        out[name] = (directory, s3.url(f"corpora/{name}/"))
    return out


def test_a_plan_over_s3_schedules_what_the_local_copy_does(corpus, tmp_path, tokenizer_dir) -> None:
    local = source(
        *(Dataset.from_path(n, str(d)) for n, (d, _) in corpus.items()), shuffle=ShuffleSpec(window_shards=2)
    )
    remote = source(
        *(Dataset.from_path(n, url) for n, (_, url) in corpus.items()), shuffle=ShuffleSpec(window_shards=2)
    )
    a, b = local.plan(tmp_path / "local-plan"), remote.plan(tmp_path / "s3-plan")
    assert (a / "samples.parquet").read_bytes() == (b / "samples.parquet").read_bytes()
    la, lb = pq.read_table(a / "shards.parquet").to_pylist(), pq.read_table(b / "shards.parquet").to_pylist()
    for x, y in zip(la, lb, strict=True):
        assert (x["rows"], x["bytes"], x["row_groups"], x["format"]) == (
            y["rows"],
            y["bytes"],
            y["row_groups"],
            y["format"],
        )
        assert y["uri"].startswith(f"s3://{corpus['web'][1].split('/')[2]}/corpora/")
        assert y["uri"].rsplit("/", 1)[1] == Path(x["uri"]).name
        assert y["fingerprint"].startswith('etag:"')  # the pin: the object's ETag
    manifest = json.loads((b / "plan.json").read_text())
    assert [d["path"] for d in manifest["datasets"]] == [url for _, url in corpus.values()]
    expected = run(a, tokenizer_dir)
    assert run(b, tokenizer_dir, cache_io(tmp_path)) == expected
    assert run(b, tokenizer_dir, StoreOptions(remote_read="range")) == expected
    cache_root = Path(os.environ["ZEPHON_CACHE_DIR"])
    before = sorted(cache_root.rglob("*")) if cache_root.exists() else []
    assert run(b, tokenizer_dir) == expected  # no options: read by ranges ("auto"), nothing staged on disk
    assert (sorted(cache_root.rglob("*")) if cache_root.exists() else []) == before


def test_planning_reads_parquet_footers_only(s3, tmp_path) -> None:
    directory = write_parquet_dataset(tmp_path / "local", "web", [40] * 5, row_group_size=8)
    s3.upload_dir(directory, "web/")
    REQUESTS.clear()
    source(Dataset.from_path("web", s3.url("web/"))).plan(tmp_path / "plan")
    assert REQUESTS["whole"] == 0 and REQUESTS["range"] == 0
    assert REQUESTS["footer"] == 5  # one GET of the last 64 KiB per shard
    assert REQUESTS["list"] == 1
    REQUESTS.clear()  # re-planning: the footers are cached by pin
    source(Dataset.from_path("web", s3.url("web/")), seed=8).plan(tmp_path / "plan2")
    assert REQUESTS["footer"] == 0


def test_range_mode_reads_only_the_text_column_of_needed_row_groups(s3, tmp_path, tokenizer_dir) -> None:
    import pyarrow as pa

    rows = 64
    rng = np.random.default_rng(0)
    blobs = [rng.bytes(4000) for _ in range(rows)]  # incompressible: the file is mostly this column
    table = pa.table({"text": [f"document {i} " * 3 for i in range(rows)], "blob": blobs})
    (tmp_path / "wide").mkdir()
    pq.write_table(table, tmp_path / "wide" / "0.parquet", row_group_size=16)
    s3.upload_dir(tmp_path / "wide", "wide/")
    plan = source(Dataset.from_path("wide", s3.url("wide/"))).plan(tmp_path / "plan")
    REQUESTS.clear()
    run(plan, tokenizer_dir, StoreOptions(remote_read="range"))
    size = (tmp_path / "wide" / "0.parquet").stat().st_size
    assert REQUESTS["whole"] == 0
    # One GET per row group's text column chunk, once: num_steps()'s calibration reads the plan's first 2,048
    # documents (here all 64) through the run's own reader, which keeps them decoded for the run.
    assert REQUESTS["range"] == 4
    assert REQUESTS["footer"] == 1
    assert size > 200_000  # the blob column, never fetched


def test_one_object_and_a_glob_and_the_gcs_like_spellings(s3, tmp_path) -> None:
    directory = write_parquet_dataset(tmp_path / "local", "web", [5, 6, 7])
    s3.upload_dir(directory, "web/")
    s3.put("web/README.md", b"# not a shard")
    s3.put("web/_SUCCESS", b"")
    one = Dataset.from_path("one", s3.url("web/part-00001.parquet"))
    assert [f.uri for f in one.files] == [s3.url("web/part-00001.parquet")]
    glob = Dataset.from_path("glob", s3.url("web/part-0000[02].parquet"))
    assert [f.uri.rsplit("/", 1)[1] for f in glob.files] == ["part-00000.parquet", "part-00002.parquet"]
    star = Dataset.from_path("star", s3.url("**/*.parquet"))
    assert len(star.files) == 3
    prefix = Dataset.from_path("prefix", s3.url("web"))  # no trailing slash: the prefix web/
    assert [f.uri for f in prefix.files] == [f.uri for f in star.files]
    with pytest.raises(DatasetError, match=r"glob 's3://.*/web/\*\.jsonl' must match at least one object"):
        Dataset.from_path("none", s3.url("web/*.jsonl"))
    with pytest.raises(DatasetError, match="must name an object or a prefix holding shards"):
        Dataset.from_path("missing", s3.url("nothing/here/"))


def test_a_missing_bucket_is_one_line(s3) -> None:
    with pytest.raises(DatasetError) as info:
        Dataset.from_path("web", "s3://no-such-bucket-zephon/web/")
    message = str(info.value)
    assert "\n" not in message
    assert "bucket s3://no-such-bucket-zephon must exist, got HTTP 404 NoSuchBucket" in message
    assert "AWS_ENDPOINT_URL" in message


def test_an_object_changed_after_planning_is_refused_by_name(s3, tmp_path, tokenizer_dir) -> None:
    directory = write_parquet_dataset(tmp_path / "local", "web", [30, 30])
    s3.upload_dir(directory, "web/")
    plan = source(Dataset.from_path("web", s3.url("web/"))).plan(tmp_path / "plan")
    other = write_parquet_dataset(tmp_path / "other", "web", [30, 31])
    s3.put("web/part-00001.parquet", (other / "part-00001.parquet").read_bytes())
    for io in (cache_io(tmp_path), StoreOptions(remote_read="range")):
        with pytest.raises(
            DatasetError, match=r"object s3://.*/web/part-00001\.parquet changed since planning"
        ) as info:
            run(plan, tokenizer_dir, io)
        assert "\n" not in str(info.value)
    # Nothing half-written in the cache: the changed shard never entered it (the unchanged one may have, when
    # it was read before the changed one was met; num_steps()'s calibration reads both shards' first documents).
    from zephon.storage.shard_cache import ShardCache

    entries = ShardCache(tmp_path / "cache", 1 << 30).entries()
    assert {e.key.rsplit("/", 1)[1] for e in entries} <= {"part-00000.parquet"}
    assert not [p for p in (tmp_path / "cache").rglob("*") if "part-00001" in p.name and p.parent.name != "locks"]


def test_a_bucket_of_more_than_a_page_of_objects_lists_every_one_in_pages(s3) -> None:
    # one key past a page: the second page holds it (2,500 keys and 3 pages took 11 s, most of it moto's PUTs)
    keys = [f"many/{i // 100:02d}/shard-{i:05d}.jsonl" for i in range(1_001)]
    s3.put_many({k: b'{"text": "x"}\n' for k in keys})
    REQUESTS.clear()
    ds = Dataset.from_path("many", s3.url("many/"))
    assert [f.uri for f in ds.files] == [s3.url(k) for k in sorted(keys)]
    assert {f.size for f in ds.files} == {14}
    assert REQUESTS["list"] == 2  # 1,000 keys a page
    glob = Dataset.from_path("some", s3.url("many/0[3-4]/shard-*7.jsonl"))
    assert [f.uri for f in glob.files] == [
        s3.url(k) for k in sorted(keys) if k[5:7] in ("03", "04") and k.endswith("7.jsonl")
    ]


def test_a_versioned_bucket_serves_the_planned_version_after_an_overwrite(s3, tmp_path, tokenizer_dir) -> None:
    s3.server.client().put_bucket_versioning(Bucket=s3.name, VersioningConfiguration={"Status": "Enabled"})
    web = write_parquet_dataset(tmp_path / "local", "web", [25, 30])
    code = write_jsonl_dataset(tmp_path / "local", "code", [20, 22], compression="gz")
    s3.upload_dir(web, "web/")
    s3.upload_dir(code, "code/")
    remote = source(Dataset.from_path("web", s3.url("web/")), Dataset.from_path("code", s3.url("code/")))
    plan = remote.plan(tmp_path / "plan")
    pins = [s["fingerprint"] for s in pq.read_table(plan / "shards.parquet").to_pylist()]
    assert all("@" in p for p in pins)  # ETag and version id (stated by the footer's GET)
    expected = run(
        source(Dataset.from_path("web", str(web)), Dataset.from_path("code", str(code))).plan(tmp_path / "l"),
        tokenizer_dir,
    )
    other = write_parquet_dataset(tmp_path / "other", "web", [25, 31])
    s3.put("web/part-00001.parquet", (other / "part-00001.parquet").read_bytes())
    s3.put("code/part-00000.jsonl.gz", b"")
    assert run(plan, tokenizer_dir, cache_io(tmp_path)) == expected
    assert run(plan, tokenizer_dir, StoreOptions(remote_read="range")) == expected


def test_range_mode_reads_plain_jsonl_rows_by_their_line_index(s3, tmp_path, tokenizer_dir, monkeypatch) -> None:
    code = write_jsonl_dataset(tmp_path / "local", "code", [300, 250], compression="")
    s3.upload_dir(code, "code/")
    plan = source(Dataset.from_path("code", s3.url("code/")), shuffle=ShuffleSpec(window_shards=1)).plan(
        tmp_path / "plan"
    )
    expected = run(
        source(Dataset.from_path("code", str(code)), shuffle=ShuffleSpec(window_shards=1)).plan(tmp_path / "l"),
        tokenizer_dir,
    )
    REQUESTS.clear()  # the scan kept each object's line index: rows are fetched by ranges, never whole
    assert run(plan, tokenizer_dir, StoreOptions(remote_read="range")) == expected
    assert REQUESTS["whole"] == 0 and REQUESTS["range"] >= 2
    # A rank without the index (another machine): the first opening reads the object whole and keeps its index.
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "other-node"))
    REQUESTS.clear()
    assert run(plan, tokenizer_dir, StoreOptions(remote_read="range")) == expected
    assert REQUESTS["whole"] == 2


def _run_in_child(plan: Path, tokenizer_dir: str, out) -> None:
    try:
        out.put(run(plan, tokenizer_dir, StoreOptions(remote_read="range")))
    except Exception as exc:  # the child's error, for the parent to check
        out.put(f"{type(exc).__name__}: {exc}")


def test_a_process_forked_after_reading_object_storage_refuses_in_one_line_and_spawn_works(
    s3, tmp_path, tokenizer_dir
) -> None:
    """obstore's I/O threads do not survive fork(): a DataLoader worker forked after its parent read object
    storage (planning, ``num_steps()``) would wait for them forever. It refuses in one line; a spawned one reads."""
    import multiprocessing

    web = write_parquet_dataset(tmp_path / "local", "web", [30, 26], row_group_size=5)
    s3.upload_dir(web, "forked/")
    plan = source(Dataset.from_path("web", s3.url("forked/"))).plan(tmp_path / "plan")  # the parent reads footers
    expected = run(plan, tokenizer_dir, StoreOptions(remote_read="range"))
    got = {}
    for method in ("fork", "spawn"):
        context = multiprocessing.get_context(method)
        out = context.Queue()
        child = context.Process(target=_run_in_child, args=(plan, tokenizer_dir, out))
        child.start()
        got[method] = out.get(timeout=120)
        child.join(timeout=30)
        assert not child.is_alive()
    assert re.fullmatch(
        r"ConfigError: object s3://[^ ]+/forked/part-0000[01]\.parquet must be read by a process started by spawn or "
        r"forkserver, or forked before its parent read object storage, got a process forked after that: .* — start "
        r"DataLoader workers with multiprocessing_context='spawn' \(or 'forkserver'\)",
        got["fork"],
    ), got["fork"]
    assert got["spawn"] == expected


def test_a_cached_run_makes_each_shards_cache_key_once(s3, tmp_path, monkeypatch, tokenizer_dir) -> None:
    """The reader tells the cache each shard's next use by its key at every acquire: made once a shard, not once a
    shard and acquire (60 shards made 3,360 cache entries before, 120 now)."""
    import zephon.executor.read.shard_reader as shard_reader

    s3.upload_dir(write_jsonl_dataset(tmp_path, "web", [3] * 60), "web/")
    ds = Dataset.from_path("web", s3.url("web/"))
    plan = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=1).plan(tmp_path / "p")
    made = []
    real = shard_reader.remote_spec
    monkeypatch.setattr(shard_reader, "remote_spec", lambda *a, **k: made.append(1) or real(*a, **k))
    cached = StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "shards"), limit_bytes=1 << 30))
    pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=16)
    batches = list(pipe.batch(microbatch_size=4).options(io_options=cached))
    assert len(batches) > 60 and len(made) == 2 * 60  # one entry to acquire each shard, one key each
