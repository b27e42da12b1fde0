"""Replayable adaptive mixing (``zephon.adaptive``): weights decided at run time every K steps become plan
segments, and the final plan replays every batch of the adaptive run without calling the callback."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from zephon import Pipeline
from zephon.adaptive import AdaptiveMixing
from zephon.errors import ConfigError
from zephon.inspection.audit import AuditSpec, audit_plan
from zephon.inspection.sql import run_sql
from zephon.io import Dataset
from zephon.plan.manifest import read_manifest
from zephon.work import MixtureSpec, StaticMixtureWorkSource

MAX_LENGTH = 33
GLOBAL = 8


def make(tokenizer_dir: str) -> callable:
    def pipeline(plan: Path) -> Pipeline:
        return (
            Pipeline.from_plan(plan)
            .tokenize(tokenizer_id=tokenizer_dir)
            .pack_flat(max_length=MAX_LENGTH)
            .batch(microbatch_size=GLOBAL // 2, global_batch_size=GLOBAL)  # 2 microbatches a step
        )

    return pipeline


def hashes(batches) -> dict[int, str]:
    rows: dict[int, dict[int, bytes]] = {}
    for batch in batches:
        for i, j in enumerate(batch.sequences.tolist()):
            rows.setdefault(batch.step, {})[j] = batch.tokens[i, : batch.lengths[i]].tobytes()
    return {s: hashlib.sha256(b"".join(r[j] for j in sorted(r))).hexdigest() for s, r in rows.items()}


def test_adaptive_weights_become_segments_and_the_final_plan_replays_the_run(tmp_path, tokenizer_dir) -> None:
    from zephon.demo import write_demo_dataset

    os.environ.setdefault("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    write_demo_dataset(tmp_path / "data")
    names = ("prose", "code", "short")
    datasets = [Dataset.from_path(n, str(tmp_path / "data" / "demo" / f"{n}-*.parquet")) for n in names]
    source = StaticMixtureWorkSource(
        datasets=datasets, mixture=MixtureSpec({"prose": 0.5, "code": 0.3, "short": 0.2}), seed=9, num_documents=900
    )
    first = source.plan(tmp_path / "plan-0")
    decided: dict[int, dict[str, float]] = {}
    choices = [{"prose": 0.1, "code": 0.1, "short": 0.8}, {"prose": 0.2, "code": 0.7, "short": 0.1}]

    def decide(step: int) -> dict[str, float]:  # stands for a decision from validation losses
        decided[step] = choices[len(decided) % 2]
        return decided[step]

    run = AdaptiveMixing(
        source=source, plan=first, make_pipeline=make(tokenizer_dir), decide=decide, every=30, out_dir=tmp_path / "out"
    )
    adaptive = hashes(run)
    calls = list(decided)
    assert calls[:3] == [30, 60, 90] and len(run.plans) == len(calls) + 1
    final = run.plans[-1]
    # The replay: a plain pipeline over the final plan, no callback.
    replay = hashes(make(tokenizer_dir)(final))
    assert replay == adaptive and list(decided) == calls
    # Segments in order; a decision overtaken before any document of it was placed (an estimated plan's lanes
    # still held earlier documents at the next decision) leaves no segment.
    lineage = read_manifest(final).lineage
    steps = [s.first_step for s in lineage.segments]
    assert steps[0] == 0 and set(steps[1:]) <= set(calls) and steps == sorted(steps) and len(steps) > 3
    # Each segment is audited against the weights decided for it.
    result = audit_plan(final, AuditSpec(batch_size=GLOBAL, window=10, tolerance_pp=100))
    assert [p.segment for p in result.phases] == list(range(len(steps)))
    for phase, step in zip(result.phases, steps, strict=True):
        want = decided.get(step, {"prose": 0.5, "code": 0.3, "short": 0.2})
        assert [round(d.target, 3) for d in phase.datasets] == [want[n] for n in names]
    rows = run_sql(final, "SELECT segment, first_step FROM segments ORDER BY segment").rows
    assert rows == list(enumerate(steps))
    with pytest.raises(ConfigError, match="every must be an integer ≥ 1"):
        AdaptiveMixing(source=source, plan=first, make_pipeline=make(tokenizer_dir), decide=decide, every=0,
                       out_dir=tmp_path / "x")  # fmt: skip
