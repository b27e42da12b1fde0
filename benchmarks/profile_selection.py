"""Where a selection's time goes: every DuckDB statement, fetch and NumPy step of ``select_rows``, timed.

Run: python benchmarks/profile_selection.py --root DIR [--mode where+sidecar+dedup] [--threads 2]

``DIR`` holds a corpus written by ``bench_selection.py --root DIR`` (``data/`` and ``side/``). The selection
runs once in this process, with DuckDB's connection wrapped so each ``execute`` and ``fetch*`` prints its
wall and CPU seconds (process CPU, so DuckDB's threads count) and the first words of its SQL; the sidecar's
SHA-256 and each dedup partition's decision (``dedup._decide``: its ranks fetched, ``dedup_keep``) are timed
the same way. Printed last: the selected (shard, row) pairs' SHA-256 (to
compare two versions' selections) and peak RSS (``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import sys
import time
from pathlib import Path
from typing import Any

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from bench_selection import DEDUP_ON, ORDER_BY

_STEPS: list[tuple[str, float, float]] = []


def _timed(label: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    _STEPS.append((label, time.perf_counter() - wall, time.process_time() - cpu))
    print(f"{_STEPS[-1][1]:8.2f} s wall {_STEPS[-1][2]:8.2f} s cpu  {label}", flush=True)
    return out


class _Connection:
    """A DuckDB connection whose statements and fetches are timed."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def execute(self, query: str, *args: Any) -> _Connection:
        _timed(" ".join(query.split())[:110], self._con.execute, query, *args)
        return self

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._con, name)
        if name.startswith("fetch"):
            return lambda *a, **k: _timed(f"  {name}", attr, *a, **k)
        return attr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--mode", default="where+sidecar+dedup")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from zephon.io import Dataset
    from zephon.planner.prepare import shard_refs
    from zephon.planner.selection import dedup, join
    from zephon.planner.selection import evaluate as sel
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    connect = duckdb.connect
    sel.duckdb.connect = lambda *a, **k: _Connection(connect(*a, **k))  # type: ignore[assignment]
    fingerprint, decide = join._sidecar_fingerprint, dedup._decide
    join._sidecar_fingerprint = lambda *a: _timed("sidecar SHA-256", fingerprint, *a)  # type: ignore[assignment]
    dedup._decide = lambda con, p, *a: _timed(f"dedup partition {p}", decide, con, p, *a)  # type: ignore[assignment]
    kw: dict[str, str] = {"where": "int_score >= 3 AND language = 'en'"}
    if args.mode.startswith("where+sidecar"):
        kw = {"where": "int_score >= 3 AND quality > 0.5", "metadata": str(args.root / "side"), "key": "id"}
    if args.mode == "where+sidecar+dedup":
        kw["dedup_on"] = DEDUP_ON
    if args.mode == "where+order_by":
        kw["order_by"] = ORDER_BY
    ds = Dataset.from_path("web", str(args.root / "data"), **kw)  # type: ignore[arg-type]
    source = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=1)
    refs = _timed("shard_refs", shard_refs, source, progress=False)[0]
    assert ds.selection is not None
    chosen = _timed("select_rows (all)", sel.select_rows, ds.selection, refs, seed=1, dataset_index=0,
                    threads=args.threads)  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    digest = hashlib.sha256(chosen.shard.astype("<i4").tobytes() + chosen.row.astype("<i4").tobytes()).hexdigest()
    print(f"selected {len(chosen.row):,}; (shard, row) SHA-256 {digest[:16]}; peak RSS {peak:.2f} GB")


if __name__ == "__main__":
    main()
