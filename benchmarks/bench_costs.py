"""Sample costs at scale: what ``cost=`` and ``pack_samples`` add to planning, and what a packed run costs.

Run: python benchmarks/bench_costs.py [--samples 1e6] [--shards 20] [--max-cost 4096] [--json FILE]
                                     [--computed-samples 4096] [--computed-shards 8] [--computed-only]

Writes N records in ``--shards`` Parquet shards (``caption`` a short dictionary string, ``text_tokens`` int32
8-64, ``width``/``height`` int32 64-512, ``jpg`` 64 bytes) and times, each from a fresh plan:

* **samples**: a sample mixture (no cost) — the baseline;
* **cost**: the same with ``cost="text_tokens + ceil(width / 14.0) * ceil(height / 14.0)"`` (DuckDB reads the
  three columns and the plan carries the costs);
* **cost + pack**: plus ``pack_samples(max_cost=...)`` (best-fit rows over the costs, bins.parquet);

(each the best of two fresh plans), then iterates a packed run (``.batch(microbatch_size=8)``, rows per
microbatch) and a plain record run for ``--steps`` microbatches each, reporting samples/s of each.

Printed: seconds per plan and ratios to the baseline; the rows' fill fraction and samples per row.

Then the **computed cost pass** (``cost=computed_cost("module:fn")``, ``zephon.planner.counts.computed``) over
``--computed-samples`` WebDataset samples in ``--computed-shards`` plain tars: real JPEGs of 64-512 px a side
(noise, quality 90, written once with Pillow) and a caption; the function opens each JPEG with Pillow for its
width and height (``Image.open(...).size``: the header, no pixel decode) and returns patches + caption bytes / 4.
Timed: a plan whose pass runs in this process (``workers=1``), one with 2 worker processes, each with an empty
cost cache, and a plan whose costs all come from the cache; samples/s of each plan (scan + pass + layout).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

COST = "text_tokens + ceil(width / 14.0) * ceil(height / 14.0)"


def write_records(root: Path, samples: int, shards: int) -> Path:
    folder = root / "pairs"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    bounds = np.linspace(0, samples, shards + 1).astype(np.int64)
    caption = pa.DictionaryArray.from_arrays(pa.array(np.zeros(1, np.int32)), pa.array(["a photo"]))
    for s in range(shards):
        n = int(bounds[s + 1] - bounds[s])
        table = pa.table(
            {
                "caption": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), caption.dictionary),
                "text_tokens": rng.integers(8, 65, n, dtype=np.int32),
                "width": rng.integers(64, 513, n, dtype=np.int32),
                "height": rng.integers(64, 513, n, dtype=np.int32),
                "jpg": pa.array([b"\xff" * 64] * n, pa.binary()),
            }
        )
        pq.write_table(table, folder / f"part-{s:05d}.parquet", row_group_size=65_536)
    return folder


#: The computed pass's cost function (written into a module the planner and its workers import by path).
FUNCTION = """
import io, math
from PIL import Image

def patches(sample):
    width, height = Image.open(io.BytesIO(sample["jpg"])).size
    return math.ceil(width / 14) * math.ceil(height / 14) + len(sample["txt"]) / 4
