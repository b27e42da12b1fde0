"""Operators' cost: a plain pipeline against itself with user operators, chat tokenization, and an older Zephon.

Run: python benchmarks/bench_operators.py [--copies 2] [--repeats 3] [--base DIR ...] [--plain-only]

Corpus: ``--copies`` seeds of the demo corpus (prose / code / short documents), one estimated plan by samples;
tokenizer: the demo tokenizer; max_length 2049, microbatch 8. Each measurement is a fresh subprocess that
runs ``Pipeline.from_plan(...)…`` to the end, calling ``to_training(return_labels=True)`` on every batch, and
reports tokens per second; figures are the best of ``--repeats`` (runs interleaved, so all see the same load):

* ``plain``: ``tokenize().pack_flat().batch()`` — the baseline every ratio is against;
* ``identity map_transform``: the same with ``map_transform(lambda r: r)`` (records built, operator run, check);
* ``dropping map_transform``: dropping every other record by its length (half the tokens: per-token ratio);
* ``tokenize_chat``: each document as a two-turn conversation (first half user, rest assistant) rendered with
  a ChatML template, loss mask by prefix diffing, plus ``return_loss_mask`` / ``num_valid_tokens``;
* ``--base DIR``: ``plain`` again with ``PYTHONPATH=DIR`` — an older Zephon installed there with
  ``pip install --no-deps --target DIR SRC`` (e.g. the commit before operators, from ``git archive``): the
  no-operator path must cost the same. Several ``--base`` directories alternate with the rest (e.g. this commit
  installed the same way, to separate an installed copy from the editable checkout). ``--plain-only`` runs
  just ``plain`` and the bases, alternating, so more repeats fit in the same time.
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

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CHILD = r"""
import json, sys, time
from zephon import Pipeline
from zephon.demo import demo_tokenizer_path
import zephon
print(zephon.__file__, file=sys.stderr)
plan, kind, template = sys.argv[1], sys.argv[2], sys.argv[3]
p = Pipeline.from_plan(plan)
tok = demo_tokenizer_path()
if kind == "identity":
    p = p.map_transform(lambda r: r)
elif kind == "dropping":
    p = p.map_transform(lambda r: r if len(r["text"]) % 2 else None)
if kind == "chat":
    p = p.tokenize_chat(tokenizer_id=tok, chat_template=template)
else:
    p = p.tokenize(tokenizer_id=tok)
p = p.pack_flat(max_length=2049).batch(microbatch_size=8)
start, tokens = time.perf_counter(), 0
for batch in p:
    extra = {"return_loss_mask": True, "return_num_valid_tokens": True} if kind == "chat" else {}
    t = batch.to_training(return_labels=True, **extra)
    tokens += int(batch.lengths.sum())
print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - start}))
"""


def chat_copy(src: Path, dst: Path) -> None:
    """The demo shards as conversations: first half of each text from the user, the rest from the assistant."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for shard in sorted(src.glob("*.parquet")):
        texts = pq.read_table(shard, columns=["text"])["text"].to_pylist()
        rows = [
            {
                "messages": [
                    {"role": "user", "content": t[: len(t) // 2]},
                    {"role": "assistant", "content": t[len(t) // 2 :] or "."},
                ]
            }
            for t in texts
        ]
        dst.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), dst / shard.name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--base", type=Path, action="append", default=[])
    parser.add_argument(
        "--plain-only", action="store_true", help="only plain (and --base): the no-operator path against the base"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # demo_grammar: demo corpora of any seed
    from demo_grammar import write_demo_dataset

    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    root = Path(tempfile.mkdtemp(prefix="zephon-bench-ops-"))
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    names = []
    for seed in range(args.copies):
        write_demo_dataset(root / f"data{seed}", seed=seed)
        names.append(root / f"data{seed}" / "demo")
    datasets = [Dataset.from_path(f"d{i}", str(p / "*.parquet")) for i, p in enumerate(names)]
    weights = {f"d{i}": 1 / len(names) for i in range(len(names))}
    plain = StaticMixtureWorkSource(datasets=datasets, mixture=MixtureSpec(weights), seed=1).plan(root / "plain")
    for i, p in enumerate(names):
        chat_copy(p, root / f"chat{i}")
    chat_sets = [Dataset.from_path(f"d{i}", str(root / f"chat{i}" / "*.parquet")) for i in range(len(names))]
    chat = StaticMixtureWorkSource(datasets=chat_sets, mixture=MixtureSpec(weights), seed=1).plan(root / "chat")
    runs = [
        ("plain", plain, "plain", None),
        ("identity map_transform", plain, "identity", None),
        ("dropping map_transform", plain, "dropping", None),
        ("tokenize_chat", chat, "chat", None),
    ]
    if args.plain_only:
        runs = runs[:1]
    for base in args.base:
        runs.append((f"plain, {base}", plain, "plain", str(base)))
    best: dict[str, float] = {}
    every: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, plan, kind, base in runs:
            env = dict(os.environ)
            if base is not None:
                env["PYTHONPATH"] = base
            out = subprocess.run(  # cwd: not the checkout, whose zephon/ would shadow PYTHONPATH's
                [sys.executable, "-c", CHILD, str(plan), kind, CHATML],
                cwd=root,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            got = json.loads(out.strip().splitlines()[-1])
            best[name] = max(best.get(name, 0.0), got["tokens"] / got["seconds"])
            every.setdefault(name, []).append(got["tokens"] / got["seconds"])
    reference = best["plain"]
    print(f"cores: {len(os.sched_getaffinity(0))}, copies: {args.copies}, best of {args.repeats}")
    for name, rate in best.items():
        runs_of = " ".join(f"{r / 1e6:.2f}" for r in every[name])
        median = statistics.median(every[name]) / statistics.median(every["plain"])
        print(
            f"{name:24s} {rate / 1e6:8.2f} M tokens/s   {rate / reference:5.2f} × plain (best), "
            f"{median:5.2f} × (median)   runs: {runs_of}"
        )


if __name__ == "__main__":
    main()
