"""Planner at scale: plan time, peak memory, bytes per document and seek time on synthetic shard tables.

Run: python benchmarks/bench_planner.py [--documents 1e6 1e7 1e8] [--unit samples|tokens|exact] [--json FILE]
     python benchmarks/bench_planner.py --documents 1e10 --shards 100000 --columns --rank-seeks  (10^5 × 10^5)
     python benchmarks/bench_planner.py --documents 1e10 --shards 100000 --unit exact --drop-parts

Each size is planned in a child process (so its peak RSS is its own, read from ``os.wait4``): a synthetic
shard table of ``--shards`` shards over five datasets (web / code / books / papers / chat, weights
0.4 / 0.25 / 0.15 / 0.12 / 0.08) holding about N documents, budget ``num_documents=N``. No data files
exist: the shard table is a tuple of ``ShardRef`` built in memory and handed to
``zephon.planner.prepare.assemble`` (the same normalization ``prepare`` applies after scanning), so the
figure is the planner alone — interleave, shuffle, lanes, the Parquet writing and ``plan.json``. Dataset
sizes differ from their shares (×1.0, ×0.8, ×1.25, ×0.5, ×2.0), so code and papers start further
epochs and chat covers half of its documents. Rows per shard vary ±50 % around N / shards.

``--unit tokens`` plans a token mixture over synthetic per-row token estimates (log-normal, means
800 / 1500 / 5000 / 6000 / 300 tokens); ``--unit exact`` a sample-mixture exact wrap plan over the same
counts (token offsets in the plan).

Reported per size: plan time (``write_bundle``: layout + files; wall clock) and the child's CPU time (user +
system, whole process: it includes building the synthetic table), the CPU seconds of each phase of the plan
(``layout``: the planning thread less ``table``, each chunk made an Arrow table; ``parquet``: the samples encoded
and written on the writer's thread, overlapping the layout), the child's peak RSS, bytes per document
of ``samples.parquet`` (``--columns``: per column), and the time of a seek as the executor does it —
footer statistics, then one row group (all columns) holding a random position, read with pyarrow (median
and max of 200 seeks, warm page cache). A plan of more than 2^27 documents is parts (``samples/part-*.parquet``):
bytes and seeks are over all of them.

``--rank-seeks``: 5 fresh processes each open the bundle as a training rank does (``PlanBundle``: every file's
footer checked) and read one chunk of 4,096 documents at a random position, and 5 more run ``show_step`` of a
random step (global batch 1,024, no text); each reports its wall time and peak RSS (``ru_maxrss``).

``--drop-parts`` (a plan bigger than the disk allows: an exact 10^10 plan is ~60 GB): the child lays out and
writes the samples only (``chunks`` + ``SamplesWriter``, no shards.parquet or plan.json, which take seconds), and
a thread measures each closed part's bytes per column, then deletes it; only the last part is left.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

WEIGHTS = {"web": 0.4, "code": 0.25, "books": 0.15, "papers": 0.12, "chat": 0.08}
#: Dataset size relative to its share of the budget: < 1 starts further epochs, > 1 leaves rows unread.
SIZE_FACTOR = {"web": 1.0, "code": 0.8, "books": 1.25, "papers": 0.5, "chat": 2.0}
MEAN_TOKENS = {"web": 800, "code": 1500, "books": 5000, "papers": 6000, "chat": 300}
SHARDS = 10_000


def _rows_per_shard(total: int, shards: int, rng: np.random.Generator) -> np.ndarray:
    """``shards`` sizes summing to ``total``, each within about ±50 % of the mean."""
    share = rng.uniform(0.5, 1.5, shards)
    sizes = np.floor(total * share / share.sum()).astype(np.int64)
    sizes[: total - int(sizes.sum())] += 1
    return sizes


def synthetic_prepared(
    documents: int,
    *,
    shards: int = SHARDS,
    unit: str = "samples",
    seed: int = 0,
    lanes: int = 8,
    weights: dict[str, float] | None = None,
    lazy: bool = True,
    budget: str = "documents",
):
    """A ``PreparedPlan`` over an in-memory shard table of about ``documents`` rows; budget ``documents``, or
    with ``budget="tokens"`` (token mixtures) ``num_tokens`` = ``documents`` × the weighted mean tokens a document.

    ``unit``: ``"samples"`` (sample mixture, no tokens), ``"tokens"`` (token mixture over synthetic
    estimates) or ``"exact"`` (sample mixture, exact wrap plan over synthetic counts). ``weights`` replaces the
    mixture's weights (the shard table keeps the shapes of ``WEIGHTS``). Token counts are a ``ShardTokens``
    that generates a shard's counts when it is read (``lazy``, what ``prepare`` gives: memory independent of
    the corpus), or every array generated up front.
    """
    from zephon.io import Dataset
    from zephon.plan.records import ShardRef
    from zephon.planner.counts.shard_tokens import ShardTokens
    from zephon.planner.prepare import assemble
    from zephon.specs import PackSpec, TokenizeSpec
    from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

    if unit not in ("samples", "tokens", "exact"):
        raise ValueError(f"unit must be samples, tokens or exact, got {unit!r}")
    rng = np.random.default_rng((seed, documents, shards))
    names = list(WEIGHTS)
    # Datasets are plain values; with no files listed, nothing touches a file system.
    datasets = [Dataset(name=n, path=f"/synthetic/{n}", files=(), pinned=f"/synthetic/{n}") for n in names]
    per_dataset = np.maximum(1, np.round(shards * np.array(list(WEIGHTS.values())))).astype(int)
    refs, tokens = [], []
    next_id = 0
    for index, name in enumerate(names):
        total = max(int(per_dataset[index]), round(documents * WEIGHTS[name] * SIZE_FACTOR[name]))
        sizes = _rows_per_shard(total, int(per_dataset[index]), rng)
        group, group_tokens = [], []
        for k, rows in enumerate(sizes.tolist()):
            group.append(
                ShardRef(
                    shard_id=next_id,
                    dataset_id=index,
                    dataset=name,
                    uri=f"/synthetic/{name}/part-{k:05d}.parquet",
                    format="parquet",
                    rows=rows,
                    bytes=rows * 4 * MEAN_TOKENS[name],
                    fingerprint=f"pqfooter:{name}-{k:05d}-{rows}",
                    row_groups=max(1, rows // 1000),
                )
            )
            next_id += 1
            if unit != "samples":
                group_tokens.append(partial(_synthetic_tokens, (seed, index, k), rows, MEAN_TOKENS[name]))
        refs.append(tuple(group))
        if unit == "samples":
            continue
        if lazy:  # generated again whenever a shard is read, as counts are loaded from the cache in a real plan
            tokens.append(ShardTokens(group_tokens, rows=[r.rows for r in group], names=[r.uri for r in group]))
        else:
            tokens.append(tuple(make() for make in group_tokens))
    source = StaticMixtureWorkSource(
        datasets=datasets,
        mixture=MixtureSpec(weights or WEIGHTS),
        seed=seed,
        num_documents=documents if budget == "documents" else None,
        num_tokens=round(documents * sum(w * MEAN_TOKENS[n] for n, w in WEIGHTS.items()))
        if budget == "tokens"
        else None,
        token_estimation=TokenEstimation(primer=0.25) if unit == "tokens" else None,
        exact_tokens=unit == "exact",
        lanes=lanes,
    )
    tokenize = TokenizeSpec(tokenizer_id="synthetic") if unit != "samples" else None
    return assemble(
        source,
        tuple(refs),
        tokens=tuple(tokens) if unit != "samples" else None,
        token_provenance={n: {"method": "synthetic"} for n in names} if unit != "samples" else None,
        tokenize=tokenize,
        tokenizer_fingerprint="synthetic" if tokenize is not None else None,
        pack=PackSpec(max_length=2049) if unit == "exact" else None,
    )


def _synthetic_tokens(key: tuple[int, int, int], rows: int, mean: int) -> np.ndarray:
    """Log-normal token counts of one synthetic shard, a pure function of its key."""
    draw = np.random.default_rng(key).lognormal(0.0, 1.0, rows)
    return (1 + mean * draw / np.exp(0.5)).astype(np.int64)


def _vmhwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def child(
    documents: int,
    unit: str,
    out: Path,
    shards: int,
    weights: dict[str, float] | None,
    drop_parts: bool = False,
    budget: str = "documents",
) -> None:
    """Plan one size and print a JSON line: setup and plan seconds, VmHWM after setup and at the end, and the CPU
    seconds of each phase (``phases``)."""
    from zephon.planner.build import write_bundle

    start = time.perf_counter()
    prepared = synthetic_prepared(documents, unit=unit, shards=shards, weights=weights, budget=budget)
    setup = time.perf_counter() - start
    hwm_setup = _vmhwm_kib()
    spent = phases()
    start, main_cpu = time.perf_counter(), time.thread_time()
    extra = {}
    if drop_parts:
        extra = _write_dropping_parts(prepared, out)
    else:
        write_bundle(prepared, out, overwrite=True)
    plan = time.perf_counter() - start
    main_cpu = time.thread_time() - main_cpu
    result = {"setup_s": setup, "plan_s": plan, "hwm_setup_kib": hwm_setup, "hwm_kib": _vmhwm_kib()}
    result["phase_cpu_s"] = {
        "layout": main_cpu - spent["table"],  # interleave, shuffle, lanes (and synthetic counts), the other files
        "table": spent["table"],  # each chunk made an Arrow table, on the planning thread
        "parquet": spent["parquet"],  # the samples encoded and written, on the writer's thread
    }
    print(json.dumps(result | extra))


def phases() -> dict[str, float]:
    """Thread CPU seconds of the samples writer's two steps, summed as they run (wraps them in place): ``table``
    (a chunk to an Arrow table, on the planning thread) and ``parquet`` (encoding and writing, on its thread). The
    planning thread's CPU less ``table`` is the layout (``child``)."""
    from zephon.planner import samples_writer

    spent = {"table": 0.0, "parquet": 0.0}

    def timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            begin = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.thread_time() - begin

        return run

    samples_writer._table = timed("table", samples_writer._table)
    samples_writer.SamplesWriter._write = timed("parquet", samples_writer.SamplesWriter._write)
    return spent


