"""Format-1 bundles (before the deal column) run: their ``lane`` column is the deal modulo the plan's fixed
lanes, so the executor packs them exactly as a format-2 plan with those fixed lanes (``zephon.plan.format``).

The format-1 bundle is derived from a format-2 plan made with ``lanes=8`` as the format-1 writer wrote it
(commit b3a9a7b's parent): ``samples.parquet`` with ``lane`` (int16, deal mod 8) in place of ``deal``,
``format_version`` 1 in plan.json and in its config (so another config hash), sealed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from zephon import Pipeline
from zephon.errors import PlanFormatError
from zephon.io import Dataset
from zephon.plan.integrity import INTEGRITY_KEY, config_digest
from zephon.planner.build import seal_bundle
from zephon.work import MixtureSpec, StaticMixtureWorkSource

MAX_LENGTH = 33
GLOBAL = 8


def as_format_1(plan: Path, out: Path) -> Path:
    shutil.copytree(plan, out)
    table = pq.read_table(out / "samples.parquet")
    lane = pc.cast(pc.bit_wise_and(table.column("deal"), pa.scalar(7, pa.int64())), pa.int16())  # deal mod 8
    table = table.set_column(table.schema.get_field_index("deal"), pa.field("lane", pa.int16()), lane)
    pq.write_table(table, out / "samples.parquet", row_group_size=65_536)
    data = json.loads((out / "plan.json").read_text())
    data.pop(INTEGRITY_KEY)
    data["format_version"] = data["config"]["format_version"] = 1
    data["config_hash"] = config_digest(data["config"])
    (out / "plan.json").write_text(json.dumps(data, indent=2))
    seal_bundle(out)
    return out


def pipeline(plan: Path, tokenizer_dir: str, *, rank: int = 0, size: int = 1) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .options(dp_rank=rank, dp_size=size)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=GLOBAL // size, global_batch_size=GLOBAL)
    )


def state_after(plan: Path, tokenizer_dir: str, step: int) -> dict:
    """The run's state once it has yielded step ``step`` (one rank)."""
    pipe = pipeline(plan, tokenizer_dir)
    for batch in pipe:
        if batch.step == step:
            break
    return pipe.state_dict()


def run(plan: Path, tokenizer_dir: str, *, rank: int = 0, size: int = 1, state=None) -> dict[int, str]:
    pipe = pipeline(plan, tokenizer_dir, rank=rank, size=size)
    if state is not None:
        pipe.load_state_dict(state)
    out = {}
    for batch in pipe:
        out[(batch.step, batch.microbatch)] = hashlib.sha256(
            batch.tokens.tobytes() + batch.sequences.tobytes() + batch.lengths.tobytes()
        ).hexdigest()
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> tuple[Path, Path]:
    from zephon.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("format1")
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    write_demo_dataset(root / "data")
    datasets = [Dataset.from_path(n, str(root / "data" / "demo" / f"{n}-*.parquet")) for n in ("prose", "code")]
    source = StaticMixtureWorkSource(
        datasets=datasets, mixture=MixtureSpec({"prose": 0.6, "code": 0.4}), seed=3, num_documents=600, lanes=8
    )
    two = source.plan(root / "format-2")
    return two, as_format_1(two, root / "format-1")


def test_a_format_1_bundle_yields_the_batches_of_its_fixed_lanes(plans, tokenizer_dir) -> None:
    two, one = plans
    assert json.loads((one / "plan.json").read_text())["format_version"] == 1
    assert pq.read_schema(one / "samples.parquet").field("lane").type == pa.int16()
    expected = run(two, tokenizer_dir)
    assert len(expected) > 20 and run(one, tokenizer_dir) == expected
    # At dp 2 and 4 (ranks in turn), the same global batches; num_steps as the format-2 plan's.
    for size in (2, 4):
        got = [run(one, tokenizer_dir, rank=r, size=size) for r in range(size)]
        want = [run(two, tokenizer_dir, rank=r, size=size) for r in range(size)]
        assert got == want
    assert pipeline(one, tokenizer_dir).num_steps() == max(s for s, _ in expected) + 1


def test_a_format_1_state_resumes_and_other_versions_are_refused(plans, tokenizer_dir, tmp_path) -> None:
    _, one = plans
    full = run(one, tokenizer_dir)
    state = state_after(one, tokenizer_dir, 4)
    assert run(one, tokenizer_dir, state=state) == {k: v for k, v in full.items() if k[0] >= 5}
    bad = tmp_path / "future"
    shutil.copytree(one, bad)
    data = json.loads((bad / "plan.json").read_text())
    data["format_version"] = 3
    (bad / "plan.json").write_text(json.dumps(data))
    with pytest.raises(PlanFormatError, match=r"plan format version must be 2, got 3 in .* — re-plan"):
        next(iter(Pipeline.from_plan(bad).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=MAX_LENGTH)))


def test_a_format_1_plan_json_over_format_2_samples_is_one_line(plans, tmp_path) -> None:
    two, _ = plans
    mixed = tmp_path / "mixed"
    shutil.copytree(two, mixed)
    data = json.loads((mixed / "plan.json").read_text())
    data["format_version"] = 1
    (mixed / "plan.json").write_text(json.dumps(data))
    seal_bundle(mixed)
    with pytest.raises(PlanFormatError, match=r"samples.parquet must have the column 'lane' \(int16\), got a file"):
        Pipeline.from_plan(mixed).num_steps()


def test_a_format_1_plan_is_continued_with_its_fixed_lanes(plans, tokenizer_dir, tmp_path) -> None:
    _, one = plans
    state = state_after(one, tokenizer_dir, 5)
    root = Path(json.loads((one / "plan.json").read_text())["datasets"][0]["path"]).parent
    datasets = [Dataset.from_path(n, str(root / f"{n}-*.parquet")) for n in ("prose", "code")]
    new = StaticMixtureWorkSource(
        datasets=datasets, mixture=MixtureSpec({"prose": 0.2, "code": 0.8}), seed=3, num_documents=1000, lanes=8
    )
    child = new.plan(tmp_path / "child", continue_from=one, state=state)
    old, got = run(one, tokenizer_dir), run(child, tokenizer_dir)
    assert [got[(s, 0)] for s in range(6)] == [old[(s, 0)] for s in range(6)]
    resumed = run(child, tokenizer_dir, state=state)
    assert resumed == {k: v for k, v in got.items() if k[0] >= 6}
