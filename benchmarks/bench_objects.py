"""Object storage: executor throughput over s3:// against the same plan on local disk, planning 1,000 shards from
footers, and requests per shard — against moto's S3 server on 127.0.0.1, started here.

Run: python benchmarks/bench_objects.py [--copies 4] [--repeats 3] [--shards 1000] [--mds-shards 500] [--mds-only]

Corpus: ``--copies`` seeds of the demo corpus (prose / code / short, 7 Parquet shards a seed, ~4 MB of text),
mixed 0.5/0.3/0.2, uploaded to a bucket; the demo tokenizer; max_length 2049, microbatch 8. One plan over the
local files and one over ``s3://`` (the same documents in the same order: their samples.parquet are compared
byte for byte). Throughput, tokens per second, best of ``--repeats`` interleaved runs in this process:

* local: ``Pipeline.from_plan(local plan)``;
* s3 cache: the s3 plan through a fresh shard cache each run (every shard downloaded once, then read locally);
  "warm": the same run again on that cache (a second epoch, or a node whose cache another rank filled);
* s3 range: the s3 plan with ``StoreOptions(remote_read="range")`` (no local copy).

Ratios are s3 ÷ local, same cores, same run. Planning: ``--shards`` small Parquet objects (100 rows each)
listed and planned from footers with an empty metadata cache; seconds and GETs. Requests per shard: GETs
counted by ``zephon.storage.objects.reads.REQUESTS`` at plan time and at read time.

MDS records (``--mds-shards N``; ``--mds-only`` runs only this): an MDS folder of N shards (each a copy of the
5-sample fixture shard, 4,700 bytes, tests/fixtures/records_mds) and an index.json listing them, planned with an
empty cache: seconds, GETs by kind and bytes per shard (the index once, then each shard's 28-byte header); then
every record of that plan read in range mode and in cache mode (seconds, GETs).

The baseline for the alternative client, measured once when obstore was chosen (same server, 200 objects):
``--compare`` lists the bucket and reads every footer with pyarrow.fs.S3FileSystem, for the commit's figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "scripts"))  # demo_grammar: demo corpora of any seed

WEIGHTS = {"prose": 0.5, "code": 0.3, "short": 0.2}


def _tokens(plan: Path, io) -> tuple[int, float]:
    from zephon import Pipeline
    from zephon.demo import demo_tokenizer_path

    pipe = Pipeline.from_plan(plan)
    if io is not None:
        pipe = pipe.options(io_options=io)
    pipe = pipe.tokenize(tokenizer_id=demo_tokenizer_path(), field="text").pack_flat(max_length=2049)
    pipe = pipe.batch(microbatch_size=8)
    start = time.perf_counter()
    tokens = 0
    for batch in pipe:
        tokens += int(batch.lengths.sum())
    return tokens, time.perf_counter() - start


def _source(paths: dict[str, list[str]]):
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    datasets = [Dataset.from_path(kind, where) for kind, where in paths.items()]
    return StaticMixtureWorkSource(datasets=datasets, mixture=MixtureSpec(WEIGHTS), seed=1)


def main() -> None:
    import warnings

    warnings.simplefilter("ignore")  # the demo corpus is small: plans repeat it, and say so
    parser = argparse.ArgumentParser()
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--compare", action="store_true", help="also list + read footers with pyarrow.fs")
    parser.add_argument("--mds-shards", type=int, default=500)
    parser.add_argument("--mds-only", action="store_true", help="only the MDS planning figure")
    args = parser.parse_args()

    from demo_grammar import write_demo_dataset
    from servers.object_fixtures import Bucket
    from servers.object_servers import S3Server

    from zephon.specs import CacheOptions, StoreOptions
    from zephon.storage.objects.reads import REQUESTS

    work = Path(tempfile.mkdtemp(prefix="zephon-bench-objects-"))
    os.environ["ZEPHON_CACHE_DIR"] = str(work / "zephon-cache")
    server = S3Server(log=work / "moto.log")
    try:
        os.environ.update(server.env())
        bucket = Bucket(server=server, cloud="s3", name="bench")
        server.create_bucket("bench")
        if args.mds_shards:
            _mds(server, work, args.mds_shards)
        if args.mds_only:
            return
        local_root = work / "local"
        for copy in range(args.copies):
            demo = Path(write_demo_dataset(local_root / f"seed{copy}", seed=copy))
            bucket.upload_dir(demo, f"corpus/seed{copy}/")
        local = {k: f"{local_root}/seed*/demo/{k}-*.parquet" for k in WEIGHTS}
        remote = {k: bucket.url(f"corpus/seed*/{k}-*.parquet") for k in WEIGHTS}
        local_plan = _source(local).plan(work / "plan-local")
        REQUESTS.clear()
        s3_plan = _source(remote).plan(work / "plan-s3")
        n_shards = 7 * args.copies
        plan_gets = {k: v for k, v in REQUESTS.items()}
        same = (local_plan / "samples.parquet").read_bytes() == (s3_plan / "samples.parquet").read_bytes()
        print(f"corpus: {args.copies} demo seeds, {n_shards} shards; samples.parquet identical: {same}")
        print(f"plan time requests: {plan_gets} ({plan_gets.get('footer', 0) / n_shards:.2f} footer GETs per shard)")

        best = {"local": 0.0, "s3 cache": 0.0, "s3 cache (warm)": 0.0, "s3 range": 0.0}
        reads = {}
        for repeat in range(args.repeats):
            for name in best:
                REQUESTS.clear()
                if name == "local":
                    tokens, seconds = _tokens(local_plan, None)
                elif name.startswith("s3 cache"):  # cold: a fresh cache; warm: the same one again
                    cache = CacheOptions(enabled=True, root=str(work / f"cache-{repeat}"), limit_bytes=1 << 34)
                    tokens, seconds = _tokens(s3_plan, StoreOptions(cache=cache))
                else:
                    tokens, seconds = _tokens(s3_plan, StoreOptions(remote_read="range"))
                best[name] = max(best[name], tokens / seconds)
                reads[name] = dict(REQUESTS)
        for name, rate in best.items():
            ratio = rate / best["local"]
            extra = f"  read-time GETs {reads[name]} ({sum(reads[name].values()) / n_shards:.1f} per shard)"
            print(f"{name:15s} {rate / 1e6:7.2f} M tokens/s  ratio {ratio:.2f}" + ("" if name == "local" else extra))

        # Planning N shards from footers, empty metadata cache.
        import pyarrow as pa
        import pyarrow.parquet as pq

        one = work / "one.parquet"
        pq.write_table(pa.table({"text": [f"row {i}" for i in range(100)]}), one)
        data = one.read_bytes()
        server.create_bucket("many")
        Bucket(server=server, cloud="s3", name="many").put_many(
            {f"shards/part-{i:05d}.parquet": data for i in range(args.shards)}
        )
        os.environ["ZEPHON_CACHE_DIR"] = str(work / "empty-cache")
        REQUESTS.clear()
        start = time.perf_counter()
        many = {
            "prose": "s3://many/shards/",
            "code": "s3://many/shards/part-0000*.parquet",
            "short": "s3://many/shards/part-00010.parquet",
        }
        plan = _source(many).plan(work / "plan-many")
        seconds = time.perf_counter() - start
        print(f"planning {args.shards} shards from footers: {seconds:.2f} s; requests {dict(REQUESTS)} ({plan})")
        if args.compare:
            _compare(server, args.shards)
    finally:
        server.stop()


def _mds(server, work: Path, n: int) -> None:
    """Plan ``n`` MDS shards on S3 from index.json and headers; GETs and bytes per shard."""
    import json

    from servers.object_fixtures import Bucket

    from zephon.io import Dataset
    from zephon.storage.objects import mds as object_mds
    from zephon.storage.objects.reads import REQUESTS
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    fixture = HERE.parent / "tests" / "fixtures" / "records_mds" / "pairs"
    entry = json.loads((fixture / "index.json").read_text())["shards"][0]
    shard = (fixture / entry["raw_data"]["basename"]).read_bytes()
    names = [f"shard.{i:05d}.mds" for i in range(n)]
    index = {"shards": [{**entry, "raw_data": {**entry["raw_data"], "basename": name}} for name in names], "version": 2}
    server.create_bucket("mds")
    objects = {f"pairs/{name}": shard for name in names} | {"pairs/index.json": json.dumps(index).encode()}
    Bucket(server=server, cloud="s3", name="mds").put_many(objects)
    got = {"bytes": 0}
    get_range = object_mds.get_range

    def counted(*args, **kwargs):  # bytes of every GET planning makes through the MDS module
        data, meta = get_range(*args, **kwargs)
        got["bytes"] += len(data)
        return data, meta

    def plan(out: str, cache: str | None = None) -> float:
        os.environ["ZEPHON_CACHE_DIR"] = str(work / f"cache-{cache or out}")  # a new one: every header read
        start = time.perf_counter()
        source = StaticMixtureWorkSource(
            datasets=[Dataset.from_path("pairs", "s3://mds/pairs/")], mixture=MixtureSpec({"pairs": 1.0}), seed=1
        )
        source.plan(work / out)
        return time.perf_counter() - start

    local = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("pairs", str(fixture))], mixture=MixtureSpec({"pairs": 1.0}), seed=1
    )
    local.plan(work / "plan-mds-warmup")  # the planner's imports, not counted
    following = object_mds.following
    object_mds.following = lambda file, n: ()  # no header read ahead: one GET after another
    one_by_one = plan("plan-mds-1")
    object_mds.following = following
    object_mds.get_range = counted
    REQUESTS.clear()
    seconds = plan("plan-mds-2")
    object_mds.get_range = get_range
    gets = {k: v for k, v in REQUESTS.items() if v}
    REQUESTS.clear()
    replan = plan("plan-mds-3", cache="plan-mds-2")  # the same cache: checked shards remembered by pin
    replan_gets = {k: v for k, v in REQUESTS.items() if v}
    runs = {}
    for mode in ("range", "cache"):  # every record of the plan, 32 a microbatch, nothing decoded
        from zephon import Pipeline
        from zephon.specs import CacheOptions, StoreOptions

        io = StoreOptions(remote_read="range")
        if mode == "cache":
            io = StoreOptions(cache=CacheOptions(enabled=True, root=str(work / "mds-shards"), limit_bytes=1 << 30))
        REQUESTS.clear()
        start = time.perf_counter()
        pipe = Pipeline.from_plan(work / "plan-mds-2").options(io_options=io).batch(microbatch_size=32, collate=list)
        count = sum(len(b.data) for b in pipe)
        runs[mode] = (count, time.perf_counter() - start, {k: v for k, v in REQUESTS.items() if v})
    index_bytes = len(objects["pairs/index.json"])
    print(
        f"planning {n} MDS shards ({len(shard)} bytes each, index.json {index_bytes} bytes): {seconds:.2f} s "
        f"({one_by_one:.2f} s without headers read ahead); requests {gets}; "
        f"{(sum(gets.values()) - gets.get('list', 0)) / n:.3f} GETs per shard; "
        f"{got['bytes']} bytes read = index.json + {(got['bytes'] - index_bytes) / n:.0f} bytes per shard; "
        f"re-planned in {replan:.2f} s with requests {replan_gets}"
    )
    for mode, (count, seconds, gets) in runs.items():
        print(f"run, {mode} mode: {count} records in {seconds:.2f} s ({count / seconds:.0f} records/s); GETs {gets}")


def _compare(server, n: int) -> None:
    """List and read every footer of the ``many`` bucket with obstore (via Zephon) and with pyarrow.fs."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from zephon.io import Dataset
    from zephon.storage.objects.scan import scan_object

    os.environ["ZEPHON_CACHE_DIR"] = tempfile.mkdtemp()
    start = time.perf_counter()
    files = Dataset.from_path("x", "s3://many/shards/").files
    for f in files:
        scan_object(f.remote)
    zephon_s = time.perf_counter() - start
    env = server.env()
    fs = pafs.S3FileSystem(
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        region="us-east-1",
        endpoint_override=env["AWS_ENDPOINT_URL"],
        scheme="http",
    )
    start = time.perf_counter()
    infos = fs.get_file_info(pafs.FileSelector("many/shards/", recursive=True))
    for info in infos:
        with fs.open_input_file(info.path) as fh:
            pq.read_metadata(fh)
    arrow_s = time.perf_counter() - start
    print(f"list + {len(files)} footers: obstore {zephon_s:.2f} s, pyarrow.fs {arrow_s:.2f} s")


if __name__ == "__main__":
    main()
