"""Executor throughput against the raw tokenizer, on the same cores and texts; first batch; peak RSS.

Run: python benchmarks/bench_executor.py [--copies 8] [--big 16] [--repeats 3] [--reference /tmp/refvenv/bin/python]
         [--peers /tmp/peervenv/bin/python]

Corpus: ``--copies`` seeds of the demo corpus (prose / code / short documents, ~4 MB of text per seed), or
with ``--text local`` real text from this machine's files (``local_corpus.py``; size N is its shards N times
over, budgets scale with N as with seeds), mixed 0.5/0.3/0.2; tokenizer: OpenAI's cl100k_base converted to a
``tokenizers`` tokenizer.json
(``benchmarks/cl100k.py``, ids checked against tiktoken first); max_length 2049, microbatch 8. Plans: by
samples (``num_documents`` = 2400 × copies, or ``--documents-per-copy`` × copies), by tokens
(``TokenEstimation``, ``num_tokens`` = 10^6 × copies, or ``--tokens-per-copy`` × copies) and an exact token plan
(count pass, exact wrap offsets).

Every measurement is a fresh subprocess pinned to the cores it may use (``sched_setaffinity`` and
``RAYON_NUM_THREADS``): 1 core, then all cores. For each plan the subprocess reads the plan's documents, in
plan order, into memory before timing the raw encoders on them (1024 documents per call, as the executor):

* raw ``tokenizers``: ``Tokenizer.encode_batch_fast`` (its Rust threads); also worker processes (one
  single-threaded tokenizer per core, texts and ids pickled) — the executor keeps whichever is faster;
* raw tiktoken: the same encoding built from the tokenizer.json, one slice of texts per thread, one tiktoken
  call per text (``encode_to_tiktoken_buffer``), each slice's ids joined into one array;
* Zephon end to end: ``Pipeline.from_plan(...).tokenize().pack_flat().batch()`` and ``to_training(labels)``
  on every batch: plan → read Parquet → tokenize → pack → batch → tensors, with the automatic engine and with
  ``ZEPHON_TOKENIZER_ENGINE=tokenizers``; on all cores also with ``ZEPHON_READ_AHEAD=off`` (no read-ahead
  thread).

Figures are the best of ``--repeats`` (runs interleaved, so all see the same machine load); tokens count
each document's tokens plus its EOS. Peak RSS is ``VmHWM`` of the Zephon process at ``--copies`` and at
``--big`` copies (``--rss-only``: only those runs), with the engine the run chose. First batch: a fresh
process, plan already cached (warm local cache), from
``Pipeline(work_source)`` to the first ``to_training`` dict. ``--reference PYTHON`` runs the published
``zephon==0.2.0`` (its documented API, its own venv) on the same shards, tokenizer and token budget;
``--peers PYTHON`` runs Hugging Face ``datasets`` streaming and Google Grain the same way (``peers.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WEIGHTS = {"prose": 0.5, "code": 0.3, "short": 0.2}
MAX_LENGTH, MICROBATCH, CHUNK = 2049, 8, 1024
HERE = Path(__file__).resolve().parent


# -- workers (run in subprocesses) -----------------------------------------------------------------------------


def _pin(cores: int) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, allowed[:cores])


def _usage() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _system() -> float:
    """This process's system (kernel) CPU seconds so far: page faults, madvise, futexes, reads."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def task_cpu(task: Path) -> tuple[float, float]:
    """CPU seconds (user + system, and system alone) of one thread, ``task`` its ``/proc/PID/task/TID``
    directory; OSError once the thread has ended."""
    fields = (task / "stat").read_text().rsplit(")", 1)[1].split()  # after the name, which may hold spaces
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, int(fields[12]) / tick


#: thread id → (name, CPU seconds so far, of which system seconds)
Threads = dict[int, tuple[str, float, float]]


def thread_cpu(seen: Threads) -> None:
    """Update ``seen`` (thread id → name, CPU seconds so far, of which system) from ``/proc/self/task``: Python
    threads named by ``threading`` (``zephon-encode_0`` and ``_1`` both ``zephon-encode``), native ones, an
    engine's helpers, by their kernel name. A thread that has ended keeps its last reading."""
    import threading

    names = {t.native_id: t.name.rstrip("_0123456789") for t in threading.enumerate()}
    for task in Path("/proc/self/task").iterdir():
        try:
            cpu, system = task_cpu(task)
            name = names.get(int(task.name)) or (task / "comm").read_text().strip().rstrip("_0123456789-")
        except OSError:  # the thread ended meanwhile
            continue
        seen[int(task.name)] = (name, cpu, system)