def _write_dropping_parts(prepared, out: Path) -> dict:
    """Lay out and write ``prepared``'s samples into ``out``, measuring and deleting each part once it is closed."""
    import threading

    from zephon.planner.layout import chunks
    from zephon.planner.samples_writer import SamplesWriter

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    writer = SamplesWriter(out)
    seen: dict[str, tuple[int, dict[str, int]]] = {}
    done = threading.Event()

    def measure(names: list[str]) -> None:
        for name in names:
            if name in seen:
                continue
            path = out / name
            seen[name] = (path.stat().st_size, _column_sizes(path))
            path.unlink()

    def watch() -> None:
        while not done.wait(5.0):
            measure(list(writer.files)[:-1])

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    documents = 0
    for chunk in chunks(prepared):
        documents += len(chunk)
        writer.write(chunk)
    writer.close()
    done.set()
    thread.join()
    last = writer.files[-1]
    measure(writer.files[:-1])
    seen[last] = ((out / last).stat().st_size, _column_sizes(out / last))
    columns: dict[str, int] = {}
    for _, sizes in seen.values():
        for k, v in sizes.items():
            columns[k] = columns.get(k, 0) + v
    return {
        "documents": documents,
        "samples_bytes": sum(size for size, _ in seen.values()),
        "parts": len(seen),
        "column_bytes": columns,
    }


