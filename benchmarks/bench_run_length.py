"""How far an estimated run's length lands from its data: ``num_steps()`` against the longest lane's real rows.

Run: python benchmarks/bench_run_length.py [--tokenizer deepseek-v4|cl100k-converter] [--root DIR]
         [--tokens-per-copy 24000000] [--documents-per-copy 24000] [--plans samples,tokens] [--lanes 8,64,256,1024]

Same corpus and plans as ``bench_hotpath.py`` (``--text local``: real text from this machine's files — code files
of up to 10^5 tokens, prose, short texts — mixed 0.5/0.3/0.2; ``--root`` reuses what an earlier run built). Every
document of the plan is tokenized once, through a run's own shard reader and encoder, so each lane's real tokens
are known for each lane count ``L`` (= the global batch ``G``, one row a lane a step; rows of ``max_length``
2,048). Per plan and ``L`` it prints:

* ``ideal``: the longest lane's real rows — the fewest steps that lose nothing; every step past it is padding
  alone in every row;
* ``now``: the steps ``zephon.executor.pack.run_length`` gives (its calibration of this plan, ratios by dataset, a
  spread relative to each document's size, ``z_L``), and ``prev``: the rule before the twenty-seventh session,
  computed in the same run from the same tokens (the first 2,048 documents, one pooled ratio, 3σ a lane) — each as
  steps, their ratio to ``ideal``, and the lanes that would end with tokens left (``cut``: data lost, warned of);
* ``fill``: real tokens ÷ the tokens the rows hold, for ``now``.

Then the wall time of ``Pipeline.num_steps()`` at ``L = 8`` (the calibration every rank pays before its first
batch), now and with the previous calibration's size (``CALIBRATION_UNITS`` and ``LATE_DOCUMENTS`` 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MAX_LENGTH = 2048


def previous_steps(lanes: np.ndarray, documents: np.ndarray, real: np.ndarray, units: np.ndarray) -> int:
    """The rule before: one ratio r over the calibration's documents, margin 3·√(own + calibration) a lane."""
    ratio = real.sum() / units.sum()
    var = np.mean((real - ratio * units) ** 2)
    tokens = lanes * ratio
    own = np.divide(documents * var, tokens**2, out=np.zeros_like(tokens), where=tokens > 0)
    calibration = len(real) * var / (ratio * units.sum()) ** 2
    margin = np.maximum(0.01, 3 * np.sqrt(own + calibration))
    return int(np.ceil((1 + margin) * tokens / MAX_LENGTH).max())  # G = L: a step is a row of every lane


