"""Does the engine cost more per token inside the pipeline than raw? Thread CPU of the same calls, one core.

Run: python benchmarks/bench_engine_context.py [--tokenizer deepseek-v4] [--rounds 2]
         [--plans samples,tokens,exact] [--root DIR] [--tokens-per-copy 4000000] [--read-chunk 1024]

Same corpus and plans as ``bench_stages.py``. Two measurements, each a fresh process pinned to one core
(``RAYON_NUM_THREADS=1``), alternated round by round so both see the same machine load:

* ``pipeline``: the plan iterated end to end (``to_training`` on every batch); every engine call the executor
  makes (``encode_timed``, after the first batch) is timed with the CPU clock of the thread that encodes (a
  confined engine's owner thread: ``Engine.encode_cpu``) — and so is the same call on
  a *shadow* engine (a second object of the same engine, built from the same tokenizer.json, that has been handed
  every call the real one had), made right after the real call on odd calls and right before it on even calls.
  Both see the other stages' effect on the CPU caches and the same moment's load; the shadow's texts are the
  same objects.
* ``raw``: the texts of those same calls (saved by the pipeline process), encoded in the same batches and order
  by a fresh engine alone in its process, after its first call, as ``bench_executor.py``'s raw runs do — no
  reading, packing or batching between calls.

An engine with a cache of its own makes "the same texts" matter: fastokens keeps the pieces it has encoded, so
re-encoding texts it has seen costs about half (measured: 10 against 19-31 ns a token, DeepSeek V4); every
figure here is a first pass over the texts, as a training run is.

Prints per plan and round: engine CPU ns per engine token for the pipeline's calls, their shadow, and the raw
process; the ratios pipeline ÷ shadow and pipeline ÷ raw; and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _pin() -> None:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])


def worker_pipeline(plan: str, tokenizer: str, calls_file: str, read_chunk: str) -> dict:
    _pin()
    from zephon.executor.encode import text

    real_encode_timed = text.encode_timed
    spent = {"real": 0.0, "shadow": 0.0, "tokens": 0, "calls": 0}
    shadows: dict[int, object] = {}
    saved: list[list[str]] = []
    timing = [False]

    def timed(engine, texts, threads, pool):  # type: ignore[no-untyped-def]
        shadow = shadows.get(id(engine))
        if shadow is None:
            rebuild, args = engine.__reduce__()  # a confined engine's wrapper too
            shadow = shadows[id(engine)] = rebuild(*args)
        first = not (spent["calls"] % 2)
        if first:  # the CPU of the thread that encodes (a confined engine's owner thread: Engine.encode_cpu)
            got, real = real_encode_timed(engine, texts, threads, pool)
        shade = shadow.encode_cpu(texts)[1]
        if not first:
            got, real = real_encode_timed(engine, texts, threads, pool)
        if timing[0]:
            spent["real"] += real
            spent["shadow"] += shade
            spent["tokens"] += len(got.ids)
            spent["calls"] += 1
        saved.append(list(texts))
        return got, real

    text.encode_timed = timed
    from zephon import Pipeline

    pipe = Pipeline.from_plan(plan).options(read_chunk=int(read_chunk)).tokenize(tokenizer_id=tokenizer)
    pipe = pipe.pack_flat(max_length=2049).batch(microbatch_size=8)
    batches = iter(pipe)
    next(batches).to_training(return_labels=True)
    timing[0], warm = True, len(saved)
    for batch in batches:
        batch.to_training(return_labels=True)
    with open(calls_file, "wb") as f:
        pickle.dump({"warm": warm, "calls": saved, "engine": pipe.stats().tokenizer_engine}, f)
    n = spent["tokens"]
    return {
        "engine": pipe.stats().tokenizer_engine,
        "calls": spent["calls"],
        "tokens": n,
        "pipeline": spent["real"] / n * 1e9,
        "shadow": spent["shadow"] / n * 1e9,
    }


def worker_raw(tokenizer: str, calls_file: str) -> dict:
    _pin()
    from tokenizers import Tokenizer

    from zephon.executor.engines import EngineChoice

    with open(calls_file, "rb") as f:
        got = pickle.load(f)
    reference = Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    engine = EngineChoice(reference, reference.to_str(), setting=got["engine"]).engine
    calls = got["calls"]
    for texts in calls[: got["warm"]]:  # what the pipeline's first batch encoded, untimed as there
        engine.encode(texts)
    seconds, tokens = 0.0, 0
    for texts in calls[got["warm"] :]:
        ids, cpu = engine.encode_cpu(texts)
        seconds += cpu
        tokens += len(ids.ids)
    return {"engine": engine.name, "calls": len(calls) - got["warm"], "tokens": tokens, "raw": seconds / tokens * 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="deepseek-v4", choices=("deepseek-v4", "cl100k-converter"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--plans", default="samples,tokens,exact")
    parser.add_argument("--root", default=None)
    parser.add_argument("--tokens-per-copy", type=int, default=4_000_000)
    parser.add_argument("--read-chunk", type=int, default=1024, help="documents read and encoded together")
    parser.add_argument("--worker", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        print(json.dumps(worker_pipeline(*rest) if kind == "pipeline" else worker_raw(*rest)))
        return
    sys.path.insert(0, str(HERE))
    import bench_executor

    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="zephon-bench-engine-context-"))
    os.environ["ZEPHON_CACHE_DIR"] = str(root / "cache")
    setup = argparse.Namespace(
        tokenizer=args.tokenizer, text="local", copies=1, big=1, tokens_per_copy=args.tokens_per_copy
    )
    tokenizer, _, plans = bench_executor._setup(setup, root)
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "ZEPHON_TOKENIZER_ENGINE": "auto"}
    print(f"{args.tokenizer}, 1 core, load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for r in range(args.rounds):
        for mode in args.plans.split(","):
            calls_file = str(root / f"calls-{args.tokenizer}-{mode}-{args.read_chunk}.pickle")
            row: dict[str, float] = {}
            for kind in ("pipeline", "raw") if r % 2 == 0 else ("raw", "pipeline"):
                if kind == "raw" and not os.path.exists(calls_file):
                    continue
                extra = [str(plans[(mode, 1)])] if kind == "pipeline" else []
                tail = [str(args.read_chunk)] if kind == "pipeline" else []
                argv = [sys.executable, __file__, "--worker", kind, *extra, str(tokenizer), calls_file, *tail]
                out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
                row.update(json.loads(out.stdout.strip().splitlines()[-1]))
            line = f"round {r} {mode:8} {row['engine']}: pipeline {row['pipeline']:.1f}, shadow {row['shadow']:.1f}"
            if "raw" in row:
                line += f", raw {row['raw']:.1f} CPU ns/token; pipeline ÷ shadow {row['pipeline'] / row['shadow']:.2f}"
                line += f", pipeline ÷ raw {row['pipeline'] / row['raw']:.2f}"
            print(line + f" ({row['calls']} calls, {row['tokens']} tokens)", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
