"""No silent shortfalls: a budget not met and heavy repetition are recorded in plan.json ``warnings`` and issued
as ``zephon.PlanWarning`` (``zephon.planner.shortfalls``); the stop rule ends the plan before any pass beyond
the epochs budget."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import write_parquet_dataset

import zephon
from zephon import Pipeline
from zephon.errors import PlanWarning, ZephonWarning
from zephon.io import Dataset
from zephon.plan.manifest import read_manifest
from zephon.planner.shortfalls import REPETITION_LIMIT
from zephon.specs import TokenizeSpec
from zephon.work import MixtureSpec, Phase, StaticMixtureWorkSource, TokenEstimation


@pytest.fixture
def ab(tmp_path: Path) -> dict[str, Path]:
    """a with 2 documents, b with 3 (the worked example of zephon.planner.layout)."""
    return {"a": write_parquet_dataset(tmp_path, "a", [2]), "b": write_parquet_dataset(tmp_path, "b", [3])}


def source(paths: dict[str, Path], weights: dict[str, float] | None = None, **kw) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path(name, str(p)) for name, p in paths.items()],
        mixture=MixtureSpec(weights or dict.fromkeys(paths, 1 / len(paths))),
        seed=0,
        **kw,
    )


def plan_quietly(src: StaticMixtureWorkSource, out: Path, **kw) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        src.plan(out, **kw)
    return json.loads((out / "plan.json").read_text(encoding="utf-8"))


def epochs_of(plan: Path) -> list[int]:
    return pq.read_table(plan / "samples.parquet", columns=["epoch"]).column(0).to_pylist()


# ---------------------------------------------------------------- budget not met


def test_stop_with_a_documents_budget_records_the_shortfall(ab, tmp_path) -> None:
    m = plan_quietly(source(ab, num_documents=100, on_exhaustion="stop"), tmp_path / "p")
    assert m["totals"]["documents"] == 4
    (entry,) = m["warnings"]
    message = entry.pop("message")
    assert entry == {
        "kind": "budget_not_met",
        "dataset": "a",
        "budget": "num_documents",
        "requested": 100,
        "planned": 4,
    }
    assert message == (
        "budget not met: num_documents 100 asked, 4 planned — on_exhaustion stop ended the plan before dataset 'a' "
        "(2 documents) would start pass 2; add data, lower num_documents, or set on_exhaustion to new_epoch to "
        "repeat datasets"
    )


def test_stop_with_the_default_epochs_budget_ends_before_any_second_pass_and_records_it(ab, tmp_path) -> None:
    # The layout docstring's example: a starts its second pass at position 4, so "stop" ends the plan there (it
    # used to run to 6 positions when a dataset listed first ran out before a later one completed its pass).
    m = plan_quietly(source(ab, on_exhaustion="stop"), tmp_path / "p")
    assert epochs_of(tmp_path / "p") == [0, 0, 0, 0]
    (entry,) = m["warnings"]
    assert {k: entry[k] for k in ("kind", "dataset", "budget", "requested")} == {
        "kind": "budget_not_met",
        "dataset": "a",
        "budget": "epochs",
        "requested": 1,
    }
    assert entry["planned"] == pytest.approx(2 / 3)  # b read 2 of its 3 documents
    assert "epochs 1 asked of every dataset, 0.67 passes planned of dataset 'b'" in entry["message"]


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_stop_with_an_epochs_budget_never_starts_a_pass_beyond_it_whatever_the_dataset_order(
    ab, tmp_path, order
) -> None:
    paths = {name: ab[name] for name in order}
    m = plan_quietly(source(paths, epochs=2, on_exhaustion="stop"), tmp_path / "p")
    assert max(epochs_of(tmp_path / "p")) == 1
    planned = {d["name"]: d["planned_documents"] for d in m["datasets"]}
    # a completed its 2 passes; the plan ends just before a's 5th document (b goes first on ties when listed first)
    assert planned == {"a": 4, "b": 4 if order[0] == "a" else 5}
    assert m["warnings"][0]["budget"] == "epochs" and m["warnings"][0]["dataset"] == "a"


def test_a_token_budget_not_met_is_recorded_in_tokens(tmp_path, tokenizer_dir) -> None:
    paths = {"a": write_parquet_dataset(tmp_path, "a", [3]), "b": write_parquet_dataset(tmp_path, "b", [6])}
    src = source(paths, token_estimation=TokenEstimation(primer="measure"), num_tokens=10**6, on_exhaustion="stop")
    m = plan_quietly(src, tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir))
    (entry,) = m["warnings"]
    assert entry["kind"] == "budget_not_met" and entry["budget"] == "num_tokens"
    assert entry["requested"] == 10**6 and entry["planned"] == m["totals"]["tokens"] < 10**6
    assert f"num_tokens 1000000 asked, {m['totals']['tokens']} (estimated) planned" in entry["message"]


def test_phases_that_stop_early_record_the_documents_budget(ab, tmp_path) -> None:
    phases = [Phase(start=0.5, mixture=MixtureSpec({"a": 0.1, "b": 0.9}))]
    m = plan_quietly(source(ab, num_documents=50, on_exhaustion="stop", phases=phases), tmp_path / "p")
    (entry,) = m["warnings"]
    assert (entry["budget"], entry["requested"], entry["planned"]) == ("num_documents", 50, m["totals"]["documents"])


# ---------------------------------------------------------------- repetition


def test_heavy_repetition_is_recorded_per_dataset_beyond_the_limit(ab, tmp_path) -> None:
    big = write_parquet_dataset(tmp_path, "big", [40])
    m = plan_quietly(source({**ab, "big": big}, {"a": 0.2, "b": 0.2, "big": 0.6}), tmp_path / "p")
    # Until big completes its pass (~67 positions): a and b get ~13 documents each, 6.7 and 4.4 passes.
    repeated = {e["dataset"]: e for e in m["warnings"]}
    assert sorted(repeated) == ["a", "b"] and all(e["kind"] == "repetition" for e in repeated.values())
    planned = {d["name"]: d["planned_documents"] for d in m["datasets"]}
    a = repeated["a"]
    assert a["passes"] == planned["a"] / 2 and a["epochs"] == 1 and a["limit"] == REPETITION_LIMIT
    assert a["message"] == (
        f"heavy repetition: dataset 'a' is planned for {planned['a'] / 2:.2f} passes ({planned['a']} documents of "
        f"2), more than {REPETITION_LIMIT} × its epochs budget 1 — add data to it, lower its weight, or set "
        "on_exhaustion to stop"
    )


def test_the_limit_scales_with_the_epochs_budget_so_an_epochs_plan_warns_by_its_mixture_alone(ab, tmp_path) -> None:
    big = write_parquet_dataset(tmp_path, "big", [20])
    weights = {"a": 0.25, "b": 0.25, "big": 0.5}
    # Every pass count grows with the epochs budget E, and so does the limit (4 × E): a is read 5 × E times
    # (warned), b 3.33 × E times (not), for any E.
    for epochs in (1, 2, 3):
        m = plan_quietly(source({**ab, "big": big}, weights, epochs=epochs), tmp_path / f"e{epochs}")
        assert [(e["dataset"], e["passes"], e["limit"]) for e in m["warnings"]] == [("a", 5.0 * epochs, 4 * epochs)]


def test_a_plan_within_its_budget_has_an_empty_warnings_list(ab, tmp_path) -> None:
    m = plan_quietly(source(ab, num_documents=5), tmp_path / "p")
    assert m["warnings"] == []
    assert read_manifest(tmp_path / "p").warnings == ()


@pytest.mark.parametrize("stop", [False, True])
def test_the_manifest_reads_the_warnings_as_written(ab, tmp_path, stop) -> None:
    kw = {"on_exhaustion": "stop"} if stop else {}
    raw = plan_quietly(source(ab, num_documents=100, **kw), tmp_path / "p")["warnings"]
    entries = read_manifest(tmp_path / "p").warnings
    assert len(raw) == len(entries) == (1 if stop else 2)
    for entry, written in zip(entries, raw, strict=True):
        typed = {k: v for k, v in dataclasses.asdict(entry).items() if v is not None}
        assert typed == written and all(type(typed[k]) is type(written[k]) for k in written)
    if not stop:
        assert [(e.kind, e.dataset, e.passes, e.limit) for e in entries] == [
            ("repetition", "a", 25.0, 4),
            ("repetition", "b", pytest.approx(50 / 3), 4),
        ]


# ---------------------------------------------------------------- Python: zephon.PlanWarning


def test_planning_issues_each_warning_as_a_plan_warning_at_the_callers_line(ab, tmp_path) -> None:
    assert issubclass(zephon.PlanWarning, ZephonWarning) and issubclass(ZephonWarning, UserWarning)
    with pytest.warns(PlanWarning) as got:
        source(ab, num_documents=100, on_exhaustion="stop").plan(tmp_path / "p")
    assert [str(w.message) for w in got] == [
        e["message"] for e in json.loads((tmp_path / "p/plan.json").read_text())["warnings"]
    ]
    assert all(w.filename == __file__ for w in got)  # attributed to the caller, not to Zephon's code


def test_plan_warnings_can_be_made_errors(ab, tmp_path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        with pytest.raises(PlanWarning, match="budget not met: num_documents 100 asked, 4 planned"):
            source(ab, num_documents=100, on_exhaustion="stop").plan(tmp_path / "p")


def test_a_pipeline_warns_when_it_opens_a_plan_with_warnings(ab, tmp_path) -> None:
    plan_quietly(source(ab, num_documents=100), tmp_path / "p")
    with pytest.warns(PlanWarning) as got:
        Pipeline.from_plan(tmp_path / "p")
    assert [str(w.message)[:34] for w in got] == [
        "heavy repetition: dataset 'a' is p",
        "heavy repetition: dataset 'b' is p",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan_quietly(source(ab, num_documents=5), tmp_path / "quiet")
        Pipeline.from_plan(tmp_path / "quiet")  # no warnings: nothing issued


def test_a_pipeline_over_a_work_source_warns_whether_it_plans_or_finds_the_plan_cached(ab, tokenizer_dir) -> None:
    def first_batch() -> None:
        pipe = (
            Pipeline(source(ab, num_documents=100))
            .tokenize(tokenizer_id=tokenizer_dir)
            .pack_flat(max_length=16)
            .batch(microbatch_size=1)
        )
        next(iter(pipe))

    for _ in range(2):  # planned now, then found in the cache
        with pytest.warns(PlanWarning) as got:
            first_batch()
        assert [str(w.message).split(":")[0] for w in got] == ["heavy repetition", "heavy repetition"]


def test_the_plan_is_a_prefix_of_the_new_epoch_plan(ab, tmp_path) -> None:
    """Stopping changes only where the plan ends, never what comes before."""
    plan_quietly(source(ab, on_exhaustion="stop"), tmp_path / "stop")
    plan_quietly(source(ab), tmp_path / "new")
    stop = pq.read_table(tmp_path / "stop" / "samples.parquet").to_pydict()
    new = pq.read_table(tmp_path / "new" / "samples.parquet").to_pydict()
    n = len(stop["position"])
    assert n == 4 and all(stop[k] == new[k][:n] for k in ("dataset_id", "shard_id", "row", "epoch"))
    assert np.array_equal(stop["position"], np.arange(n))
