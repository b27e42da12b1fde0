"""The heavy planning steps on a local two-node Ray cluster against the local path: time, and the same bytes.

Run: python benchmarks/bench_ray.py [--scan-shards 4000] [--scan-rows 25000] [--documents 1e7] [--partitions 8]
                                    [--count-docs 3800] [--json FILE]

Starts a ``ray.cluster_utils.Cluster`` of two nodes (``--cpus`` each; the start-up is timed), then, each step
once locally and once with ``engine="ray"`` (results compared, a mismatch is an error):

* **scan**: ``--scan-shards`` Parquet shards of ``--scan-rows`` rows (one int8 column: planning reads footers,
  so row size does not matter) scanned by ``shard_refs``;
* **join**: a ``where`` + sidecar selection over ``--documents`` documents in 100 shards and a sidecar of the
  same ids (``bench_selection.write_corpus``), joined in ``--partitions`` key-hash partitions (``select_rows``);
* **count**: the count pass over the embedded demo corpus's texts (``--count-docs`` documents of real prose,
  code and short texts, ``--count-copies`` times over), demo tokenizer, ``workers=1`` locally.

Printed per step: seconds local, seconds on Ray, and per 10^9 documents (a linear extrapolation: the steps are
per shard, per row and per document respectively, with nothing shared between tasks but the driver).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
from bench_selection import write_corpus


def write_scan_corpus(root: Path, shards: int, rows: int) -> Path:
    out = root / "scan"
    out.mkdir(parents=True, exist_ok=True)
    table = pa.table({"score": pa.array(np.zeros(rows, np.int8))})
    for s in range(shards):
        path = out / f"part-{s:06d}.parquet"
        if not path.exists():
            pq.write_table(table, path, row_group_size=rows)
    return out


def timed(fn):  # -> (seconds, result)
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scan-shards", type=int, default=4000)
    parser.add_argument("--scan-rows", type=int, default=25_000)
    parser.add_argument("--documents", type=float, default=1e7)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--count-docs", type=int, default=3800)
    parser.add_argument("--count-copies", type=int, default=10, help="The demo texts this many times over.")
    parser.add_argument("--cpus", type=int, default=1, help="CPUs of each of the two nodes.")
    parser.add_argument("--root", type=Path, default=None, help="Keep the corpora here (default: a temp dir).")
    parser.add_argument("--steps", default="scan,join,count")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="zephon-bench-ray-"))
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    import ray
    from ray.cluster_utils import Cluster

    from zephon.io import Dataset
    from zephon.planner.prepare import shard_refs
    from zephon.planner.selection.evaluate import select_rows
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    def source(*datasets: Dataset) -> StaticMixtureWorkSource:
        return StaticMixtureWorkSource(
            datasets=list(datasets), mixture=MixtureSpec({d.name: 1.0 for d in datasets}), seed=1
        )

    report: dict[str, dict[str, float]] = {}
    start = time.perf_counter()
    node = {
        "num_cpus": args.cpus,
        "object_store_memory": 200 * 2**20,
        "env_vars": {"ZEPHON_CACHE_DIR": str(root / "cache")},
    }
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        report["cluster"] = {"startup_s": time.perf_counter() - start, "nodes": len(ray.nodes())}
        print(f"cluster: 2 nodes x {args.cpus} CPU up in {report['cluster']['startup_s']:.1f} s", flush=True)
        steps = args.steps.split(",")
        if "scan" in steps:
            made, data = timed(lambda: write_scan_corpus(root, args.scan_shards, args.scan_rows))
            ds = Dataset.from_path("scan", data)
            local_s, local = timed(lambda: shard_refs(source(ds), progress=False))
            cold_s, _ = timed(lambda: shard_refs(source(ds), progress=False, engine="ray"))  # workers import zephon
            ray_s, on_ray = timed(lambda: shard_refs(source(ds), progress=False, engine="ray"))
            print(f"scan on ray, first (cold workers): {cold_s:.1f} s", flush=True)
            assert local == on_ray, "scan: the Ray scan differs from the local scan"
            docs = args.scan_shards * args.scan_rows
            per = 1e9 / docs
            report["scan"] = {"shards": args.scan_shards, "documents": docs, "local_s": local_s, "ray_s": ray_s,
                              "local_s_per_1e9": local_s * per, "ray_s_per_1e9": ray_s * per}  # fmt: skip
            print(f"scan: {args.scan_shards} shards ({docs:.1e} docs; written in {made:.0f} s): local {local_s:.1f} s, "
                  f"ray {ray_s:.1f} s; per 1e9 docs at {args.scan_rows} rows/shard: local {local_s * per:.0f} s, "
                  f"ray {ray_s * per:.0f} s", flush=True)  # fmt: skip
        if "join" in steps:
            documents = int(args.documents)
            data, side = write_corpus(root / "join", documents, 100)
            ds = Dataset.from_path("web", data, metadata=side, key="id", where="int_score >= 3 AND quality > 0.5")
            assert ds.selection is not None
            refs = shard_refs(source(ds), progress=False)[0]
            kw = {"seed": 1, "dataset_index": 0, "partitions": args.partitions}
            local_s, local = timed(lambda: select_rows(ds.selection, refs, **kw))
            cold_s, _ = timed(lambda: select_rows(ds.selection, refs, engine="ray", **kw))
            ray_s, on_ray = timed(lambda: select_rows(ds.selection, refs, engine="ray", **kw))
            print(f"join on ray, first: {cold_s:.1f} s", flush=True)
            assert np.array_equal(local.shard, on_ray.shard) and np.array_equal(local.row, on_ray.row)
            assert local.report == on_ray.report, "join: the Ray join's counts differ"
            per = 1e9 / documents
            report["join"] = {"documents": documents, "partitions": args.partitions, "local_s": local_s,
                              "ray_s": ray_s, "local_s_per_1e9": local_s * per,
                              "ray_s_per_1e9": ray_s * per}  # fmt: skip
            print(f"join: {documents:.1e} docs x {documents:.1e} sidecar rows, {args.partitions} partitions: local "
                  f"{local_s:.1f} s, ray {ray_s:.1f} s; per 1e9: local {local_s * per:.0f} s, ray {ray_s * per:.0f} s",
                  flush=True)  # fmt: skip
        if "count" in steps:
            report["count"] = _count(root, args.count_docs, args.count_copies, timed)
        report["load_average"] = {"1min": os.getloadavg()[0]}
        print(f"load average at the end: {os.getloadavg()}")
    finally:
        ray.shutdown()
        cluster.shutdown()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def _count(root: Path, limit: int, copies: int, timed) -> dict[str, float]:
    """The count pass over the demo corpus's texts (in 8 Parquet shards), locally on one worker and on Ray."""
    import numpy as np

    from zephon.demo import demo_tokenizer_path
    from zephon.demo.corpus import generate_demo_documents
    from zephon.executor.encode.encoders import make_encoder
    from zephon.io import Dataset
    from zephon.planner.counts.lengths import token_counts
    from zephon.planner.prepare import shard_refs
    from zephon.specs import TokenizeSpec
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    kinds = ("prose", "code", "short")
    texts = [t for kind, n in zip(kinds, (1200, 600, 2000), strict=True) for t in generate_demo_documents(kind, n)]
    texts = texts[:limit] * copies
    out = root / "count"
    out.mkdir(parents=True, exist_ok=True)
    for s, part in enumerate(np.array_split(np.arange(len(texts)), 8)):
        pq.write_table(pa.table({"text": [texts[i] for i in part]}), out / f"part-{s}.parquet")
    ds = Dataset.from_path("demo", out)
    refs = list(shard_refs(StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"demo": 1.0}), seed=1))[0])
    spec = TokenizeSpec(tokenizer_id=demo_tokenizer_path())
    encoder = make_encoder(spec)
    results = {}
    for engine in ("local", "ray", "ray"):  # the second Ray run: workers with the tokenizer loaded
        os.environ["ZEPHON_CACHE_DIR"] = str(root / f"count-cache-{engine}-{time.time_ns()}")
        seconds, (_arrays, done) = timed(lambda e=engine: token_counts(refs, spec, encoder, workers=1, engine=e))
        if engine in results:
            print(f"count on ray, first (workers load the tokenizer): {results[engine][0]:.1f} s", flush=True)
        results[engine] = (seconds, done.tokens)
    (local_s, tokens), (ray_s, ray_tokens) = results["local"], results["ray"]
    assert tokens == ray_tokens, "count: the Ray count pass counted other tokens"
    per = 1e9 / len(texts)
    print(f"count: {len(texts)} docs, {tokens} tokens ({tokens / len(texts):.0f}/doc): local (1 worker) "
          f"{local_s:.1f} s, ray (2 x 1 CPU) {ray_s:.1f} s; per 1e9 docs: local {local_s * per / 3600:.0f} CPU-h, ray "
          f"{ray_s * per / 3600:.0f} h on this 2-CPU cluster", flush=True)  # fmt: skip
    return {"documents": len(texts), "tokens": tokens, "local_s": local_s, "ray_s": ray_s,
            "local_h_per_1e9": local_s * per / 3600, "ray_h_per_1e9": ray_s * per / 3600}  # fmt: skip


if __name__ == "__main__":
    main()