def _column_sizes(path: Path) -> dict[str, int]:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    return {
        meta.row_group(0).column(c).path_in_schema: sum(
            meta.row_group(g).column(c).total_compressed_size for g in range(meta.num_row_groups)
        )
        for c in range(meta.num_columns)
    }


def seek_times(samples: list[Path], seeks: int = 200, seed: int = 0) -> dict[str, float]:
    """Open the files (footers), then read the row group holding each of ``seeks`` random positions."""
    import pyarrow.parquet as pq

    start = time.perf_counter()
    files = [pq.ParquetFile(path) for path in samples]
    groups = [(f, g) for f in files for g in range(f.metadata.num_row_groups)]
    counts = [f.metadata.row_group(g).num_rows for f, g in groups]
    first_row = np.concatenate(([0], np.cumsum(counts)))
    open_ms = (time.perf_counter() - start) * 1000
    rng = np.random.default_rng(seed)
    times = []
    for position in rng.integers(0, int(first_row[-1]), seeks).tolist():
        start = time.perf_counter()
        g = int(np.searchsorted(first_row, position, side="right")) - 1
        table = groups[g][0].read_row_group(groups[g][1])
        row = {name: table.column(name)[position - int(first_row[g])].as_py() for name in table.column_names}
        times.append((time.perf_counter() - start) * 1000)
        assert row["position"] == position, (row, position)
    return {"open_ms": open_ms, "seek_ms_median": float(np.median(times)), "seek_ms_max": float(np.max(times))}


