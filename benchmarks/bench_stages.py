"""Where a rank's CPU goes, stage by stage: thread CPU ns per token of each hot-path stage, after the first batch.

Run: python benchmarks/bench_stages.py [--tokenizer deepseek-v4] [--before PYTHON] [--rounds 3]
         [--plans samples,tokens,exact] [--root DIR] [--tokens-per-copy 4000000]

Same corpus and plans as ``bench_hotpath.py`` (``bench_executor.py --text local``, one copy). Each run is a fresh
process pinned to one core (``RAYON_NUM_THREADS=1``: one core has no read-ahead thread, so every stage runs on
the calling thread and ``time.thread_time`` sees it all) that iterates the plan with ``to_training(labels)`` on
every batch; the stages' functions are wrapped with thread-CPU timers after the first batch: reading texts
(``ShardReader.texts``; of which ``values``: Arrow take + Python strings, and ``rg decode``: Parquet row
groups), encoding (``encode_in_slices``; of which ``engine``, ``spot check`` and ``frame``: BOS/EOS), dealing
to lanes, cutting rows (``_cut``), ``to_training``, and the exact plan's fetch. Timers nest (a stage includes
those it calls). With ``--before`` the rounds alternate between this checkout's Python and that one, so both
see the same machine load; prints every run and the best of the rounds per stage.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAGES = (
    ("zephon.executor.read.shard_reader", "ShardReader.texts", "read texts"),
    ("zephon.executor.read.parquet", "ParquetShard.values", "  values"),
    ("zephon.executor.read.parquet", "ParquetShard.row_group", "  rg decode"),
    ("zephon.executor.estimated", "encode_in_slices", "encode"),
    ("zephon.executor.exact", "encode_in_slices", "encode"),
    ("zephon.executor.engines.vendors", "FastokensEngine.encode", "  engine"),
    ("zephon.executor.engines.spot_check", "SpotCheck.check", "  spot check"),
    ("zephon.executor.encode.text", "_frame", "  frame"),
    ("zephon.executor.estimated", "DealLanes._deal", "deal"),
    ("zephon.executor.pack.lanes", "_cut", "cut"),
    ("zephon.executor.exact", "ExactSequences._fetch", "exact fetch"),
    ("zephon.executor.batch", "Batch.to_training", "to_training"),
)


def worker(plan: str, tokenizer: str) -> dict:
    import importlib

    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
    spent: collections.Counter[str] = collections.Counter()
    timing = [False]

    def wrap(owner: object, name: str, label: str) -> None:
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*a: object, **k: object) -> object:
            if not timing[0]:
                return f(*a, **k)
            start = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                spent[label] += time.thread_time() - start

        setattr(owner, name, timed)

    for module, path, label in STAGES:
        owner = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part, None)
        if owner is not None and hasattr(owner, name):
            wrap(owner, name, label)
    from zephon import Pipeline

    pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer).pack_flat(max_length=2049).batch(microbatch_size=8)
    batches = iter(pipe)
    next(batches).to_training(return_labels=True)
    timing[0], tokens, start = True, 0, time.thread_time()
    for batch in batches:
        batch.to_training(return_labels=True)
        tokens += int(batch.lengths.sum())
    total = time.thread_time() - start
    return {"tokens": tokens, "total": total / tokens * 1e9, **{k: v / tokens * 1e9 for k, v in spent.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="deepseek-v4", choices=("deepseek-v4", "cl100k-converter"))
    parser.add_argument("--before", default=None, help="python of a venv running another checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plans", default="samples,tokens,exact")
    parser.add_argument("--root", default=None)
    parser.add_argument("--tokens-per-copy", type=int, default=4_000_000)
    parser.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    sys.path.insert(0, str(HERE))
    import bench_executor

    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="zephon-bench-stages-"))
    os.environ["ZEPHON_CACHE_DIR"] = str(root / "cache")
    setup = argparse.Namespace(
        tokenizer=args.tokenizer, text="local", copies=1, big=1, tokens_per_copy=args.tokens_per_copy
    )
    tokenizer, _, plans = bench_executor._setup(setup, root)
    pythons = {"after": sys.executable, **({"before": args.before} if args.before else {})}
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "ZEPHON_TOKENIZER_ENGINE": "auto"}
    print(f"{args.tokenizer}, 1 core, load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for mode in args.plans.split(","):
            for label, python in pythons.items():
                argv = [python, __file__, "--worker", str(plans[(mode, 1)]), str(tokenizer)]
                out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                runs.setdefault((mode, label), []).append(got)
                parts = ", ".join(f"{k.strip()} {v:.1f}" for k, v in got.items() if k != "tokens")
                print(f"round {r} {mode:8} {label:6}: {parts} CPU ns/token", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n\nbest of the rounds:")
    for (mode, label), rs in runs.items():
        keys = [k for k in rs[0] if k != "tokens"]
        best = {k: min(r.get(k, 0.0) for r in rs) for k in keys}
        print(f"{mode:8} {label:6}: " + ", ".join(f"{k.strip()} {v:.1f}" for k, v in best.items()))


if __name__ == "__main__":
    main()
