"""Planning WebDataset tar shards: 10^4 local shards from their headers, and 10^3 on S3 (moto) by range GETs.

Run: python benchmarks/bench_tar_planning.py [--shards 10000] [--s3-shards 1000] [--samples 8] [--image 2000]

Corpus: ``--shards`` tar files of ``--samples`` samples each, ``{key}.jpg`` (``--image`` random bytes; nothing is
decoded) + ``{key}.txt`` + ``{key}.json``, written with ``tarfile``. One dataset, planned by samples
(``StaticMixtureWorkSource(...).plan``) with an empty ``$ZEPHON_CACHE_DIR``. Reported:

* wall seconds and CPU seconds (this process and its children, ``resource.getrusage``) of the whole plan —
  listing, scanning every shard's headers, laying out and writing the bundle;
* bytes read per shard: ``TarIndex.bytes_read`` of the same walk planning makes (headers only: 512 bytes per
  member plus the end-of-archive block), and the process's ``rchar`` growth during planning (every byte the
  process read through system calls — headers, Python's own files — an upper bound);
* S3: ``--s3-shards`` of the same shards uploaded to moto's S3 server (127.0.0.1, started here) and planned from
  range GETs of the headers (``zephon.storage.objects.tars``): wall, CPU and GETs per shard by kind
  (``REQUESTS``), then the same plan again (the index kept by pin: no GET but the listing).
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def shard_bytes(shard: int, samples: int, image: int) -> bytes:
    rng = np.random.default_rng(shard)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for i in range(samples):
            key = f"{shard:06d}{i:04d}"
            members = {
                "jpg": rng.integers(0, 256, image, dtype=np.uint8).tobytes(),
                "txt": f"caption {shard}-{i}".encode(),
                "json": b'{"i": %d}' % i,
            }
            for ext, payload in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def plan(url: str, out: Path) -> tuple[float, float, int]:
    """``(wall, cpu, rchar)`` of planning the one dataset at ``url`` into ``out``."""
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("pairs", url)], mixture=MixtureSpec({"pairs": 1.0}), seed=1
    )
    wall, used, read = time.perf_counter(), cpu(), rchar()
    source.plan(out)
    return time.perf_counter() - wall, cpu() - used, rchar() - read


def main() -> None:
    import warnings

    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--s3-shards", type=int, default=1_000)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--image", type=int, default=2_000)
    args = parser.parse_args()

    from zephon.storage.tar_index import tar_index

    work = Path(tempfile.mkdtemp(prefix="zephon-bench-tars-"))
    os.environ["ZEPHON_CACHE_DIR"] = str(work / "cache")
    folder = work / "wds"
    folder.mkdir()
    start = time.perf_counter()
    blobs = {}
    for s in range(max(args.shards, args.s3_shards)):
        data = shard_bytes(s, args.samples, args.image)
        if s < args.shards:
            (folder / f"{s:06d}.tar").write_bytes(data)
        if s < args.s3_shards:
            blobs[f"wds/{s:06d}.tar"] = data
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(
        f"corpus: {args.shards} shards x {args.samples} samples (jpg {args.image} B + txt + json), "
        f"{size / 1e6:.1f} MB, written in {time.perf_counter() - start:.1f} s; cores {os.cpu_count()}, "
        f"load {os.getloadavg()[0]:.1f}"
    )

    wall, used, read = plan(str(folder), work / "plan-local")
    headers = [tar_index(str(p), "tar", p.stat().st_size, "x").bytes_read for p in sorted(folder.iterdir())[:1000]]
    print(
        f"local: {args.shards} shards planned in {wall:.2f} s wall, {used:.2f} s CPU "
        f"({wall / args.shards * 1e3:.2f} ms per shard); headers read per shard {np.mean(headers):.0f} B "
        f"of {size / args.shards:.0f} B; process rchar {read / args.shards:.0f} B per shard"
    )

    if args.s3_shards:
        from servers.object_fixtures import Bucket
        from servers.object_servers import S3Server

        from zephon.storage.objects.reads import REQUESTS

        server = S3Server(log=work / "moto.log")
        try:
            os.environ.update(server.env())
            server.create_bucket("bench")
            Bucket(server=server, cloud="s3", name="bench").put_many(blobs)
            os.environ["ZEPHON_CACHE_DIR"] = str(work / "cache-s3")
            REQUESTS.clear()
            wall, used, _ = plan("s3://bench/wds/", work / "plan-s3")
            gets = dict(REQUESTS)
            n = args.s3_shards
            per = {k: round(v / n, 3) for k, v in gets.items()}
            print(f"s3 (moto): {n} shards planned in {wall:.2f} s wall, {used:.2f} s CPU; GETs {gets}, per shard {per}")
            REQUESTS.clear()
            wall, used, _ = plan("s3://bench/wds/", work / "plan-s3-again")
            print(f"s3 again (index kept by pin): {wall:.2f} s wall, {used:.2f} s CPU; GETs {dict(REQUESTS)}")
            same = (work / "plan-s3" / "samples.parquet").read_bytes() == (
                work / "plan-s3-again" / "samples.parquet"
            ).read_bytes()
            print(f"s3 plans identical: {same}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