def column_bytes(samples: list[Path], rows: int) -> dict[str, float]:
    """Compressed bytes per document of each column (data and dictionary pages), over all files."""
    out: dict[str, float] = {}
    for path in samples:
        for name, size in _column_sizes(path).items():
            out[name] = out.get(name, 0.0) + size / rows
    return out


def rank_seek(plan: Path, kind: str, seed: int) -> None:
    """In a fresh process: open ``plan`` as a rank does and read at a random position (``kind`` ``chunk``), or
    show a random step (``kind`` ``show``); print a JSON line of the wall time and peak RSS."""
    import resource

    if kind == "chunk":
        from zephon.executor.plan_reader import PlanBundle
    else:
        from zephon.inspection.show import show_step

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    start, cpu_start = time.perf_counter(), cpu()  # after the imports (the same at any plan size)
    rng = np.random.default_rng(seed)
    if kind == "chunk":
        bundle = PlanBundle(plan)
        position = int(rng.integers(0, bundle.num_documents))
        chunk = next(bundle.chunks(4096, start=position, ramp=4096))
        assert chunk.start == position
        where = position
    else:
        documents = json.loads((plan / "plan.json").read_text())["totals"]["documents"]
        where = int(rng.integers(0, documents // 1024))
        view = show_step(plan, where, batch_size=1024, text=False)
        assert len(view.rows) > 0
    seconds, cpu_s = time.perf_counter() - start, cpu() - cpu_start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"kind": kind, "at": where, "s": seconds, "cpu_s": cpu_s, "peak_rss_mib": rss}))


def rank_seeks(plan: Path, times: int = 5) -> list[dict]:
    out = []
    for kind in ("chunk", "show"):
        for seed in range(times):
            cmd = [sys.executable, __file__, "--rank-seek", kind, "--seed", str(seed), "--out", str(plan)]
            text = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            out.append(json.loads(text.strip().splitlines()[-1]))
    return out


