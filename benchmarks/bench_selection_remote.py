"""Selections on s3:// (moto's S3 server on 127.0.0.1) against the same selection on the local copy.

Writes ``--shards`` Parquet shards of ``--rows`` documents (an 800-byte text, an int score, a language, in row
groups of 10,000) and a sidecar of one float per document, uploads them, then times ``select_rows`` of
``where="score >= 3 AND lang = 'en'"`` joined to the sidecar, locally (DuckDB reads the files) and on s3://
(the selection's columns fetched by pinned range GETs, ``zephon.planner.selection.tables``). Prints both, their
ratio and the GETs by kind, and checks both select the same rows.

    python benchmarks/bench_selection_remote.py --shards 8 --rows 100000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def _write(root: Path, shards: int, rows: int) -> None:
    rng = np.random.default_rng(0)
    (root / "web").mkdir(parents=True)
    (root / "side").mkdir()
    ids, quality = [], []
    text = "x" * 800
    for s in range(shards):
        shard_ids = [f"{s}-{r}" for r in range(rows)]
        table = pa.table(
            {
                "id": shard_ids,
                "text": pa.array([text + str(r) for r in range(rows)]),
                "score": rng.integers(0, 6, rows),
                "lang": np.where(rng.random(rows) < 0.8, "en", "fr"),
            }
        )
        pq.write_table(table, root / "web" / f"{s:04d}.parquet", row_group_size=10_000)
        ids += shard_ids
        quality.append(rng.random(rows))
    pq.write_table(pa.table({"id": ids, "quality": np.concatenate(quality)}), root / "side" / "q.parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    from servers.object_fixtures import Bucket
    from servers.object_servers import S3Server

    from zephon.io import Dataset
    from zephon.planner.selection import evaluate as sel
    from zephon.storage.objects.reads import REQUESTS

    with tempfile.TemporaryDirectory(prefix="bench-select-remote-") as tmp:
        work = Path(tmp)
        os.environ["ZEPHON_CACHE_DIR"] = str(work / "cache")
        _write(work / "data", args.shards, args.rows)
        server = S3Server(log=work / "moto.log")
        try:
            os.environ.update(server.env())
            server.create_bucket("bench")
            bucket = Bucket(server=server, cloud="s3", name="bench")
            bucket.upload_dir(work / "data", "data/")
            kw = {"where": "score >= 3 AND lang = 'en' AND quality > 0.2", "key": "id"}
            local = Dataset.from_path("web", work / "data" / "web", metadata=work / "data" / "side", **kw)
            remote = Dataset.from_path("web", bucket.url("data/web/"), metadata=bucket.url("data/side/"), **kw)
            local_refs = tuple(s.placed(shard_id=i, dataset_id=0, dataset="web") for i, s in enumerate(local.shards()))
            remote_refs = tuple(
                s.placed(shard_id=i, dataset_id=0, dataset="web") for i, s in enumerate(remote.shards())
            )
            assert local.selection is not None and remote.selection is not None
            start = time.perf_counter()
            a = sel.select_rows(local.selection, local_refs, seed=1, dataset_index=0)
            local_s = time.perf_counter() - start
            before = dict(REQUESTS)
            start = time.perf_counter()
            b = sel.select_rows(remote.selection, remote_refs, seed=1, dataset_index=0)
            remote_s = time.perf_counter() - start
            gets = {k: v - before.get(k, 0) for k, v in REQUESTS.items() if v != before.get(k, 0)}
        finally:
            server.stop()
        assert np.array_equal(a.shard, b.shard) and np.array_equal(a.row, b.row) and a.report == b.report
        size = sum(r.bytes for r in remote_refs)
        print(f"{args.shards} shards x {args.rows} rows ({size / 1e6:.1f} MB), selected {a.report.selected}")
        print(f"local (DuckDB on files): {local_s:.2f} s")
        print(f"s3:// (moto, range GETs): {remote_s:.2f} s  ratio {remote_s / local_s:.2f}x  GETs {gets}")


if __name__ == "__main__":
    main()
