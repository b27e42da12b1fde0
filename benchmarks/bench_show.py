"""`zephon show` on a plan of 10^7 documents: seek, do not scan.

Run: python benchmarks/bench_show.py [--documents N] [--batch-size B] [--repeats R]

Synthesizes a plan bundle of N documents over three tiny shards (tests/support/synthetic_plans.py: an exact wrap plan,
then the same documents as an estimated token plan), then times, for steps at the start, middle and end:

* ``zephon.inspection.show.show_step`` in this process (the library call, text previews included; median of R runs);
* ``zephon show`` as a command in a fresh process (interpreter start and imports included);
* SQL: ``step_documents(n)`` (seeks through row-group statistics) against ``steps WHERE step = n`` (a scan).

The estimated plan has no offsets column, so its seek reads the ``tokens`` column of every row group before
the step: the end of the plan is its worst case.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.synthetic_plans import write_synthetic_plan


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=10_000_000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=257)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from zephon.inspection.show import show_step
    from zephon.inspection.steps import resolve_layout
    from zephon.inspection.views import connect_with_steps
    from zephon.plan.manifest import read_manifest

    root = Path(tempfile.mkdtemp(prefix="zephon-bench-show-"))
    zephon = Path(sys.executable).parent / "zephon"
    for kind in ("exact", "estimated"):
        start = time.perf_counter()
        plan = write_synthetic_plan(root / kind, args.documents, max_length=args.max_length, kind=kind)
        written = time.perf_counter() - start
        max_length = None if kind == "exact" else args.max_length
        layout = resolve_layout(read_manifest(plan), batch_size=args.batch_size, max_length=max_length)
        steps = layout.require_steps()
        print(
            f"{kind} plan: {args.documents:,} documents, {steps:,} steps of {args.batch_size} × {args.max_length} "
            f"tokens (written in {written:.1f} s)"
        )
        extra = [] if max_length is None else ["--max-length", str(max_length)]
        for step in (0, steps // 2, steps - 1):
            library = _median_seconds(
                lambda s=step, p=plan, m=max_length: show_step(p, s, batch_size=args.batch_size, max_length=m),
                args.repeats,
            )
            command = [str(zephon), "show", str(plan), "--step", str(step), "-b", str(args.batch_size), *extra]
            cli = _median_seconds(lambda c=command: subprocess.run(c, check=True, capture_output=True), args.repeats)
            con = connect_with_steps(plan, args.batch_size, max_length=max_length)
            try:
                seek = _median_seconds(
                    lambda s=step, c=con: c.execute("SELECT * FROM step_documents($n)", {"n": s}).fetchall(),
                    args.repeats,
                )
                scan = _median_seconds(
                    lambda s=step, c=con: c.execute("SELECT * FROM steps WHERE step = $n", {"n": s}).fetchall(), 1
                )
            finally:
                con.close()
            print(
                f"  step {step:>9,}: show_step {library * 1000:7.1f} ms   zephon show {cli * 1000:7.1f} ms   "
                f"SQL step_documents {seek * 1000:7.1f} ms   SQL steps WHERE step = n {scan * 1000:7.1f} ms"
            )


if __name__ == "__main__":
    main()
