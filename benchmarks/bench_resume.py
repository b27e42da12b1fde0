"""Resume cost: time from ``load_state_dict`` to the first batch, at step 10 and at step 10^5.

Run: python benchmarks/bench_resume.py [--far 100000] [--max-length 33] [--global-batch 8]

Plans the demo corpus (repeated until the plan holds enough tokens for ``--far`` steps) as an exact and as an
estimated plan. For each, it runs once to step ``--far`` recording the state at step 10 and at ``--far``
(what an uninterrupted run costs — the replay a loader without seeking would redo), then measures resuming
from each state. Resume seeks: the ratio far/near should stay near 1.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--far", type=int, default=100_000)
    parser.add_argument("--max-length", type=int, default=33)
    parser.add_argument("--global-batch", type=int, default=8)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zephon-resume-"))
    os.environ["ZEPHON_CACHE_DIR"] = str(root / "cache")

    from zephon import Pipeline
    from zephon.demo import demo_dataset_paths, demo_tokenizer_path
    from zephon.io import Dataset
    from zephon.specs import PackSpec, TokenizeSpec
    from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

    tok = demo_tokenizer_path()
    datasets = [Dataset.from_path(k, v) for k, v in demo_dataset_paths(root / "data").items()]
    need = int((args.far + 50) * args.global_batch * args.max_length * 1.1)

    def pipeline(plan: Path) -> Pipeline:
        return (
            Pipeline.from_plan(plan)
            .tokenize(tokenizer_id=tok)
            .pack_flat(max_length=args.max_length)
            .batch(microbatch_size=args.global_batch)
        )

    print(
        f"{'plan':10} {'documents':>10} {'run to far s':>13} {'resume@10 ms':>13} {'resume@far ms':>14} {'far/near':>9}"
    )
    for kind, exact in (("exact", True), ("estimated", False)):
        src = StaticMixtureWorkSource(
            datasets=datasets,
            mixture=MixtureSpec({"prose": 0.5, "code": 0.3, "short": 0.2}),
            seed=0,
            token_estimation=TokenEstimation(),
            exact_tokens=exact,
            num_tokens=need,
        )
        plan = src.plan(root / kind, tokenize=TokenizeSpec(tokenizer_id=tok), pack=PackSpec(max_length=args.max_length))
        p = pipeline(plan)
        states = {}
        start = time.perf_counter()
        for batch in p:
            if batch.step + 1 in (10, args.far):
                states[batch.step + 1] = p.state_dict()
                if batch.step + 1 == args.far:
                    break
        run_s = time.perf_counter() - start
        times = {}
        for step, state in states.items():
            q = pipeline(plan)
            t0 = time.perf_counter()
            q.load_state_dict(state)
            batch = next(iter(q))
            times[step] = (time.perf_counter() - t0) * 1000
            assert batch.step == step
        docs = json.loads((plan / "plan.json").read_text())["totals"]["documents"]
        print(
            f"{kind:10} {docs:>10,} {run_s:>13.1f} {times[10]:>13.1f} {times[args.far]:>14.1f} "
            f"{times[args.far] / times[10]:>9.2f}"
        )


if __name__ == "__main__":
    main()
