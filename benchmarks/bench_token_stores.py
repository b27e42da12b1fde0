"""Packing a token-store plan on one rank against a bare memory-map copy of the same ids; planning many parts.

Run: python benchmarks/bench_token_stores.py [--tokens 200000000] [--max-length 2049] [--parts 2000]

1. **Run.** Writes a synthetic Megatron store under /tmp (``--tokens`` uint16 ids, documents of 16-800 ids, so
   ~``tokens / 408`` documents; ids < 4,096, the demo tokenizer's vocabulary), plans it exactly (wrap,
   ``--max-length``, every document once, shuffled), and runs rank 0 of dp 1 over the whole plan
   (``Pipeline.from_plan(...).pack_flat(max_length).batch(microbatch_size=M)``, ``--microbatch`` M = 8). Prints
   the plan's time, the run's first-batch latency and its tokens/s, and the same ids copied bare —
   ``np.memmap`` of the ``.bin``, each planned document's slice concatenated a chunk of 1,024 documents at a
   time, in plan order, then cut in rows (int64, as the run hands them out) — measured in the same process,
   and the ratio run ÷ bare. The issue's bar: ≥ 50 M tokens/s and ≥ 0.5×.
   The run's rows are checked against the bare copy's (first and last rows, and the total).
2. **Planning many parts.** Writes ``--parts`` small Megatron prefixes (each 20-200 documents) in one folder,
   plans them (samples mixture), and counts the files the planner opened: only the ``.idx`` are read
   (``.bin`` sizes come from the listing).
"""

from __future__ import annotations

import argparse
import builtins
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

import numpy as np

EOS = 0


def write_store(prefix: Path, lengths: np.ndarray, rng: np.random.Generator) -> None:
    """A Megatron-Core ``.idx``/``.bin`` (uint16, one sequence a document), ids in [1, 4096) and each document's
    last id EOS, written in blocks so memory stays small."""
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]) * 2
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), len(lengths) + 1)
    with open(prefix.with_suffix(".idx"), "wb") as f:
        f.write(head)
        f.write(lengths.astype(np.int32).tobytes())
        f.write(pointers.astype(np.int64).tobytes())
        f.write(np.arange(len(lengths) + 1, dtype=np.int64).tobytes())
    ends = np.cumsum(lengths)
    with open(prefix.with_suffix(".bin"), "wb") as f:
        block = 1 << 24
        total = int(ends[-1])
        for lo in range(0, total, block):
            hi = min(total, lo + block)
            ids = rng.integers(1, 4096, size=hi - lo, dtype=np.uint16)
            last = ends[(ends > lo) & (ends <= hi)] - 1 - lo  # each document's last id: EOS
            ids[last] = EOS
            f.write(ids.tobytes())


def bare_copy(prefix: Path, order: np.ndarray, width: int) -> tuple[float, np.ndarray, np.ndarray, int]:
    """The planned documents' ids sliced from an ``np.memmap`` and concatenated, 1,024 documents at a time, cut
    in rows of ``width``: (seconds, first row, last row, tokens)."""
    from zephon.executor.token_stores import open_token_store

    start = time.perf_counter()
    store = open_token_store(str(prefix), fmt="megatron")
    starts = store.parts[0].doc_starts  # type: ignore[attr-defined]
    mm = np.memmap(prefix.with_suffix(".bin"), dtype=np.uint16, mode="r")
    carry = np.zeros(0, dtype=np.uint16)
    total, first, last = 0, None, None
    for lo in range(0, len(order), 1024):
        docs = order[lo : lo + 1024]
        chunk = np.concatenate([carry, *(mm[starts[d] : starts[d + 1]] for d in docs.tolist())])
        whole = len(chunk) // width * width
        rows = chunk[:whole].reshape(-1, width).astype(np.int64)
        if len(rows):
            first = rows[0] if first is None else first
            last = rows[-1]
        total += whole
        carry = chunk[whole:]
    if len(carry):
        last, total = carry.astype(np.int64), total + len(carry)
    seconds = time.perf_counter() - start
    assert first is not None and last is not None
    return seconds, first, last, total


