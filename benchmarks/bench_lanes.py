"""Per-rank cost of one lane per row of the global batch (the default since format 2) against 8 fixed lanes.

Run: python benchmarks/bench_lanes.py [--documents 40000] [--max-length 513] [--global-batch 64] [--dp 4]

Plans the demo corpus twice with the same mixture and seed — once with ``lanes=8`` (the old default), once
with no fixed lanes (``L = G``) — and runs rank 0 of ``--dp`` ranks on each, interleaved ``--repeats`` times so
both see the same machine load. Prints each run's wall time, tokens handed out per second, the documents it
tokenized (its own lanes' plus the calibration of ``zephon.executor.pack.run_length``), and the ratios per-row ÷
fixed. Also prints ``num_steps()`` against the last step that held a token (the end's slack).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=40_000)
    parser.add_argument("--max-length", type=int, default=513)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zephon-lanes-"))
    os.environ["ZEPHON_CACHE_DIR"] = str(root / "cache")

    from zephon import Pipeline
    from zephon.demo import demo_dataset_paths, demo_tokenizer_path
    from zephon.executor.encode.text import Encoder
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    tok = demo_tokenizer_path()
    datasets = [Dataset.from_path(k, v) for k, v in demo_dataset_paths(root / "data").items()]
    plans = {}
    for name, lanes in (("fixed-8", 8), ("per-row", None)):
        src = StaticMixtureWorkSource(
            datasets=datasets,
            mixture=MixtureSpec({"prose": 0.5, "code": 0.3, "short": 0.2}),
            seed=0,
            num_documents=args.documents,
            lanes=lanes,
        )
        plans[name] = src.plan(root / name)

    tokenized = [0]
    encode = Encoder.encode_flat

    def counting(self, texts, **kw):  # type: ignore[no-untyped-def]
        tokenized[0] += len(texts)
        return encode(self, texts, **kw)

    Encoder.encode_flat = counting  # type: ignore[method-assign]

    def run(plan: Path) -> tuple[float, int, int, int, int]:
        p = (
            Pipeline.from_plan(plan)
            .options(dp_rank=0, dp_size=args.dp)
            .tokenize(tokenizer_id=tok)
            .pack_flat(max_length=args.max_length)
            .batch(microbatch_size=args.global_batch // args.dp, global_batch_size=args.global_batch)
        )
        tokenized[0] = 0
        t0 = time.perf_counter()
        tokens, last = 0, -1
        for batch in p:
            n = int(batch.lengths.sum())
            tokens += n
            if n:
                last = batch.step
        return time.perf_counter() - t0, tokens, tokenized[0], p.num_steps(), last

    results: dict[str, list[tuple[float, int, int, int, int]]] = {name: [] for name in plans}
    for _ in range(args.repeats):
        for name, plan in plans.items():
            results[name].append(run(plan))
    print(f"rank 0 of {args.dp}, global batch {args.global_batch}, max_length {args.max_length}, {args.documents} docs")
    print(f"{'lanes':9} {'best s':>8} {'tokens/s':>10} {'docs tokenized':>15} {'num_steps':>10} {'last step':>10}")
    best = {}
    for name, runs in results.items():
        seconds, tokens, docs, steps, last = min(runs)
        best[name] = (seconds, tokens, docs)
        print(f"{name:9} {seconds:8.2f} {tokens / seconds:10.0f} {docs:15d} {steps:10d} {last + 1:10d}")
    (s8, t8, d8), (sr, tr, dr) = best["fixed-8"], best["per-row"]
    print(f"\nratio per-row ÷ fixed-8: tokens/s {(tr / sr) / (t8 / s8):.3f}, documents tokenized {dr / d8:.3f}")


if __name__ == "__main__":
    main()
