"""A rank's seek into plans of 10^9 and 10^10 documents: open the bundle, read one chunk at a random position, and
``show_step`` a random step, each in a fresh process; wall time (after imports) and peak RSS.

Run: python benchmarks/bench_plan_seek.py [--parts 1 8 75] [--root DIR] [--seeks 5]

Writing a 10^10-document plan takes hours of CPU on a shared 2-core machine (docs/performance.md "10^10"); what a
rank pays to seek does not depend on the values in the files, only on their number, sizes and footers. So one
samples plan of exactly 2^27 documents (one part: 2,048 row groups; ``bench_planner.synthetic_prepared``, 10^5
rows per shard) is written once, and bundles of N parts are made of N hard links to its samples file, plan.json
saying ``N × 2^27`` documents, sealed again (``seal_bundle``). The links hold the same positions, so a chunk's
``position`` column repeats part 0's; row counts, footers, row groups and the integrity checks are those of a real
plan of that size. N = 8: 1.07 × 10^9 documents; N = 75: 1.007 × 10^10.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PART = 1 << 27


def make_part(root: Path) -> Path:
    """A samples plan of exactly one part's documents (one samples.parquet)."""
    from bench_planner import synthetic_prepared

    from zephon.planner.build import write_bundle

    out = root / "one-part"
    if not (out / "plan.json").exists():
        write_bundle(synthetic_prepared(PART, shards=PART // 100_000), out, overwrite=True)
    return out


def linked_bundle(source: Path, parts: int, root: Path) -> Path:
    """A bundle of ``parts`` hard links to ``source``'s samples file, sealed."""
    from zephon.plan.format import PLAN_JSON, SAMPLES_DIR, SAMPLES_FILE, SHARDS_FILE, samples_part
    from zephon.planner.build import seal_bundle

    if parts == 1:
        return source
    out = root / f"linked-{parts}"
    if (out / PLAN_JSON).exists():
        return out
    (out / SAMPLES_DIR).mkdir(parents=True)
    os.link(source / SHARDS_FILE, out / SHARDS_FILE)
    names = [samples_part(k) for k in range(parts)]
    for name in names:
        os.link(source / SAMPLES_FILE, out / name)
    manifest = json.loads((source / PLAN_JSON).read_text())
    manifest["files"]["samples"] = names
    manifest["totals"]["documents"] = parts * PART
    (out / PLAN_JSON).write_text(json.dumps(manifest, indent=2))
    seal_bundle(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", type=int, default=[1, 8, 75])
    parser.add_argument("--root", type=Path, help="directory for the plans (default: a temporary one)")
    parser.add_argument("--seeks", type=int, default=5, help="fresh processes per kind and size")
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="zephon-bench-seek-"))
    source = make_part(root)
    bench = str(Path(__file__).resolve().parent / "bench_planner.py")
    head = f"{'documents':>15} {'parts':>6} {'kind':>6} {'wall s p50 / max':>17} {'CPU s p50 / max':>16}"
    print(f"{head} {'peak RSS MiB p50 / max':>23}")
    for parts in args.parts:
        plan = linked_bundle(source, parts, root)
        for kind in ("chunk", "show"):
            runs = []
            for seed in range(args.seeks):
                cmd = [sys.executable, bench, "--rank-seek", kind, "--seed", str(seed), "--out", str(plan)]
                text = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
                runs.append(json.loads(text.strip().splitlines()[-1]))
            s, cpu = sorted(r["s"] for r in runs), sorted(r["cpu_s"] for r in runs)
            rss = sorted(r["peak_rss_mib"] for r in runs)
            print(
                f"{parts * PART:>15,} {parts:>6} {kind:>6} {s[len(s) // 2]:>8.3f} / {s[-1]:<6.3f} "
                f"{cpu[len(cpu) // 2]:>7.3f} / {cpu[-1]:<6.3f} {rss[len(rss) // 2]:>11,.0f} / {rss[-1]:<9,.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