"""


def write_jpeg_tars(root: Path, samples: int, shards: int) -> Path:
    """``shards`` plain tars of real JPEGs (64-512 px a side, noise, quality 90) and captions, seed 0."""
    import io
    import tarfile

    from PIL import Image

    folder = root / "jpegs"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    bounds = np.linspace(0, samples, shards + 1).astype(np.int64)
    for s in range(shards):
        with tarfile.open(folder / f"{s:05d}.tar", "w") as tar:
            for i in range(int(bounds[s]), int(bounds[s + 1])):
                width, height = (int(v) for v in rng.integers(64, 513, 2))
                pixels = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
                image = io.BytesIO()
                Image.fromarray(pixels).resize((width, height)).save(image, "JPEG", quality=90)
                for ext, payload in (("jpg", image.getvalue()), ("txt", f"a photo number {i}".encode())):
                    info = tarfile.TarInfo(f"{i:08d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    return folder


def computed_pass(root: Path, samples: int, shards: int) -> dict[str, float]:
    """Samples/s of plans whose costs the computed pass makes: 1 worker, 2 workers (empty caches), cached."""
    import sys

    from zephon.io import Dataset
    from zephon.records import computed_cost
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    t = time.perf_counter()
    folder = write_jpeg_tars(root, samples, shards)
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(f"wrote {samples:,} JPEG samples in {shards} tars ({size / 1e6:.1f} MB) in {time.perf_counter() - t:.1f} s")
    (root / "bench_cost_fn.py").write_text(FUNCTION)
    sys.path.insert(0, str(root))
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("jpegs", folder, cost=computed_cost("bench_cost_fn:patches"))],
        mixture=MixtureSpec({"jpegs": 1.0}),
        seed=1,
    )
    out: dict[str, float] = {}
    plans = {}
    for name, workers, cache in (("1 worker", 1, "c1"), ("2 workers", 2, "c2"), ("cached", 2, "c2")):
        os.environ["ZEPHON_CACHE_DIR"] = str(root / cache)
        t = time.perf_counter()
        plans[name] = source.plan(root / f"computed-{name.replace(' ', '-')}", workers=workers)
        seconds = time.perf_counter() - t
        out[name] = samples / seconds
        print(f"computed pass, {name:<9} {seconds:7.2f} s   {out[name]:9,.0f} samples/s")
    same = {(p / "samples.parquet").read_bytes() for p in plans.values()}
    print(f"samples.parquet identical across the three: {len(same) == 1}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=float, default=1e6)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--max-cost", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--computed-samples", type=int, default=4096)
    parser.add_argument("--computed-shards", type=int, default=8)
    parser.add_argument("--computed-only", action="store_true", help="time the computed cost pass only")
    args = parser.parse_args()
    if args.computed_only:
        computed = computed_pass(Path(tempfile.mkdtemp(prefix="zephon-bench-costs-")), args.computed_samples,
                                 args.computed_shards)  # fmt: skip
        if args.json is not None:
            args.json.write_text(json.dumps({"computed_samples_per_second": computed}))
        return

    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.specs import SamplePackSpec
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    root = Path(tempfile.mkdtemp(prefix="zephon-bench-costs-"))
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    samples = int(args.samples)
    t = time.perf_counter()
    folder = write_records(root, samples, args.shards)
    print(f"wrote {samples:,} records in {args.shards} shards in {time.perf_counter() - t:.1f} s ({root})")

    def source(cost: str | None) -> StaticMixtureWorkSource:
        return StaticMixtureWorkSource(
            datasets=[Dataset.from_path("pairs", folder, cost=cost)], mixture=MixtureSpec({"pairs": 1.0}), seed=1
        )

    results: dict[str, float] = {}
    plans: dict[str, Path] = {}
    for name, cost, pack in (
        ("samples", None, None),
        ("cost", COST, None),
        ("cost + pack", COST, SamplePackSpec(max_cost=args.max_cost)),
    ):
        times = []
        for attempt in range(2):  # the best of two fresh plans: the first of the run also pays for imports
            t = time.perf_counter()
            plans[name] = source(cost).plan(root / f"{name.replace(' + ', '_')}-{attempt}", sample_pack=pack)
            times.append(time.perf_counter() - t)
        results[name] = min(times)
    base = results["samples"]
    for name, seconds in results.items():
        print(f"plan {name:<12} {seconds:7.2f} s   ×{seconds / base:.2f} of the sample plan")
    packing = json.loads((plans["cost + pack"] / "plan.json").read_text())["sample_packing"]
    print(
        f"rows: {packing['rows']:,} of max_cost {args.max_cost}, fill {packing['fill_fraction']:.4f}, "
        f"{samples / packing['rows']:.2f} samples per row"
    )

    runs: dict[str, float] = {}
    for name, plan in (("records", plans["samples"]), ("packed rows", plans["cost + pack"])):
        pipe = Pipeline.from_plan(plan).batch(microbatch_size=8)
        t = time.perf_counter()
        seen = 0
        for i, batch in enumerate(pipe):
            seen += len(batch)
            if i + 1 >= args.steps:
                break
        runs[name] = seen / (time.perf_counter() - t)
        print(f"run {name:<12} {runs[name]:12,.0f} samples/s ({seen:,} samples in {args.steps} microbatches)")
    computed = computed_pass(root, args.computed_samples, args.computed_shards)
    if args.json is not None:
        report = {"plan_seconds": results, "samples_per_second": runs, "packing": packing}
        args.json.write_text(json.dumps(report | {"computed_samples_per_second": computed}))


if __name__ == "__main__":
    main()