def bench_run(root: Path, tokens: int, width: int, microbatch: int) -> None:
    from zephon import Pipeline
    from zephon.demo import demo_tokenizer_path
    from zephon.io import Dataset
    from zephon.specs import PackSpec, TokenizeSpec
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    rng = np.random.default_rng(0)
    lengths = rng.integers(16, 801, size=max(1, tokens // 408)).astype(np.int64)
    (root / "store").mkdir()
    prefix = root / "store" / "web"
    t = time.perf_counter()
    write_store(prefix, lengths, rng)
    print(f"store: {int(lengths.sum()):,} uint16 ids in {len(lengths):,} documents, written in "
          f"{time.perf_counter() - t:.1f} s")  # fmt: skip
    tok = demo_tokenizer_path()
    web = Dataset.from_path("web", prefix, fmt="megatron")
    source = StaticMixtureWorkSource(datasets=[web], mixture=MixtureSpec({"web": 1.0}), seed=0, exact_tokens=True)
    t = time.perf_counter()
    plan = source.plan(root / "plan", tokenize=TokenizeSpec(tokenizer_id=tok), pack=PackSpec(max_length=width))
    print(f"plan: {time.perf_counter() - t:.1f} s (exact, wrap {width}, every document once)")

    import pyarrow.parquet as pq

    order = pq.read_table(plan / "samples.parquet", columns=["position", "row"]).sort_by("position")["row"]
    order = order.to_numpy().astype(np.int64)
    bare_s, bare_first, bare_last, bare_tokens = bare_copy(prefix, order, width)

    pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=tok).pack_flat(max_length=width)
    pipe = pipe.batch(microbatch_size=microbatch)
    start = time.perf_counter()
    first_batch, got, first, last = None, 0, None, None
    for b in pipe:
        if first_batch is None:
            first_batch = time.perf_counter() - start
            first = b.tokens[0, : b.lengths[0]].copy()
        got += int(b.lengths.sum())
        n = int(np.flatnonzero(b.lengths)[-1]) if b.lengths.any() else 0
        last = b.tokens[n, : b.lengths[n]].copy()
    run_s = time.perf_counter() - start
    assert got == bare_tokens, (got, bare_tokens)
    assert first is not None and last is not None
    assert np.array_equal(first, bare_first) and np.array_equal(last, bare_last)
    run_rate, bare_rate = got / run_s, bare_tokens / bare_s
    print(f"run:  {got:,} tokens in {run_s:.2f} s = {run_rate / 1e6:.1f} M tokens/s (first batch {first_batch:.2f} s)")
    print(f"bare: {bare_tokens:,} tokens in {bare_s:.2f} s = {bare_rate / 1e6:.1f} M tokens/s (np.memmap slices)")
    print(f"ratio run / bare: {run_rate / bare_rate:.2f}  (bar: >= 50 M tokens/s and >= 0.5)")


def bench_parts(root: Path, parts: int) -> None:
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    rng = np.random.default_rng(1)
    folder = root / "parts"
    folder.mkdir()
    t = time.perf_counter()
    for j in range(parts):
        write_store(folder / f"part_{j:05d}", rng.integers(4, 200, size=int(rng.integers(20, 200))), rng)
    print(f"parts: {parts:,} Megatron prefixes written in {time.perf_counter() - t:.1f} s")
    opened: dict[str, int] = {}
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = os.fspath(file) if isinstance(file, (str, os.PathLike)) else ""
        if name.startswith(str(folder)):  # np.memmap opens its file with open() too
            opened[Path(name).suffix] = opened.get(Path(name).suffix, 0) + 1
        return real_open(file, *args, **kwargs)

    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("many", folder, fmt="megatron")],
        mixture=MixtureSpec({"many": 1.0}),
        seed=0,
    )
    builtins.open = counting_open
    try:
        t = time.perf_counter()
        source.plan(root / "parts-plan")
        seconds = time.perf_counter() - t
    finally:
        builtins.open = real_open
    print(f"plan of {parts:,} parts: {seconds:.2f} s; files opened by suffix: {dict(sorted(opened.items()))}")
    assert opened.get(".bin", 0) == 0, opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=200_000_000)
    parser.add_argument("--max-length", type=int, default=2049)
    parser.add_argument("--parts", type=int, default=2000)
    parser.add_argument("--microbatch", type=int, default=8)
    parser.add_argument("--skip-run", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zephon-token-stores-", dir="/tmp"))
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    try:
        if not args.skip_run:
            bench_run(root, args.tokens, args.max_length, args.microbatch)
        if args.parts:
            bench_parts(root, args.parts)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
