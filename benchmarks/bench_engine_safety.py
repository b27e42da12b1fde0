"""What engine safety costs: throughput against the last release, and the spot check's share of the run's CPU.

Run: python benchmarks/bench_engine_safety.py --baseline-python OLD/.venv/bin/python [--tokenizer deepseek-v4|DIR]
     [--engine auto|NAME] [--documents 6000] [--rounds 3] [--root DIR]

``--baseline-python`` is an interpreter whose ``zephon`` is the last release (e.g. a venv over a ``git worktree`` of
the commit before this change, installed with ``pip install --no-deps -e``). Both interpreters run the same
script in fresh processes, alternating, ``--rounds`` times: plan ``--documents`` documents of real text from this
machine's files (``local_corpus.py``: prose, code, short docstrings) by samples, then iterate the whole plan (tokenize
with the vendor tokenizer, ``vendor_tokenizers.py``; pack 2049; batches of 8) and report tokens/s of the
iteration and the engine used. The current build also reports the spot check's CPU seconds
(``Encoder.spot_check.seconds``, thread CPU time inside the check) against the process's CPU seconds over the
iteration.

Printed: one line per run, then the medians: current ÷ baseline tokens/s (the bar: ≥ 1.0 within noise where the
engine is the same) and the spot check's share of CPU (the bar: ≤ 3 %).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource
corpus, tokenizer, documents, plan_root = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
kinds = ["prose", "code", "short"]
ws = StaticMixtureWorkSource(
    datasets=[Dataset.from_path(k, str(Path(corpus) / k)) for k in kinds],
    mixture=MixtureSpec({"prose": 0.5, "code": 0.3, "short": 0.2}), seed=7, num_documents=documents)
p = Pipeline(ws).tokenize(tokenizer_id=tokenizer).pack_flat(max_length=2049).batch(microbatch_size=8)
it = iter(p)
first = next(it)
cpu0, t0 = time.process_time(), time.perf_counter()
tokens = first.to_training(return_labels=False)["input_ids"].numel()
for batch in it:
    tokens += batch.to_training(return_labels=False)["input_ids"].numel()
wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
print(json.dumps({"tokens_per_s": tokens / wall, "cpu_s": cpu, "engine": p.stats().tokenizer_engine,
                  "spot_s": p.stats().spot_check_seconds if hasattr(p.stats(), "spot_check_seconds") else None,
                  "spot_docs": p.stats().spot_checked if hasattr(p.stats(), "spot_checked") else None}))
"""


def run(python: str, corpus: Path, tokenizer: Path, documents: int, cache: Path, engine: str) -> dict[str, object]:
    env = {**os.environ, "ZEPHON_CACHE_DIR": str(cache), "ZEPHON_PROGRESS": "0", "ZEPHON_TOKENIZER_ENGINE": engine}
    done = subprocess.run(
        [python, "-c", CHILD, str(corpus), str(tokenizer), str(documents), str(cache)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd="/tmp",
    )
    if done.returncode != 0:
        raise SystemExit(f"{python} failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-python", required=True)
    parser.add_argument("--tokenizer", default="deepseek-v4", help="a vendor_tokenizers.py name, or a tokenizer dir")
    parser.add_argument("--engine", default="auto", help="ZEPHON_TOKENIZER_ENGINE for both builds")
    parser.add_argument("--documents", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "zephon-bench-engine-safety")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import local_corpus
    import vendor_tokenizers

    corpus = local_corpus.build(args.root / "corpus")
    if Path(args.tokenizer).is_dir():
        tokenizer = Path(args.tokenizer)
    else:
        tokenizer = vendor_tokenizers.build(args.tokenizer, args.root / "tokenizers")
    current = sys.executable
    results: dict[str, list[dict[str, object]]] = {"current": [], "baseline": []}
    for r in range(args.rounds):
        order = [("current", current), ("baseline", args.baseline_python)]
        for label, python in order if r % 2 == 0 else order[::-1]:
            cache = args.root / f"cache-{label}"  # warm verdicts and plans per build, as a user's second run
            got = run(python, corpus, tokenizer, args.documents, cache, args.engine)
            results[label].append(got)
            spot = ""
            if got.get("spot_s") is not None:
                spot = f"  spot check {got['spot_s']:.3f} CPU s of {got['cpu_s']:.2f} ({got['spot_docs']} documents)"
            print(f"round {r} {label:8} {got['engine']:10} {got['tokens_per_s'] / 1e6:6.2f} Mtok/s{spot}")
    cur = statistics.median(float(g["tokens_per_s"]) for g in results["current"])
    base = statistics.median(float(g["tokens_per_s"]) for g in results["baseline"])
    share = statistics.median(float(g["spot_s"]) / float(g["cpu_s"]) for g in results["current"] if g["spot_s"])
    print(f"median: current {cur / 1e6:.2f} Mtok/s, baseline {base / 1e6:.2f} Mtok/s, ratio {cur / base:.3f}")
    print(f"spot check: median {100 * share:.2f} % of the iteration's CPU")


if __name__ == "__main__":
    main()