def measure(plan: Path, tokenizer: str, lane_counts: list[int]) -> None:
    from zephon import Pipeline
    from zephon.executor.encode.slices import encode_in_slices
    from zephon.executor.pack import calibration, run_length
    from zephon.executor.plan_reader import PlanBundle

    def pipeline() -> Pipeline:
        return Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer).pack_flat(max_length=MAX_LENGTH)

    bundle = PlanBundle(plan)
    runner = pipeline().batch(microbatch_size=8)._make_runner()
    access = runner._shards()
    groups = list(run_length.plan_rows(bundle))
    deal, sid, row = (np.concatenate([getattr(g, k) for g in groups]) for k in ("deal", "shard_id", "row"))
    real = np.zeros(len(deal), dtype=np.int64)
    started = time.perf_counter()
    for k in range(0, len(deal), 4096):
        texts = access.calibration_texts(sid[k : k + 4096], row[k : k + 4096])
        real[k : k + 4096] = encode_in_slices(runner.encoder, texts).sizes
    seconds = time.perf_counter() - started
    print(f"{plan.name}: {len(deal):,} documents, {real.sum():,} tokens (tokenized in {seconds:.1f} s)")
    capacity = access.reader.capacity
    datasets = len(bundle.dataset_names)
    now = calibration.calibration_documents(bundle, max_shards=capacity)
    late, calibration.LATE_DOCUMENTS = calibration.LATE_DOCUMENTS, 0  # the rule before: its first 2,048 alone
    before = calibration.calibration_documents(bundle, max_shards=capacity, units=0)
    calibration.LATE_DOCUMENTS = late

    def tokens_of(documents: calibration.Calibration) -> np.ndarray:
        return encode_in_slices(runner.encoder, access.calibration_texts(documents.shard_id, documents.row)).sizes

    now_real, before_real = tokens_of(now), tokens_of(before)
    ratios = run_length.Ratios.measure(now_real, now.units, now.dataset, datasets)
    print(f"  calibration: now {len(now.row):,} documents ({now.units.sum():,} units), before {len(before.row):,}")
    for lanes in lane_counts:
        units = run_length.lane_units(bundle, lanes)
        per_lane = np.bincount(deal % lanes, real, lanes)
        ideal = int(np.ceil(per_lane.max() / MAX_LENGTH))
        steps = run_length.estimated_steps(units, ratios, MAX_LENGTH, global_batch=lanes, drop_last=False)
        prev = previous_steps(units.units.sum(axis=1), units.documents.sum(axis=1), before_real, before.units)
        cut_now = int((per_lane > steps * MAX_LENGTH).sum())
        cut_prev = int((per_lane > prev * MAX_LENGTH).sum())
        fill = per_lane.sum() / (steps * lanes * MAX_LENGTH)
        print(
            f"  L = {lanes:5}: ideal {ideal:6}, now {steps:6} ({steps / ideal:.3f} × ideal, cut {cut_now}), "
            f"prev {prev:6} ({prev / ideal:.3f}, cut {cut_prev}); fill now {fill:.3f}, "
            f"mean lane {per_lane.mean() / MAX_LENGTH:.1f} rows",
            flush=True,
        )
    access.close()
    settings = {"CALIBRATION_UNITS": calibration.CALIBRATION_UNITS, "LATE_DOCUMENTS": calibration.LATE_DOCUMENTS}
    for label, values in (("now", settings), ("previous size", dict.fromkeys(settings, 0))):
        for name, value in values.items():
            setattr(calibration, name, value)
        started = time.perf_counter()
        pipeline().batch(microbatch_size=8).num_steps()
        print(f"  num_steps() at L = 8, calibration {label}: {time.perf_counter() - started:.2f} s")
    for name, value in settings.items():
        setattr(calibration, name, value)


def listed(kind: type, allowed: tuple[str, ...] = ()) -> object:
    """An argparse type: a comma-separated list of ``kind`` (positive integers, or among ``allowed``)."""

    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",")]
        try:
            values = [kind(item) for item in items]
        except ValueError:
            values = []
        if not values or (allowed and set(values) - set(allowed)) or (kind is int and min(values) < 1):
            what = f"names among {', '.join(allowed)}" if allowed else "positive integers"
            raise argparse.ArgumentTypeError(f"must be {what} separated by commas, got {text!r}")
        return values

    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="deepseek-v4", choices=("deepseek-v4", "cl100k-converter"))
    parser.add_argument("--root", default=None)
    parser.add_argument("--plans", type=listed(str, ("samples", "tokens")), default="samples,tokens")
    parser.add_argument("--tokens-per-copy", type=int, default=24_000_000)
    parser.add_argument("--documents-per-copy", type=int, default=24_000)
    parser.add_argument("--lanes", type=listed(int), default="8,64,256,1024")
    args = parser.parse_args()
    import bench_executor

    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="zephon-bench-run-length-"))
    tokenizer, plans = bench_executor.local_setup(
        args.tokenizer, root, tokens_per_copy=args.tokens_per_copy, documents_per_copy=args.documents_per_copy
    )
    print(f"{args.tokenizer}, max_length {MAX_LENGTH}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for mode in args.plans:
        measure(plans[(mode, 1)], str(tokenizer), args.lanes)


if __name__ == "__main__":
    main()