def by_thread(start: Threads, end: Threads, *, system: bool = False) -> dict[str, float]:
    """CPU seconds (``system``: system seconds only) each thread name spent between two ``thread_cpu``
    readings."""
    at = 2 if system else 1
    out: dict[str, float] = {}
    for tid, reading in end.items():
        spent = reading[at] - start.get(tid, (reading[0], 0.0, 0.0))[at]
        if spent > 0:
            out[reading[0]] = round(out.get(reading[0], 0.0) + spent, 3)
    return out


def _plan_texts(plan: str) -> list[str]:
    from zephon.executor.plan_reader import PlanBundle
    from zephon.executor.read.shard_reader import ShardReader

    bundle = PlanBundle(plan)
    reader = ShardReader(bundle.shards, "text", capacity=len(bundle.shards))
    return [t for c in bundle.chunks(CHUNK) for t in reader.texts(c.shard_id, c.row)]


def _encode_processes(batch: list[str]) -> list:
    import numpy as np

    global _TOK
    return [np.array(e.ids, dtype=np.int64) for e in _TOK.encode_batch_fast(batch, add_special_tokens=False)]


def _init_process(tokenizer: str) -> None:
    os.environ["RAYON_NUM_THREADS"] = "1"
    from tokenizers import Tokenizer

    global _TOK
    _TOK = Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))


def worker_raw(args: argparse.Namespace) -> dict:
    """Raw encoder throughput on the plan's documents (already in memory)."""
    texts = _plan_texts(args.plan)
    chunks = [texts[i : i + CHUNK] for i in range(0, len(texts), CHUNK)]
    if args.engine == "tokenizers":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))

        def encode(batch: list[str]) -> int:
            return sum(len(e) for e in tok.encode_batch_fast(batch, add_special_tokens=False))

    elif args.engine == "processes":
        import multiprocessing

        pool = multiprocessing.get_context("spawn").Pool(args.cores, _init_process, (args.tokenizer,))
        pool.map(_encode_processes, [["warm up"]] * args.cores)

        def encode(batch: list[str]) -> int:
            size = -(-len(batch) // args.cores)
            parts = pool.map(_encode_processes, [batch[i : i + size] for i in range(0, len(batch), size)])
            return sum(len(ids) for part in parts for ids in part)

    else:  # another engine, built and verified by the executor's engine layer, sliced over `cores` threads
        from concurrent.futures import ThreadPoolExecutor

        from tokenizers import Tokenizer

        from zephon.errors import TokenizerError
        from zephon.executor.engines import EngineChoice, encode_on
        from zephon.executor.engines.vendors import size_fastokens

        size_fastokens(args.cores, args.cores)  # as the executor sizes its helpers: here `cores` slices at once

        reference = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))
        try:
            choice = EngineChoice(reference, reference.to_str(), eos_text=None, setting=args.engine)
            choice.settle(texts)  # the same check the executor runs on its first batch
        except TokenizerError as exc:
            return {"refused": str(exc).split(": ", 1)[-1].split(" — ")[0]}
        engine = choice.engine
        pool = ThreadPoolExecutor(args.cores) if args.cores > 1 else None

        def encode(batch: list[str]) -> int:
            return len(encode_on(engine, batch, args.cores, pool).ids)

    cpu, system, start = _usage(), _system(), time.perf_counter()
    tokens = sum(encode(c) for c in chunks) + len(texts)  # + one EOS per document, as the executor counts
    seconds, cpu, system = time.perf_counter() - start, _usage() - cpu, _system() - system
    if args.engine == "processes":
        cpu = None  # the workers' CPU time is not this process's
    return {"seconds": seconds, "cpu": cpu, "system": system, "tokens": tokens, "documents": len(texts)}


