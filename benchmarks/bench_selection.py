"""Selections by metadata at scale: a ``where`` over a sidecar column, planned, against a plain scan.

Run: python benchmarks/bench_selection.py [--documents 1e7] [--shards 200] [--threads 2] [--json FILE]

Writes a synthetic corpus of N documents in ``--shards`` Parquet shards (columns ``id`` int64,
``int_score`` int8 0-5, ``language`` dictionary string, ``text`` a short dictionary string — the text is
never read by a selection, so its size does not matter here) and a sidecar of the same N ids with a
``quality`` float32, shuffled into 8 files (a sidecar is rarely in the corpus's order). Then, each in a
child process (its own peak RSS, from ``os.wait4``) limited to ``--threads`` DuckDB threads:

* **baseline**: scan the shards' footers (``shard_refs``) and read the ``id`` and ``int_score`` columns
  with pyarrow — the least any selection over them must do;
* **where**: plan a sample mixture over ``where="int_score >= 3 AND language = 'en'"``;
* **where + sidecar**: ``where="int_score >= 3 AND quality > 0.5"`` with ``metadata=SIDECAR, key="id"``
  (the join, the duplicate-key check and the keys-on-one-side counts);
* **sidecar-duplicates** (``--modes sidecar-duplicates``): the same selection over a sidecar that holds
  ``--duplicates`` K more rows repeating K of its keys (the 8 files linked, plus one file of the repeats): the
  time and memory until the one-line refusal (its count and example key), which is printed.
* **where + sidecar + dedup**: the same with ``dedup_on="id // 2"`` (documents in pairs of consecutive ids:
  one of each pair both of whose documents pass is dropped) — issue #30's bar at 10^9.
* **where + order_by** (``--modes where+order_by``): the ``where`` run with ``order_by="id % 7919 DESC"`` (every
  kept row sorted by a key with few ties).

Each child gets its own ``TMPDIR`` (under ``--root``), polled every 0.2 s: the most bytes under it at once is
the disk the selection spilled (DuckDB's spill files and the partitioned join's files); "disk" is the most the
file system's used bytes grew, which also counts unnamed files (a ``where`` alone keeps its rows in one past
256 MB, ``planner/selection/selected.py``) — and anything else written there meanwhile.

``--copies K`` writes ``--documents`` ÷ K rows once and hard-links each shard K times: 10^10 rows (10^5 shards)
on a disk that holds 10^9 (for ``where`` and ``baseline``: the ids repeat).

Printed: wall time, CPU time, peak RSS, peak spill, and each time as a ratio to the baseline of the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

LANGS = np.array(["en", "fr", "de", "es"])
#: The dedup key of the where + sidecar + dedup run: consecutive ids in pairs (one near-duplicate each).
DEDUP_ON = "id // 2"
#: The key of the where + order_by run: a sort of every kept row (ties are few).
ORDER_BY = "id % 7919 DESC"
SIDECAR_SCHEMA = pa.schema([("id", pa.int64()), ("quality", pa.float32())])


def write_corpus(
    root: Path, documents: int, shards: int, *, sidecar: bool = True, copies: int = 1
) -> tuple[Path, Path]:
    """The corpus under ``root/data`` (``copies`` > 1: its shards hard-linked that many times, ``copies ×
    documents`` rows whose ids repeat, which a ``where`` does not notice) and, with ``sidecar``, its sidecar."""
    data, side = root / "data", root / "side"
    data.mkdir(parents=True, exist_ok=True)
    side.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    bounds = np.linspace(0, documents, shards + 1).astype(np.int64)
    text = pa.DictionaryArray.from_arrays(pa.array(np.zeros(1, np.int32)), pa.array(["lorem ipsum"]))
    for s in range(shards):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        n = hi - lo
        table = pa.table(
            {
                "id": pa.array(np.arange(lo, hi, dtype=np.int64)),
                "int_score": pa.array(rng.integers(0, 6, n, dtype=np.int8)),
                "language": pa.DictionaryArray.from_arrays(
                    pa.array(rng.choice(4, n, p=[0.7, 0.1, 0.1, 0.1]).astype(np.int32)), pa.array(LANGS.tolist())
                ),
                "text": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), text.dictionary),
            }
        )
        pq.write_table(table, data / f"part-{s:05d}.parquet", row_group_size=100_000)
    for k in range(1, copies):
        for s in range(shards):
            os.link(data / f"part-{s:05d}.parquet", data / f"part-{s:05d}-{k:02d}.parquet")
    if not sidecar:
        return data, side
    # The sidecar's ids in another order (a sidecar is rarely in the corpus's order): i -> (a*i + c) mod N with
    # a coprime to N, a permutation computed chunk by chunk, so that writing 10^9 ids holds one chunk, not N.
    a = int(documents * 0.6180339887) | 1
    while math.gcd(a, documents) != 1:
        a += 2
    chunk = 10_000_000
    cuts = np.linspace(0, documents, 9).astype(np.int64)
    for k in range(8):
        with pq.ParquetWriter(side / f"scores-{k}.parquet", SIDECAR_SCHEMA) as writer:
            for lo in range(int(cuts[k]), int(cuts[k + 1]), chunk):
                i = np.arange(lo, min(lo + chunk, int(cuts[k + 1])), dtype=np.int64)
                ids = (a * i + 7) % documents
                quality = rng.random(len(i), dtype=np.float32)
                writer.write_table(pa.table({"id": ids, "quality": quality}, schema=SIDECAR_SCHEMA))
    return data, side


def write_duplicates(root: Path, documents: int, duplicates: int) -> Path:
    """``side-dup/``: the sidecar's 8 files linked, and one more file repeating the keys 0, 7, 14, ... (K of them),
    so K keys are on two rows each."""
    dup = root / "side-dup"
    dup.mkdir(exist_ok=True)
    for f in sorted((root / "side").glob("*.parquet")):
        if not (dup / f.name).exists():
            (dup / f.name).symlink_to(f)
    ids = (np.arange(duplicates, dtype=np.int64) * 7) % documents
    quality = np.full(duplicates, 0.25, np.float32)
    pq.write_table(pa.table({"id": ids, "quality": quality}, schema=SIDECAR_SCHEMA), dup / "zz-repeats.parquet")
    return dup


def _child(mode: str, data: str, side: str, threads: int) -> dict[str, float]:
    from zephon.io import Dataset
    from zephon.planner.prepare import shard_refs
    from zephon.planner.selection import evaluate as sel
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    start = time.perf_counter()
    if mode == "baseline":
        source = StaticMixtureWorkSource(
            datasets=[Dataset.from_path("web", data)], mixture=MixtureSpec({"web": 1.0}), seed=1
        )
        refs = shard_refs(source, progress=False)[0]
        rows = 0
        for r in refs:
            rows += len(pq.read_table(r.uri, columns=["id", "int_score"]))
        selected = rows
    else:
        from zephon.errors import DatasetError

        kw: dict[str, str] = {"where": "int_score >= 3 AND language = 'en'"}
        if mode in ("where+sidecar", "sidecar-duplicates", "where+sidecar+dedup"):
            kw = {"where": "int_score >= 3 AND quality > 0.5", "metadata": side, "key": "id"}
        if mode == "where+sidecar+dedup":
            kw["dedup_on"] = DEDUP_ON
        if mode == "where+order_by":
            kw["order_by"] = ORDER_BY
        ds = Dataset.from_path("web", data, **kw)  # type: ignore[arg-type]
        source = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=1)
        refs = shard_refs(source, progress=False)[0]
        assert ds.selection is not None
        try:
            chosen = sel.select_rows(ds.selection, refs, seed=1, dataset_index=0, threads=threads)
        except DatasetError as exc:  # sidecar-duplicates: the refusal is the result
            return {"seconds": time.perf_counter() - start, "selected": 0, "refused": str(exc)}
        selected = chosen.selected
    return {"seconds": time.perf_counter() - start, "selected": selected}


def _bytes_under(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed while we walked
                total += os.stat(os.path.join(folder, name)).st_size
    return total


def _used(path: Path) -> int:
    """Bytes in use on ``path``'s file system: counts files without a name too (a selection's kept rows past
    ``selected.MEMORY_BYTES`` live in an unnamed temporary file), and anything else writing there."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def run(mode: str, data: Path, side: Path, threads: int, scratch: Path) -> dict[str, float]:
    scratch.mkdir(parents=True, exist_ok=True)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: its own peak RSS, its own TMPDIR
        os.close(read)
        os.environ["TMPDIR"] = str(scratch)
        tempfile.tempdir = None
        out = _child(mode, str(data), str(side), threads)
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    spilled = [0, 0]
    done = threading.Event()
    base = _used(scratch)

    def poll() -> None:
        while not done.wait(0.2):
            spilled[0] = max(spilled[0], _bytes_under(scratch))
            spilled[1] = max(spilled[1], _used(scratch) - base)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    _, status, usage = os.wait4(pid, 0)
    done.set()
    watcher.join()
    body = os.read(read, 1 << 16)
    os.close(read)
    if status != 0:
        raise SystemExit(f"{mode} failed (status {status})")
    out = json.loads(body)
    out["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    out["peak_rss_gb"] = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024) / 1e9
    out["peak_spill_gb"] = spilled[0] / 1e9
    out["peak_disk_gb"] = spilled[1] / 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=float, default=1e7)
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--root", type=Path, default=None, help="Keep the corpus here (default: a temp dir).")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--modes", default="baseline,where,where+sidecar,where+sidecar+dedup", help="Comma-separated runs to time."
    )
    parser.add_argument("--duplicates", type=int, default=1000, help="Repeated keys of sidecar-duplicates.")
    parser.add_argument(
        "--copies", type=int, default=1,
        help="Write --documents ÷ COPIES rows and hard-link each shard COPIES times (10^10 rows on a disk that "
        "holds 10^9; ids repeat: for the where and baseline modes only).",
    )  # fmt: skip
    args = parser.parse_args()
    n = int(args.documents)
    modes = args.modes.split(",")
    if args.copies > 1 and any("sidecar" in m for m in modes):
        raise SystemExit(f"--copies must be 1 for the sidecar modes (unique ids), got {args.copies} — drop it")
    if n % args.copies or args.shards % args.copies:
        raise SystemExit(
            f"--documents and --shards must be multiples of --copies, got {n}, {args.shards}, {args.copies} — fix them"
        )
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp)
        t0 = time.perf_counter()
        sidecar = any("sidecar" in m for m in modes)
        if not (root / "data").exists():
            write_corpus(root, n // args.copies, args.shards // args.copies, sidecar=sidecar, copies=args.copies)
        extra = " + 8 sidecar files" if sidecar else ""
        print(f"corpus: {n:,} documents in {args.shards} shards{extra} ({time.perf_counter() - t0:.1f} s)")
        scratch = root / "scratch"
        results = {}
        for m in modes:
            side = write_duplicates(root, n, args.duplicates) if m == "sidecar-duplicates" else root / "side"
            results[m] = run(m, root / "data", side, args.threads, scratch)
        scratch.rmdir()  # each selection removed what it wrote there
    base = results["baseline"]["seconds"] if "baseline" in results else float("nan")
    for mode, r in results.items():
        print(
            f"{mode:<20} {r['seconds']:7.2f} s  cpu {r['cpu_seconds']:7.2f} s  peak RSS {r['peak_rss_gb']:.2f} GB  "
            f"spill {r['peak_spill_gb']:.2f} GB  disk {r['peak_disk_gb']:.2f} GB  "
            f"selected {int(r['selected']):,}  ×{r['seconds'] / base:.2f} of "
            "the baseline"
        )
        if "refused" in r:
            print(f"  refused: {r['refused']}")
    if args.json:
        args.json.write_text(json.dumps({"documents": n, "threads": args.threads, "results": results}, indent=2))


if __name__ == "__main__":
    main()
