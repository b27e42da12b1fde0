"""The executor's hot path against the raw engine it uses, and against another checkout, interleaved in one run.

Run: python benchmarks/bench_hotpath.py --tokenizer deepseek-v4|cl100k-converter [--before PYTHON]
         [--cores 2] [--rounds 3] [--plans samples,tokens,exact] [--root DIR] [--tokens-per-copy N] [--producer]
         [--threads] [--documents-per-copy N]

Same corpus, plans and workers as ``bench_executor.py`` (``--text local``: real text from this machine's files,
``local_corpus.py``; vendor tokenizers from ``vendor_tokenizers.py``): per round and plan, three fresh processes
pinned to ``--cores`` cores — the raw engine the executor chooses (its ``stats().tokenizer_engine``, on the plan's
documents read into memory first, 1,024 a call, sliced over the cores; fastokens' own helper threads sized by the
executor's rule, ``size_fastokens``: none where the slices fill the cores), Zephon end to end with this checkout's
Python, and with ``--before`` (the Python of a venv whose ``zephon`` is another checkout: the A/B of a change).
Each process is timed after its first batch (the raw engine: all of it). Prints every round's Mtok/s and, per plan,
the best of the rounds and the ratios Zephon ÷ raw engine and after ÷ before (and each run's CPU ns per token,
threads included, which a shared machine's load stretches less), with the load average before and after (the
machine may be shared: the ratios within a round are what to read).

``--threads`` prints each Zephon run's CPU seconds by thread after its first batch (the caller ``MainThread``,
``zephon-read-ahead``, the ``zephon-encode`` pool, an engine's own helpers by their kernel names, e.g.
``fastokens``), read from ``/proc/self/task`` at most every 0.1 s and at the end: a thread that ended between two
readings (the producer's, which finish before the caller's last batches) counts up to its last one. On a machine
whose speed swings run to run, which thread a change relieved is steadier than the run's wall time.
Then the same by role, in CPU ns a token — caller, reader (read-ahead and decode threads), engine (the encode
pool and the engine's helpers) — each with its system (kernel) part: page faults of fresh buffers, ``madvise``,
futexes — beside the raw engine's, and the ceiling they set: raw CPU ÷ their sum, the
end-to-end ÷ raw of a run that kept the cores as busy as the raw engine does. E.g. caller 6.6, reader 4.1,
engine 18.4 against raw 18.0 → ceiling 0.62: the engine costs what it costs raw, and 0.8 would leave the caller
and the reader 4.5 ns a token together (docs/performance-log.md, eighteenth session).

``--producer`` adds a fourth process per round and estimated plan: the pipeline's producer alone — stages 1-3
of ``zephon.executor.estimated`` (plan rows, texts, tokenizing on the read-ahead thread and the encode pool) with
the consumer replaced by a loop that only waits on each chunk's encoding — timed like the others. Its ratio to
the raw engine is what a free packer would leave: the ceiling of the end-to-end ratio with this reader.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def run(python: str, kind: str, cores: int, **kw: object) -> dict:
    argv = [python, str(HERE / "bench_executor.py"), "--worker", kind, "--cores", str(cores)]
    for key, value in kw.items():
        argv += [f"--{key}", str(value)]
    env = {**os.environ, "RAYON_NUM_THREADS": str(cores), "ZEPHON_TOKENIZER_ENGINE": "auto"}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{kind} ({python}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def producer(plan: str, tokenizer: str, cores: int) -> dict:
    """The producer alone (module docstring), in this process: ``LaneBatches.__iter__`` replaced for the run."""
    import time

    from zephon import Pipeline
    from zephon.executor import estimated

    got: dict = {}

    def drain(self: estimated.LaneBatches) -> Iterator[estimated.LaneMicrobatch]:  # stands in for __iter__
        tokens, first = 0, None
        while (chunk := self.lanes.source.next()) is not None:
            if chunk.encoded is not None:
                tokens += int(chunk.encoded.result().sizes.sum())  # EOS included, as the executor counts
            if first is None:  # timed after the first chunk, as the others after their first batch
                first, first_tokens, first_cpu = time.perf_counter(), tokens, time.process_time()
        assert first is not None
        got.update(
            seconds=time.perf_counter() - first, cpu=time.process_time() - first_cpu, tokens=tokens - first_tokens
        )
        return
        yield

    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
    estimated.LaneBatches.__iter__ = drain  # type: ignore[method-assign]
    pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer).pack_flat(max_length=2049).batch(microbatch_size=8)
    for _ in pipe:
        pass
    return got


#: Threads that read (the rest, but the caller, tokenize: the encode pools and an engine's own helpers).
READER_THREADS = ("zephon-read-ahead", "zephon-decode", "zephon-range")


def budget(res: dict, raw: dict) -> str:
    """A run's CPU ns a token by role — the caller (``MainThread``: packing, batching, ``to_training``), the reader
    (``READER_THREADS``) and the engine (every other thread) — beside the raw engine's, and the ceiling they set on
    a machine whose cores they fill: raw CPU ÷ (caller + reader + engine), the end-to-end ÷ raw a run would reach
    if it kept the cores as busy as the raw engine does (module docstring, ``--threads``)."""
    per = {"caller": 0.0, "reader": 0.0, "engine": 0.0}
    kernel = dict.fromkeys(per, 0.0)
    for name, seconds in res["threads_cpu"].items():
        role = "caller" if name == "MainThread" else "reader" if name in READER_THREADS else "engine"
        per[role] += seconds * 1e9 / res["tokens"]
        kernel[role] += res.get("threads_system", {}).get(name, 0.0) * 1e9 / res["tokens"]
    raw_ns = raw["cpu"] * 1e9 / raw["tokens"] if raw.get("cpu") else float("nan")
    raw_kernel = raw.get("system", float("nan")) * 1e9 / raw["tokens"]
    text = ", ".join(f"{k} {v:.1f} (system {kernel[k]:.1f})" for k, v in per.items())
    return (
        f"CPU ns a token: {text} (raw engine {raw_ns:.1f}, system {raw_kernel:.1f}); CPU-bound ceiling ÷ raw "
        f"{raw_ns / sum(per.values()):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="deepseek-v4", choices=("deepseek-v4", "cl100k-converter"))
    parser.add_argument("--before", default=None, help="python of a venv running another checkout")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plans", default="samples,tokens,exact")
    parser.add_argument("--root", default=None)
    parser.add_argument("--tokens-per-copy", type=int, default=1_000_000)
    parser.add_argument(
        "--documents-per-copy", type=int, default=2400, help="documents of the samples plan (2,400: ~4.3 M tokens)"
    )
    parser.add_argument("--producer", action="store_true", help="also time the producer alone (estimated plans)")
    parser.add_argument(
        "--threads", action="store_true", help="print each Zephon run's CPU seconds by thread after its first batch"
    )
    parser.add_argument("--child-producer", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_producer:
        plan, tokenizer, cores = args.child_producer
        print(json.dumps(producer(plan, tokenizer, int(cores))))
        return
    import bench_executor

    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="zephon-bench-hotpath-"))
    tokenizer, plans = bench_executor.local_setup(
        args.tokenizer, root, tokens_per_copy=args.tokens_per_copy, documents_per_copy=args.documents_per_copy
    )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.tokenizer}, {args.cores} cores, load average before: {load}")
    pythons = {"after": sys.executable, **({"before": args.before} if args.before else {})}
    rates: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for mode in args.plans.split(","):
            plan = plans[(mode, 1)]
            got: dict[str, dict] = {}
            order = list(pythons.items())[:: -1 if r % 2 else 1]  # alternated: the first run of a pair runs slower
            for label, python in order:  # the Zephon runs first: they say which engine is in use
                extra = {"threads": 0.1} if args.threads else {}
                got[label] = run(python, "zephon", args.cores, tokenizer=tokenizer, plan=plan, **extra)
            got = {label: got[label] for label in pythons}  # printed in a fixed order
            engine = got["after"]["engine"]
            got["raw"] = run(sys.executable, "raw", args.cores, tokenizer=tokenizer, plan=plan, engine=engine)
            if args.producer and mode != "exact":
                argv = [sys.executable, __file__, "--child-producer", str(plan), str(tokenizer), str(args.cores)]
                env = {**os.environ, "RAYON_NUM_THREADS": str(args.cores), "ZEPHON_TOKENIZER_ENGINE": "auto"}
                out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
                got["producer"] = json.loads(out.stdout.strip().splitlines()[-1])
            line = []
            for label, res in got.items():
                rate = res["tokens"] / res["seconds"] / 1e6
                rates.setdefault((mode, label), []).append(rate)
                cpu = f" ({res['cpu'] / res['tokens'] * 1e9:.0f} CPU ns/tok)" if res.get("cpu") else ""
                line.append(f"{label} {rate:.2f}{cpu}")
            print(f"round {r} {mode:8} engine {engine}: " + ", ".join(line) + " Mtok/s", flush=True)
            for label, res in got.items():
                if "threads_cpu" in res:
                    ranked = sorted(res["threads_cpu"].items(), key=lambda kv: -kv[1])
                    print(f"    {label} CPU s by thread: " + ", ".join(f"{k} {v:.2f}" for k, v in ranked))
                    print(f"    {label} {budget(res, got['raw'])}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\nbest of the rounds (Mtok/s after the first batch) and ratios:")
    for mode in args.plans.split(","):
        best = {label: max(rates[(mode, label)]) for label in ("raw", *pythons)}
        text = ", ".join(f"{k} {v:.2f}" for k, v in best.items())
        ratio = f"after ÷ raw {best['after'] / best['raw']:.2f}"
        if (mode, "producer") in rates:
            ceiling = [p / w for p, w in zip(rates[(mode, "producer")], rates[(mode, "raw")], strict=True)]
            ratio += f", producer ÷ raw per round {' '.join(f'{x:.2f}' for x in ceiling)}"
        if "before" in best:
            ratio += f", before ÷ raw {best['before'] / best['raw']:.2f}"
            ratio += f", after ÷ before {best['after'] / best['before']:.2f}"
        per_round = [a / w for a, w in zip(rates[(mode, "after")], rates[(mode, "raw")], strict=True)]
        print(f"{mode:8} {text}; {ratio}; after ÷ raw per round {' '.join(f'{x:.2f}' for x in per_round)}")


if __name__ == "__main__":
    main()