def worker_zephon(args: argparse.Namespace) -> dict:
    """End to end: plan → read → tokenize → pack → batch → to_training, the whole plan."""
    from peers import peak_rss_mb

    from zephon import Pipeline

    start_cpu, start = _usage(), time.perf_counter()
    pipe = (
        Pipeline.from_plan(args.plan)
        .tokenize(tokenizer_id=args.tokenizer)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=MICROBATCH)
    )
    tokens, batches, first, first_tokens, first_cpu = 0, 0, None, 0, 0.0
    # Threads' CPU (--threads): read after the first batch, then at most every ``every`` seconds (a reading costs
    # ~1 ms of this thread's CPU: every 20 batches was 7 % of a run), and at the end.
    every = float(getattr(args, "threads", None) or 0)
    start_threads: Threads = {}
    seen: Threads = {}
    last_read = 0.0
    for batch in pipe:
        out = batch.to_training(return_labels=True)
        tokens += int(batch.lengths.sum())
        batches += 1
        if first is None:
            first, first_tokens, first_cpu = time.perf_counter(), tokens, _usage()
            if every:
                thread_cpu(start_threads)
                last_read = time.perf_counter()
        elif every and time.perf_counter() - last_read >= every:
            thread_cpu(seen)
            last_read = time.perf_counter()
        assert out["input_ids"].shape == (MICROBATCH, MAX_LENGTH - 1)
    end, end_cpu = time.perf_counter(), _usage()
    assert first is not None
    if every:
        thread_cpu(seen)
    return {  # "seconds"/"cpu"/"tokens": after the first batch (steady state, as the raw runs); "total_*": all
        "seconds": end - first,
        "cpu": end_cpu - first_cpu,
        "tokens": tokens - first_tokens,
        "total_seconds": end - start,
        "total_cpu": end_cpu - start_cpu,
        "total_tokens": tokens,
        "batches": batches,
        "first_batch_s": first - start,
        "engine": pipe.stats().tokenizer_engine,
        "refused_engines": pipe.stats().refused_engines,
        "peak_rss_mb": peak_rss_mb(),
        **(
            {
                "threads_cpu": by_thread(start_threads, seen),
                "threads_system": by_thread(start_threads, seen, system=True),
            }
            if every
            else {}
        ),
    }


#: Token budget of the tokens and exact plans per corpus copy (``--tokens-per-copy``).
TOKENS_PER_COPY = 1_000_000
#: Documents of the samples plan per corpus copy (``--documents-per-copy``).
DOCUMENTS_PER_COPY = 2400


def _work_source(
    corpus: str,
    mode: str,
    copies: int,
    tokens_per_copy: int = TOKENS_PER_COPY,
    documents_per_copy: int = DOCUMENTS_PER_COPY,
):
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

    datasets = [Dataset.from_path(k, str(Path(corpus) / k)) for k in WEIGHTS]
    if mode == "samples":
        return StaticMixtureWorkSource(
            datasets=datasets, mixture=MixtureSpec(WEIGHTS), seed=0, num_documents=documents_per_copy * copies
        )
    return StaticMixtureWorkSource(
        datasets=datasets,
        mixture=MixtureSpec(WEIGHTS),
        seed=0,
        token_estimation=TokenEstimation(),
        num_tokens=tokens_per_copy * copies,
        exact_tokens=mode == "exact",
    )


def worker_first(args: argparse.Namespace) -> dict:
    """A fresh process, plan cached: ``Pipeline(work_source)`` → first training dict."""
    start = time.perf_counter()
    from zephon import Pipeline

    imported = time.perf_counter()
    pipe = (
        Pipeline(_work_source(args.corpus, "samples", args.copies))
        .tokenize(tokenizer_id=args.tokenizer)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=MICROBATCH)
    )
    next(iter(pipe)).to_training(return_labels=True)
    end = time.perf_counter()
    return {"first_batch_s": end - imported, "imports_s": imported - start}


def worker_cold(args: argparse.Namespace) -> dict:
    """Cold start of the documented API's token-mixture example: an empty cache (no plan, byte lengths, calibration or
    engine verdicts), three datasets, ``TokenEstimation(primer="measure", calibration_samples=2048)``:
    ``Pipeline(work_source)`` → first training dict."""
    start = time.perf_counter()
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

    imported = time.perf_counter()
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path(k, str(Path(args.corpus) / k)) for k in WEIGHTS],
        mixture=MixtureSpec(WEIGHTS),
        seed=42,
        token_estimation=TokenEstimation(primer="measure", calibration_samples=2048),
    )
    pipe = (
        Pipeline(source)
        .tokenize(tokenizer_id=args.tokenizer)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=MICROBATCH)
    )
    next(iter(pipe)).to_training(return_labels=True)
    end = time.perf_counter()
    return {"first_batch_s": end - imported, "imports_s": imported - start, "engine": pipe.stats().tokenizer_engine}


