"""Estimated versus exact plans on the demo corpus: start-up cost, token shares, packing waste.

Run: python benchmarks/bench_plans.py [--copies N] [--max-length L]

Builds N copies of the demo corpus (different seeds: prose / code / short documents whose mean lengths
differ ~45×), then plans the same 0.5/0.3/0.2 token mixture four ways in one run and prints, per plan, the
planning time, the planned token shares and, for the estimated plan, the realized shares measured by running
the executor over it. Ratios compare against the estimated plan measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

WEIGHTS = {"prose": 0.5, "code": 0.3, "short": 0.2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=2049)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zephon-bench-"))
    os.environ["ZEPHON_CACHE_DIR"] = str(root / "cache")

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # demo_grammar: demo corpora of any seed
    from demo_grammar import write_demo_dataset

    from zephon import Pipeline
    from zephon.demo import demo_tokenizer_path
    from zephon.io import Dataset
    from zephon.specs import PackSpec, TokenizeSpec
    from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

    for seed in range(args.copies):
        write_demo_dataset(root / f"copy{seed}", seed=seed)
    datasets = [Dataset.from_path(k, str(root / "copy*" / "demo" / f"{k}-*.parquet")) for k in WEIGHTS]
    tok = TokenizeSpec(tokenizer_id=demo_tokenizer_path())

    def plan(name: str, exact: bool, algorithm: str = "wrap") -> tuple[float, dict]:
        src = StaticMixtureWorkSource(
            datasets=datasets,
            mixture=MixtureSpec(WEIGHTS),
            seed=0,
            token_estimation=TokenEstimation(),
            exact_tokens=exact,
        )
        start = time.perf_counter()
        out = src.plan(root / name, tokenize=tok, pack=PackSpec(max_length=args.max_length, algorithm=algorithm))
        return time.perf_counter() - start, json.loads((out / "plan.json").read_text())

    rows = []
    t_est, m_est = plan("estimated", exact=False)
    rows.append(("estimated (calibrated)", t_est, m_est))
    t_cold, m_cold = plan("exact-cold", exact=True)
    rows.append(("exact wrap, count pass cold", t_cold, m_cold))
    t_warm, m_warm = plan("exact-warm", exact=True)
    rows.append(("exact wrap, counts cached", t_warm, m_warm))
    t_bf, m_bf = plan("exact-bestfit", exact=True, algorithm="best_fit")
    rows.append(("exact best_fit, counts cached", t_bf, m_bf))

    print(
        f"corpus: {args.copies} demo copies, {m_cold['totals']['tokens']:,} planned tokens, "
        f"max_length {args.max_length}"
    )
    print(f"{'plan':32} {'time s':>7} {'× est':>6}  planned token shares (prose/code/short)")
    for label, t, m in rows:
        shares = "/".join(f"{d['planned_token_share']:.4f}" for d in m["datasets"])
        print(f"{label:32} {t:7.2f} {t / t_est:6.2f}  {shares}")

    pipe = (
        Pipeline.from_plan(root / "estimated")
        .tokenize(tokenizer_id=tok.tokenizer_id)
        .pack_flat(max_length=args.max_length)
        .batch(microbatch_size=8)
    )
    start = time.perf_counter()
    for _ in pipe:
        pass
    realized = pipe.stats().token_shares()
    print(
        f"estimated plan realized shares: {'/'.join(f'{realized[k]:.4f}' for k in WEIGHTS)} "
        f"(executor run {time.perf_counter() - start:.2f} s); estimated total {m_est['totals']['tokens']:,} vs "
        f"realized {sum(pipe.stats().tokens.values()):,}"
    )
    p = m_bf["packing"]
    wrap_pad = m_warm["packing"]["padding_fraction"]
    print(
        f"padding: wrap {wrap_pad:.5f} (last row only), best_fit {p['padding_fraction']:.5f}, "
        f"first_fit {p['first_fit_padding_fraction']:.5f}, split documents {p['split_documents']}"
    )


if __name__ == "__main__":
    main()
