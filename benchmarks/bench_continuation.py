"""Continuation cost: writing a plan that continues another at step N, against planning the new config fresh.

Run: python benchmarks/bench_continuation.py [--documents 1000000] [--at-fraction 0.5]

Plans the demo corpus (repeated: an exact wrap plan of ``--documents`` documents, counted once), then the new
configuration (other weights, a larger budget) twice in the same run: fresh, and as a continuation branching
at ``--at-fraction`` of the parent's steps. A continuation reads the parent's samples, checks each kept
dataset's reading order and skips those documents in the new readers, so it costs about one fresh plan plus
reading the parent: the printed ratio continuation / fresh says by how much.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--at-fraction", type=float, default=0.5)
    parser.add_argument("--global-batch", type=int, default=64)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zephon-continue-"))
    os.environ["ZEPHON_CACHE_DIR"] = str(root / "cache")

    from zephon.demo import demo_dataset_paths, demo_tokenizer_path
    from zephon.errors import PlanWarning
    from zephon.io import Dataset
    from zephon.plan.manifest import read_manifest
    from zephon.specs import PackSpec, TokenizeSpec
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    warnings.simplefilter("ignore", PlanWarning)  # the demo corpus is repeated on purpose
    tok = TokenizeSpec(tokenizer_id=demo_tokenizer_path())
    pack = PackSpec(max_length=257)
    datasets = [Dataset.from_path(k, v) for k, v in demo_dataset_paths(root / "data").items()]
    names = [d.name for d in datasets]

    def source(weights: list[float], documents: int) -> StaticMixtureWorkSource:
        return StaticMixtureWorkSource(
            datasets=datasets, mixture=MixtureSpec(dict(zip(names, weights, strict=True))), seed=3,
            num_documents=documents, exact_tokens=True,
        )  # fmt: skip

    parent = source([0.5, 0.3, 0.2], args.documents).plan(root / "parent", tokenize=tok, pack=pack)
    steps = read_manifest(parent).exact_packing().sequences // args.global_batch
    at = int(steps * args.at_fraction)
    new = source([0.2, 0.3, 0.5], int(args.documents * 1.5))
    t0 = time.perf_counter()
    new.plan(root / "fresh", tokenize=tok, pack=pack)
    fresh = time.perf_counter() - t0
    t0 = time.perf_counter()
    child = new.plan(root / "child", tokenize=tok, pack=pack, continue_from=parent, at_step=at,
                     global_batch=args.global_batch)  # fmt: skip
    continued = time.perf_counter() - t0
    lineage = read_manifest(child).lineage
    assert lineage is not None
    print(f"parent: {args.documents} documents, {steps} steps of {args.global_batch} rows; branch at step {at}, "
          f"position {lineage.branch.position}; new plan {int(args.documents * 1.5)} documents")  # fmt: skip
    print(f"fresh plan of the new config: {fresh:.2f} s; continuation: {continued:.2f} s; "
          f"ratio continuation / fresh: {continued / fresh:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
