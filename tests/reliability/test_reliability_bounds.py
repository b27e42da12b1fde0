"""Sanity bounds, refused in one line before any work: a bundle that cannot fit on its disk, a row or
microbatch whose buffers cannot be allocated (docs/reliability.md)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from zephon.cli import cli
from zephon.errors import ConfigError
from zephon.executor.settings import ExecutorSpec
from zephon.specs import BatchSpec, PackSpec, TokenizeSpec


def test_a_plan_of_10_to_the_12_documents_is_refused_before_any_layout(make_parquet, tmp_path) -> None:
    data = make_parquet("web", [5])
    config = tmp_path / "plan.yaml"
    config.write_text(
        f"seed: 3\nnum_documents: {10**12}\ndatasets:\n  - name: web\n    path: {data}\nmixture: {{web: 1.0}}\n",
        encoding="utf-8",
    )
    out = tmp_path / "plan"
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(out)])
    assert result.exit_code == 1
    assert re.fullmatch(
        rf"zephon: error: the plan bundle must fit on the disk of {out}, got about 3725\.3 GiB needed for "
        r"1000000000000 documents \(≥ 4 bytes each\) and [\d.]+ GiB free — lower num_documents or epochs, free space, or "
        r"write the plan to another disk\n",
        result.output,
    ), result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "plan.yaml"]  # nothing written, no temporary


def test_max_length_is_bounded_where_contexts_of_2_to_the_20_remain_fine() -> None:
    assert PackSpec(max_length=2**20 + 1).max_length == 2**20 + 1
    with pytest.raises(ConfigError, match=r"^max_length must be ≤ 16777216 \(2\^24 tokens a row: .*got 1000000000 — "):
        PackSpec(max_length=10**9)


def test_a_microbatch_whose_buffers_cannot_fit_in_memory_is_refused(tokenizer_dir) -> None:
    tokenize = TokenizeSpec(tokenizer_id=tokenizer_dir)
    fine = ExecutorSpec(tokenize=tokenize, pack=PackSpec(max_length=2**20 + 1), batch=BatchSpec(microbatch_size=1))
    assert fine.pack.max_length == 2**20 + 1
    with pytest.raises(
        ConfigError,
        match=r"^microbatch_size × max_length must fit in half this machine's .* GiB of "
        r"memory, got 1000000 × 16777216 tokens needing .* GiB of batch buffers — lower",
    ):
        ExecutorSpec(tokenize=tokenize, pack=PackSpec(max_length=2**24), batch=BatchSpec(microbatch_size=10**6))


def test_the_room_estimate_is_a_lower_bound_for_every_budget(make_parquet, tmp_path) -> None:
    """Epochs count passes of the smallest dataset's selected rows; a selection is not one pass of all rows."""
    from zephon.io import Dataset
    from zephon.planner.prepare import prepare
    from zephon.planner.room import planned_documents
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    data = make_parquet("web", [5, 7])  # 12 rows
    web = Dataset.from_path("web", data)
    picked = Dataset.from_path("picked", data, where="id LIKE '%-1'")  # rows 1 of each shard: 2 rows

    def documents(*datasets, **budget) -> int:
        weights = MixtureSpec({d.name: 1.0 for d in datasets})
        source = StaticMixtureWorkSource(datasets=list(datasets), mixture=weights, seed=1, **budget)
        return planned_documents(prepare(source))

    assert documents(web) == 12 and documents(web, epochs=3) == 36 and documents(web, num_documents=5) == 5
    assert documents(picked, epochs=2) == 4 and documents(web, picked, epochs=10**12) == 2 * 10**12
    config = tmp_path / "plan.yaml"
    config.write_text(f"seed: 3\nepochs: {10**12}\ndatasets:\n  - name: web\n    path: {data}\nmixture: {{web: 1.0}}\n")
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "plan")])
    assert (
        result.exit_code == 1
        and f"got about {48 * 10**12 / 2**30:.1f} GiB needed for 12000000000000 documents" in result.output
    )