def worker_count(args: argparse.Namespace) -> dict:
    """The count pass over every shard of the plan into an empty cache, ``workers`` = cores, from the tokenizer's
    load to the last array saved."""
    from zephon.executor.encode.text import Encoder
    from zephon.executor.plan_reader import PlanBundle
    from zephon.planner.counts.lengths import token_counts
    from zephon.specs import TokenizeSpec

    shards = list(PlanBundle(args.plan).shards)
    start = time.perf_counter()
    spec = TokenizeSpec(tokenizer_id=args.tokenizer)
    encoder = Encoder(spec)
    _, report = token_counts(shards, spec, encoder, workers=args.cores, progress=False)
    return {"seconds": time.perf_counter() - start, "tokens": report.tokens, "engine": encoder.engine}


# -- orchestration ---------------------------------------------------------------------------------------------


def _run(kind: str, cores: int, env: dict[str, str] | None = None, **kw: object) -> dict:
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--cores", str(cores)]
    for key, value in kw.items():
        argv += [f"--{key}", str(value)]
    full_env = {**os.environ, "RAYON_NUM_THREADS": str(cores), **(env or {})}
    out = subprocess.run(argv, env=full_env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{kind} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _corpus(root: Path, copies: int) -> Path:
    """``root/corpus-N/{kind}/``: hard links to the shards of demo seeds 0..N-1."""
    sys.path.insert(0, str(HERE.parent / "scripts"))  # demo_grammar: demo corpora of any seed
    from demo_grammar import write_demo_dataset

    out = root / f"corpus-{copies}"
    for seed in range(copies):
        demo = Path(write_demo_dataset(root / "seeds" / f"seed{seed}", seed=seed))
        for kind in WEIGHTS:
            (out / kind).mkdir(parents=True, exist_ok=True)
            for shard in sorted(demo.glob(f"{kind}-*.parquet")):
                link = out / kind / f"s{seed:03d}-{shard.name}"
                if not link.exists():
                    os.link(shard, link)
    return out


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["seconds"])


def _rate(run: dict) -> float:
    return run["tokens"] / run["seconds"]


PLANS = ("samples", "tokens", "exact")
TOKENIZERS = ("cl100k", "deepseek-v4", "cl100k-converter")


def _installed_engines() -> list[str]:
    import importlib.util

    from zephon.executor.engines import CANDIDATES

    return [e for e in CANDIDATES if e != "tokenizers" and importlib.util.find_spec(e) is not None]


#: Raw engines timed beside raw ``tokenizers`` (those installed; refused ones are reported, not timed).
RAW_ENGINES = _installed_engines()


def local_setup(tokenizer: str, root: Path, *, tokens_per_copy: int, documents_per_copy: int) -> tuple[Path, dict]:
    """One copy of the local corpus and its plans under ``root`` (reused when there), the shard cache under it too:
    the tokenizer's directory and the plans by ``(mode, 1)`` (``bench_hotpath.py``, ``bench_run_length.py``)."""
    os.environ["ZEPHON_CACHE_DIR"] = str(root / "cache")
    setup = argparse.Namespace(
        tokenizer=tokenizer,
        text="local",
        copies=1,
        big=1,
        tokens_per_copy=tokens_per_copy,
        documents_per_copy=documents_per_copy,
    )
    directory, _, plans = _setup(setup, root)
    return directory, plans


