"""The consumer's share of the hot path alone — lanes, rows, ``to_training`` — with no reading or tokenizing.

Run: python benchmarks/bench_pack.py [--before PYTHON] [--rounds 7] [--lanes 8] [--width 2049] [--tokens 8000000]

Synthetic documents (seeded: lengths 20-4,000 tokens, ids < 128,000) in the dtype the checkout's encoder gives
(int32 where ``zephon.executor.encode.flags.ID`` exists, else int64) are dealt to ``--lanes`` lanes a chunk of
1,024 documents at a time (``Lane.push_many``: one copy per lane and chunk, as ``DealLanes``) and cut into
microbatches of one row per lane (``pop_rows``), each turned into ``to_training(return_labels=True)``. Each
round is a fresh process pinned to one core; with ``--before`` the rounds alternate between this checkout's
Python and that one (another checkout's venv), so both see the same machine load; times are the thread's CPU
time (``time.thread_time``), so a shared machine's load stretches them little. Prints CPU ns per token for
dealing, cutting and ``to_training``, the best round of each, and after ÷ before.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def worker(args: argparse.Namespace) -> dict:
    import numpy as np

    from zephon.executor.batch import Batch
    from zephon.executor.pack.lanes import Lane, pop_rows

    try:
        from zephon.executor.encode.flags import ID as dtype
    except ImportError:  # a checkout whose ids are int64
        dtype = np.dtype(np.int64)
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
    rng = np.random.default_rng(0)
    sizes = rng.integers(20, 4000, size=args.tokens // 1000 + 2048)  # twice what the run takes: never short
    ids = rng.integers(0, 128_000, size=int(sizes.sum()), dtype=np.int64).astype(dtype)
    try:  # one token array shared by the lanes, as ``RankRunner`` makes them (issue #29 item 3)
        from zephon.executor.pack.lanes import LaneStore

        store = LaneStore(dtype)
        lanes = [Lane(args.width, 0, dtype=dtype, store=store) for _ in range(args.lanes)]
    except ImportError:  # a checkout whose lanes each own their array
        lanes = [Lane(args.width, 0) for _ in range(args.lanes)]
    deal = cut = train = 0.0
    done = at = position = 0
    while done < args.tokens:
        t0 = time.thread_time()
        chunk = sizes[position : position + 1024]
        lane_of = np.arange(position, position + len(chunk)) % args.lanes
        order = np.argsort(lane_of, kind="stable")
        ends = np.cumsum(chunk)
        for k in range(args.lanes):
            mine = order[lane_of[order] == k]
            docs = [ids[at + ends[i] - chunk[i] : at + ends[i]] for i in mine.tolist()]
            lanes[k].push_many(position + mine, np.concatenate(docs), chunk[mine])
        at += int(ends[-1])
        position += len(chunk)
        t1 = time.thread_time()
        deal += t1 - t0
        while all(lane.ready() for lane in lanes) and done < args.tokens:
            t1 = time.thread_time()
            rows = pop_rows(lanes)
            t2 = time.thread_time()
            Batch(tokens=rows.tokens, doc_start=rows.doc_start, lengths=rows.lengths).to_training(return_labels=True)
            t3 = time.thread_time()
            cut, train = cut + t2 - t1, train + t3 - t2
            done += rows.tokens.size
    ns = 1e9 / done
    return {"deal": deal * ns, "cut": cut * ns, "to_training": train * ns, "dtype": str(dtype)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--width", type=int, default=2049)
    parser.add_argument("--tokens", type=int, default=8_000_000)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    pythons = {"after": sys.executable, **({"before": args.before} if args.before else {})}
    argv = [str(Path(__file__).resolve()), "--worker", "--lanes", str(args.lanes), "--width", str(args.width)]
    argv += ["--tokens", str(args.tokens)]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    runs: dict[str, list[dict]] = {k: [] for k in pythons}
    for r in range(args.rounds):
        for label, python in pythons.items():
            out = subprocess.run([python, *argv], capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            runs[label].append(got)
            parts = ", ".join(f"{k} {got[k]:.2f}" for k in ("deal", "cut", "to_training"))
            print(f"round {r} {label} ({got['dtype']}): {parts} ns/token", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    best = {label: {k: min(r[k] for r in rs) for k in ("deal", "cut", "to_training")} for label, rs in runs.items()}
    for label, b in best.items():
        total = sum(b.values())
        print(f"best {label}: " + ", ".join(f"{k} {v:.2f}" for k, v in b.items()) + f", sum {total:.2f} ns/token")
    if "before" in best:
        print("after ÷ before: " + ", ".join(f"{k} {best['after'][k] / best['before'][k]:.2f}" for k in best["after"]))


if __name__ == "__main__":
    main()