def run_size(
    documents: int,
    unit: str,
    root: Path,
    shards: int,
    weights: str | None,
    drop_parts: bool = False,
    seeks: bool = False,
    budget: str = "documents",
) -> dict:
    out = root / f"plan-{unit}-{documents}"
    cmd = [sys.executable, __file__, "--child", str(documents), "--unit", unit, "--out", str(out)]
    cmd += ["--shards", str(shards)] + (["--weights", weights] if weights else [])
    cmd += ["--drop-parts"] if drop_parts else []
    cmd += ["--budget", budget]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    text = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"child for {documents} documents failed with exit code {proc.returncode}")
    result = json.loads(text.strip().splitlines()[-1])
    result.update(cpu_s=usage.ru_utime + usage.ru_stime, peak_rss_mib=usage.ru_maxrss / 1024)
    if drop_parts:
        rows = result["documents"]
        result.update(
            bytes_per_document=result["samples_bytes"] / rows,
            column_bytes_per_document={k: v / rows for k, v in result.pop("column_bytes").items()},
            open_ms=float("nan"),
            seek_ms_median=float("nan"),
            seek_ms_max=float("nan"),
        )
        shutil.rmtree(out, ignore_errors=True)
        return result
    manifest = json.loads((out / "plan.json").read_text())
    samples = [out / name for name in manifest["files"]["samples"]]
    rows = int(manifest["totals"]["documents"])
    result.update(
        documents=rows,
        parts=len(samples),
        bytes_per_document=sum(p.stat().st_size for p in samples) / rows,
        column_bytes_per_document=column_bytes(samples, rows),
        **seek_times(samples),
    )
    if seeks:
        result["rank_seeks"] = rank_seeks(out)
    shutil.rmtree(out, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", nargs="+", type=float, default=[1e6, 1e7, 1e8])
    parser.add_argument("--unit", choices=("samples", "tokens", "exact"), default="samples")
    parser.add_argument("--shards", type=int, default=SHARDS)
    parser.add_argument(
        "--budget",
        choices=("documents", "tokens"),
        default="documents",
        help="num_documents=N, or (--unit tokens) num_tokens of about N documents: the room check's token bound",
    )
    parser.add_argument(
        "--weights",
        help="five comma-separated weights instead of 0.4,0.25,0.15,0.12,0.08 (e.g. float shares such as "
        "0.3183098861837907,... take the stepwise interleaving path)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--columns", action="store_true", help="print bytes per document of each column")
    parser.add_argument("--root", type=Path, help="directory for the plans (default: a temporary one)")
    parser.add_argument("--drop-parts", action="store_true", help="measure and delete each samples part when closed")
    parser.add_argument("--rank-seeks", action="store_true", help="time a rank's open + seek and show_step, fresh")
    parser.add_argument("--rank-seek", choices=("chunk", "show"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    weights = dict(zip(WEIGHTS, map(float, args.weights.split(",")), strict=True)) if args.weights else None
    if args.rank_seek is not None:
        rank_seek(args.out, args.rank_seek, args.seed)
        return
    if args.child is not None:
        child(args.child, args.unit, args.out, args.shards, weights, args.drop_parts, args.budget)
        return
    root = args.root or Path(tempfile.mkdtemp(prefix="zephon-bench-planner-"))
    results = []
    mixture = args.weights or ",".join(map(str, WEIGHTS.values()))
    print(f"unit {args.unit}, {args.shards:,} shards, 5 datasets, weights {mixture}; child process per size")
    head = f"{'documents':>13} {'plan s':>8} {'CPU s':>7} {'peak RSS MiB':>13} {'bytes/doc':>10} {'open ms':>8}"
    print(f"{head} {'seek ms p50/max':>16}")
    for n in args.documents:
        r = run_size(int(n), args.unit, root, args.shards, args.weights, args.drop_parts, args.rank_seeks, args.budget)
        results.append(r)
        print(
            f"{r['documents']:>13,} {r['plan_s']:>8.2f} {r['cpu_s']:>7.1f} {r['peak_rss_mib']:>13,.0f} "
            f"{r['bytes_per_document']:>10.2f} "
            f"{r['open_ms']:>8.1f} {r['seek_ms_median']:>8.1f}/{r['seek_ms_max']:<7.1f}",
            flush=True,
        )
        if args.columns:
            print(" " * 14 + "  ".join(f"{k} {v:.3f}" for k, v in r["column_bytes_per_document"].items()))
        print(" " * 14 + "CPU s by phase: " + ", ".join(f"{k} {v:.1f}" for k, v in r["phase_cpu_s"].items()))
        for seek in r.get("rank_seeks", ()):
            print(
                f"{'':14}{seek['kind']:>6} at {seek['at']:>13,}: {seek['s']:.2f} s ({seek['cpu_s']:.2f} s CPU), "
                f"{seek['peak_rss_mib']:,.0f} MiB"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.root is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