def _setup(args: argparse.Namespace, root: Path) -> tuple[Path, dict[int, Path], dict[tuple[str, int], Path]]:
    """The tokenizer (checked against tiktoken), the corpora and their plans."""
    sys.path.insert(0, str(HERE))
    import cl100k
    import pyarrow.parquet as pq

    from zephon.specs import PackSpec, TokenizeSpec

    if args.tokenizer == "cl100k":
        tokenizer = cl100k.build(root / "cl100k")
    else:  # a real vendor tokenizer.json (vendor_tokenizers.py)
        import vendor_tokenizers

        tokenizer = vendor_tokenizers.build(args.tokenizer, root / "tokenizers")
    if args.text == "local":  # real text from this machine's files; size N: its shards N times over
        import local_corpus

        base = local_corpus.build(root / "corpus-local")
        sizes = sorted({args.copies, args.big})
        corpora = {n: local_corpus.repeated(base, root / f"corpus-local-x{n}", n) for n in sizes}
    else:
        corpora = {n: _corpus(root, n) for n in sorted({args.copies, args.big})}
    sample = [
        t
        for kind in WEIGHTS
        for shard in sorted((corpora[args.copies] / kind).glob("*.parquet"))[:2]
        for t in pq.read_table(shard, columns=["text"]).column(0).to_pylist()
    ]
    if args.tokenizer == "cl100k":
        bad = cl100k.verify(tokenizer, sample)
        print(f"cl100k tokenizer.json vs tiktoken: {len(sample) + 1} texts, {len(bad)} differ")
    plans = {}
    for n, path in corpora.items():
        for mode in PLANS:
            name = f"{mode}-{n}" if args.text == "demo" else f"{mode}-local-{n}"
            if mode != "samples" and args.tokens_per_copy != TOKENS_PER_COPY:
                name += f"-t{args.tokens_per_copy}"
            documents = getattr(args, "documents_per_copy", DOCUMENTS_PER_COPY)
            if mode == "samples" and documents != DOCUMENTS_PER_COPY:
                name += f"-d{documents}"
            out = root / "plans" / args.tokenizer / name
            if not (out / "plan.json").is_file():
                _work_source(str(path), mode, n, args.tokens_per_copy, documents).plan(
                    out, tokenize=TokenizeSpec(tokenizer_id=str(tokenizer)), pack=PackSpec(max_length=MAX_LENGTH)
                )
            plans[(mode, n)] = out
    return tokenizer, corpora, plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=8, help="demo seeds in the corpus (~4 MB of text each)")
    parser.add_argument("--big", type=int, default=16, help="seeds of the second corpus, for peak RSS")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--tokens-per-copy",
        type=int,
        default=TOKENS_PER_COPY,
        help="token budget of the tokens and exact plans per corpus copy (a larger one reads row groups through)",
    )
    parser.add_argument(
        "--documents-per-copy",
        type=int,
        default=DOCUMENTS_PER_COPY,
        help="documents of the samples plan per corpus copy (a larger one times the samples plan for longer)",
    )
    parser.add_argument(
        "--text", choices=("demo", "local"), default="demo",
        help="demo: generated demo corpus; local: real text from this machine's files (local_corpus.py)",
    )  # fmt: skip
    parser.add_argument(
        "--tokenizer", default="cl100k",
        help="cl100k: our exact conversion (benchmarks/cl100k.py); deepseek-v4, cl100k-converter: real vendor "
        "tokenizer.json files (benchmarks/vendor_tokenizers.py)",
    )  # fmt: skip
    parser.add_argument("--skip-count", action="store_true", help="skip the count pass and cold start runs")
    parser.add_argument("--startup-only", action="store_true", help="only the cold start and count pass runs")
    parser.add_argument("--rss-only", action="store_true", help="only the peak RSS runs (both corpus sizes)")
    parser.add_argument("--root", default=None, help="work directory (default: a new temporary one)")
    parser.add_argument("--reference", default=None, help="python of a venv with zephon==0.2.0")
    parser.add_argument("--peers", default=None, help="python of a venv with datasets and grain (peers.py)")
    parser.add_argument("--skip-processes", action="store_true", help="skip raw tokenizers in worker processes")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    for name in ("cores", "plan", "engine", "corpus", "threads"):
        parser.add_argument(f"--{name}", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.cores = int(args.cores)
        _pin(args.cores)
        workers = {"raw": worker_raw, "zephon": worker_zephon, "first": worker_first, "cold": worker_cold}
        result = {**workers, "count": worker_count}[args.worker](args)
        print(json.dumps(result))
        return

    if args.tokenizer not in TOKENIZERS:
        parser.error(f"--tokenizer must be one of {', '.join(TOKENIZERS)}, got {args.tokenizer!r}")
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="zephon-bench-executor-"))
    os.environ["ZEPHON_CACHE_DIR"] = str(root / "cache")
    all_cores = len(os.sched_getaffinity(0))
    print(f"machine: {all_cores} usable cores (nproc {os.cpu_count()}), {_cpu_model()}, {platform.python_version()}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other processes share the cores)")
    start = time.perf_counter()
    tokenizer, corpora, plans = _setup(args, root)
    mb = sum(f.stat().st_size for f in corpora[args.copies].rglob("*.parquet")) / 1e6
    what = f"{args.copies} demo seeds" if args.text == "demo" else f"local text ({corpora[args.copies]})"
    print(f"corpus: {what}, {mb:.1f} MB of Parquet (zstd); setup {time.perf_counter() - start:.0f} s")

    fast, slow = {"ZEPHON_TOKENIZER_ENGINE": "auto"}, {"ZEPHON_TOKENIZER_ENGINE": "tokenizers"}
    results: dict[tuple[str, str, int], list[dict]] = {}
    refused: dict[str, str] = {}
    rounds = 0 if args.startup_only or args.rss_only else args.repeats
    for _ in range(rounds):  # interleaved: every run sees the same load
        for cores in (1, all_cores):
            for mode in PLANS:
                plan = plans[(mode, args.copies)]
                jobs = [("raw tokenizers", "raw", {"engine": "tokenizers"}, None)]
                jobs += [(f"raw {e}", "raw", {"engine": e}, None) for e in RAW_ENGINES]
                jobs.append(("zephon", "zephon", {}, fast))
                if cores > 1:  # the default reads ahead on a thread when it may use 2+ cores
                    jobs.append(("zephon, no read-ahead", "zephon", {}, {**fast, "ZEPHON_READ_AHEAD": "off"}))
                if mode == "samples":
                    jobs.append(("zephon, tokenizers engine", "zephon", {}, slow))
                    if cores > 1 and not args.skip_processes:
                        jobs.append(("raw tokenizers, processes", "raw", {"engine": "processes"}, None))
                for label, kind, kw, env in jobs:
                    if label in refused:
                        continue
                    run = _run(kind, cores, env, tokenizer=tokenizer, plan=plan, **kw)
                    if "refused" in run:  # not exact for this tokenizer: never timed
                        refused[label] = run["refused"]
                        continue
                    results.setdefault((mode, label, cores), []).append(run)
    rss = {
        (mode, n): _run("zephon", all_cores, fast, tokenizer=tokenizer, plan=plans[(mode, n)])
        for n in corpora
        for mode in PLANS
        if not args.startup_only
    }
    firsts = [  # the first run plans the work source into the cache; the others start warm
        _run("first", all_cores, fast, tokenizer=tokenizer, corpus=corpora[args.copies], copies=args.copies)
        for _ in range(0 if args.startup_only or args.rss_only else 4)
    ][1:]
    colds, counts = [], {"today": [], "ours": []}
    if not args.skip_count and not args.rss_only:
        for _ in range(args.repeats):  # each into a new, empty cache: plan, byte lengths, calibration, verdicts
            env = {**fast, "ZEPHON_CACHE_DIR": tempfile.mkdtemp(prefix="cold-cache-", dir=root)}
            colds.append(_run("cold", all_cores, env, tokenizer=tokenizer, corpus=corpora[args.copies]))
            for label, engine in (("today", "tokenizers"), ("ours", "auto")):
                cache = tempfile.mkdtemp(prefix=f"count-cache-{label}-", dir=root)
                env = {"ZEPHON_TOKENIZER_ENGINE": engine, "ZEPHON_CACHE_DIR": cache}
                plan = plans[("exact", args.copies)]
                counts[label].append(_run("count", all_cores, env, tokenizer=tokenizer, plan=plan))

    print(f"load average after the runs: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"tokenizer: {args.tokenizer} ({tokenizer}); text: {what}")
    for label, reason in refused.items():
        print(f"{label}: refused, not timed — {reason}")
    if results:
        _report(results, all_cores, args.repeats)
    print("\npeak RSS of the Zephon process (whole plan, all cores):")
    unit = "seeds" if args.text == "demo" else "× the local corpus"
    for mode in PLANS if rss else ():
        parts = [
            f"{r['peak_rss_mb']:.0f} MB at {n} {unit} ({r['total_tokens'] / 1e6:.0f} M tokens, {r['engine']})"
            for n in corpora
            for r in [rss[(mode, n)]]
        ]
        print(f"  {mode:8} " + ", ".join(parts))
    fb = min((f["first_batch_s"] for f in firsts), default=float("nan"))
    from_plan = min((r["first_batch_s"] for r in rss.values()), default=float("nan"))
    print(
        f"\nfirst batch, warm cache (plan and tokenizer engine cached): Pipeline(work_source) → to_training "
        f"{fb:.2f} s (imports {min((f['imports_s'] for f in firsts), default=0):.2f} s before it); from a plan bundle "
        f"{from_plan:.2f} s"
    )
    if colds:
        cold_times = ", ".join(f"{c['first_batch_s']:.2f}" for c in colds)
        print(
            f"\ncold start, empty cache (3 datasets, TokenEstimation(primer='measure', calibration_samples=2048)): "
            f"Pipeline(work_source) → first to_training {cold_times} s "
            f"(imports {min(c['imports_s'] for c in colds):.2f} s before it; engine {colds[0]['engine']})"
        )
        today, ours = (min(counts[k], key=lambda r: r["seconds"]) for k in ("today", "ours"))
        assert today["tokens"] == ours["tokens"], "the count pass must count the same tokens on every engine"
        print(
            f"count pass, {all_cores} workers, empty cache, {ours['tokens'] / 1e6:.1f} M tokens: today "
            f"(tokenizers engine in worker processes) {today['seconds']:.2f} s, "
            f"ours ({ours['engine']}) {ours['seconds']:.2f} s — "
            f"{today['seconds'] / ours['seconds']:.1f}× faster"
        )
    import peers

    shape = {"weights": WEIGHTS, "max_length": MAX_LENGTH, "microbatch": MICROBATCH}
    common = {"corpus": corpora[args.copies], "tokenizer": tokenizer, "results": results, "all_cores": all_cores}
    runs = [
        ("reference zephon==0.2.0", args.reference, ["reference"], ("samples", "tokens")),
        ("other data loaders, mixing by samples", args.peers, ["hf-datasets", "grain"], ("samples",)),
    ]
    for label, python, names, modes in runs:
        if python and results:
            peers.compare(label, python, names, modes, shape=shape, best=_best, rate=_rate, **common)


def _report(results: dict[tuple[str, str, int], list[dict]], all_cores: int, repeats: int) -> None:
    print(f"\nthroughput after the first batch, best of {repeats} (Mtok/s; CPU ns per token in parentheses)")
    print(f"{'plan':8} {'run':28} {'1 core':>14} {f'{all_cores} cores':>14}  notes")
    for mode in PLANS:
        for label in sorted({k[1] for k in results if k[0] == mode}, key=lambda x: (not x.startswith("raw"), x)):
            cells, note = [], ""
            for cores in (1, all_cores):
                runs = results.get((mode, label, cores))
                if not runs:
                    cells.append(f"{'-':>14}")
                    continue
                best = _best(runs)
                cpu = f"{best['cpu'] / best['tokens'] * 1e9:4.0f} ns" if best.get("cpu") else "   -   "
                cells.append(f"{_rate(best) / 1e6:6.2f} ({cpu})")
                if "engine" in best:
                    note = f"engine {best['engine']}"
            print(f"{mode:8} {label:28} {' '.join(cells)}  {note}")
    print("\nratios, Zephon end to end ÷ raw encoder on the same documents and cores (wall-clock throughput):")
    for mode in PLANS:
        for cores in (1, all_cores):
            ours = _rate(_best(results[(mode, "zephon", cores)]))
            hf = _rate(_best(results[(mode, "raw tokenizers", cores)]))
            raws = {k[1]: _rate(_best(v)) for k, v in results.items() if k[0] == mode and k[2] == cores}
            fastest = max((r for r in raws if r.startswith("raw ") and r != "raw tokenizers, processes"), key=raws.get)
            tt = raws[fastest]
            line = f"  {mode:8} {cores} core(s): ÷ raw tokenizers {ours / hf:5.2f}   ÷ {fastest} (fastest exact) "
            line += f"{ours / tt:5.2f}"
            if (mode, "zephon, no read-ahead", cores) in results:
                off = _rate(_best(results[(mode, "zephon, no read-ahead", cores)]))
                line += f"   (no read-ahead ÷ {fastest} {off / tt:5.2f})"
            if mode == "samples":
                same = _rate(_best(results[(mode, "zephon, tokenizers engine", cores)]))
                line += f"   (tokenizers engine ÷ raw tokenizers {same / hf:5.2f})"
            print(line)


if __name__ == "__main__":
    main()
