"""Cutting a block of rows from packing lanes (``zephon.executor.pack.lanes``), against another checkout.

Run: python benchmarks/bench_cut.py [--tokenizer deepseek-v4|cl100k-converter] [--before PYTHON] [--rounds 5]

The cut alone — what the caller's thread does per block of an estimated plan: deal chunks of documents to the
lanes as they run short, find every row's documents, copy their ids, move the cursors and take each
microbatch's snapshot — on documents whose sizes and ids are real: the local corpus (``local_corpus.py``: prose,
code and docstrings of this machine's files) tokenized by a vendor tokenizer (``vendor_tokenizers.py``), dealt
in chunks of 256 documents to the lanes in turn. Shapes (max_length, lanes, rows a block, rows a microbatch):
the benchmark's default (2049, 8, 56, 8: ``bench_executor.py``'s microbatch of 8 rows, blocks of
``BLOCK_TOKENS``), a rank of 64 lanes cutting one microbatch of 64 rows, and short rows (513, 32, 256, 32).

Each shape runs in a fresh process of this checkout's Python and of ``--before``'s (a venv whose ``zephon`` is
another checkout; the older ``pop_rows(lanes, prepare, marks=, mark=)`` is driven the same way), interleaved,
``--rounds`` times; prints µs per block — the dealing's own time (``push_many``) left out, since it is the same
code in both — best of the rounds, and after ÷ before.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = [(2049, 8, 56, 8), (2049, 64, 64, 64), (513, 32, 256, 32)]
CHUNK = 256  # documents dealt at a time
BLOCKS = 150


def measure(sizes_path: str, shape: tuple[int, int, int, int]) -> float:
    """µs per block cut, dealing excluded (in this process: one checkout)."""
    import numpy as np

    from zephon.executor.encode.flags import ID
    from zephon.executor.pack import lanes as pack
    from zephon.executor.pack.lane_store import LaneStore

    width, count, rows, micro = shape
    data = np.load(sizes_path)
    sizes, ids = data["sizes"], data["ids"]
    starts = np.concatenate(([0], np.cumsum(sizes)))
    store = LaneStore(np.dtype(ID))
    lanes = [pack.Lane(width, 0, store=store) for _ in range(count)]
    dealt, spent = [0], [0.0]

    def fill() -> bool:
        began = time.perf_counter()
        first = dealt[0]
        docs = (first + np.arange(CHUNK)) % len(sizes)
        lane_of = np.arange(first, first + CHUNK) % count
        for k in range(count):
            mine = docs[lane_of == k]
            pieces = [ids[starts[d] : starts[d + 1]] for d in mine.tolist()]
            positions = first + np.flatnonzero(lane_of == k)
            lanes[k].push_many(positions.astype(np.int64), np.concatenate(pieces), sizes[mine].astype(np.int64))
        dealt[0] += CHUNK
        spent[0] += time.perf_counter() - began
        return True

    order = np.tile(np.arange(count), rows // count + 1)[:rows]
    marks = list(range(micro, rows, micro))
    new = hasattr(pack, "cut_block")

    def cut() -> None:
        if new:
            pack.cut_block(lanes, order, fill, marks)
            return

        def prepare(lane: pack.Lane) -> None:
            while not lane.ready():
                fill()

        def mark(block: int, done: int) -> None:
            [lane.snapshot(block, done) for lane in lanes]

        pack.pop_rows([lanes[k] for k in order.tolist()], prepare, marks=marks, mark=mark)

    for _ in range(20):
        cut()
    spent[0] = 0.0
    began = time.perf_counter()
    for _ in range(BLOCKS):
        cut()
    return (time.perf_counter() - began - spent[0]) / BLOCKS * 1e6


def corpus_sizes(root: Path, tokenizer: str) -> Path:
    """Token ids of the local corpus's documents under ``tokenizer``, saved once (sizes + ids)."""
    out = root / f"sizes-{tokenizer}.npz"
    if out.exists():
        return out
    import numpy as np
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import local_corpus
    import vendor_tokenizers

    corpus = local_corpus.build(root / "corpus", limit=6_000, code_limit=1_500)
    tok = Tokenizer.from_file(str(vendor_tokenizers.build(tokenizer, root / "tokenizers") / "tokenizer.json"))
    shards = sorted(corpus.glob("*/*.parquet"))
    texts = [t for f in shards for t in pq.read_table(f, columns=["text"])["text"].to_pylist()]
    encoded = [np.asarray(e.ids, dtype=np.int32) for e in tok.encode_batch(texts, add_special_tokens=False)]
    np.savez(out, sizes=np.array([len(e) for e in encoded], dtype=np.int64), ids=np.concatenate(encoded))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="deepseek-v4", choices=["deepseek-v4", "cl100k-converter"])
    parser.add_argument("--before", help="python of a venv running another checkout")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "zephon-bench-cut"))
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)  # internal: SIZES_PATH SHAPE_JSON
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], tuple(json.loads(args.measure[1])))))
        return
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    sizes = corpus_sizes(root, args.tokenizer)
    import numpy as np

    got = np.load(sizes)["sizes"]
    print(f"{args.tokenizer}: {len(got)} local-corpus documents, {int(got.sum())} tokens, median {int(np.median(got))}")
    pythons = {"after": sys.executable, **({"before": args.before} if args.before else {})}
    best: dict[tuple[str, tuple[int, int, int, int]], float] = {}
    for r in range(args.rounds):
        for shape in SHAPES:
            for label, python in pythons.items():
                run = [python, __file__, "--measure", str(sizes), json.dumps(shape)]
                us = float(subprocess.run(run, check=True, capture_output=True, text=True).stdout.split()[-1])
                best[label, shape] = min(us, best.get((label, shape), us))
                print(f"round {r} {shape} {label}: {us:.0f} µs/block")
    for shape in SHAPES:
        line = f"best {shape}: after {best['after', shape]:.0f} µs/block"
        if args.before:
            ratio = best["after", shape] / best["before", shape]
            line += f", before {best['before', shape]:.0f}, after ÷ before {ratio:.2f}"
        print(line)


if __name__ == "__main__":
    main()
