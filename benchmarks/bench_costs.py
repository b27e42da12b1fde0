"""Sample costs at scale: what ``cost=`` and ``pack_samples`` add to planning, and what a packed run costs.

Run: python benchmarks/bench_costs.py [--samples 1e6] [--shards 20] [--max-cost 4096] [--json FILE]

Writes N records in ``--shards`` Parquet shards (``caption`` a short dictionary string, ``text_tokens`` int32
8-64, ``width``/``height`` int32 64-512, ``jpg`` 64 bytes) and times, each from a fresh plan:

* **samples**: a sample mixture (no cost) — the baseline;
* **cost**: the same with ``cost="text_tokens + ceil(width / 14.0) * ceil(height / 14.0)"`` (DuckDB reads the
  three columns and the plan carries the costs);
* **cost + pack**: plus ``pack_samples(max_cost=...)`` (best-fit rows over the costs, bins.parquet);

(each the best of two fresh plans), then iterates a packed run (``.batch(microbatch_size=8)``, rows per
microbatch) and a plain record run for ``--steps`` microbatches each, reporting samples/s of each.

Printed: seconds per plan and ratios to the baseline; the rows' fill fraction and samples per row.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=float, default=1e6)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--max-cost", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

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
    if args.json is not None:
        args.json.write_text(json.dumps({"plan_seconds": results, "samples_per_second": runs, "packing": packing}))


if __name__ == "__main__":
    main()
