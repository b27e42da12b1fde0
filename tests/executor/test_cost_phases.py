"""Cost mixtures with phases, and continuations of cost plans (issue #28: record pipelines support phases and
continuation with costs as text does): phase starts in cost, ``pack_samples`` rows that never straddle a phase,
``zephon show``/``audit`` per phase, the CONFIG form; a child plan of a cost plan (packed or not) keeping its
parent's steps, replaying its rows, continuing its row numbering; resume and dp 1/2 across phases and the seam.

The data is ``test_record_costs``'s: img costs 12 7 6 9 5 10, txt costs 2 3 4 5 (read in file order)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from support.doc_blocks import run_block
from test_record_costs import IN_ORDER, PATCHES, _pack, bins_rows, column, packed, steps_of, write_data

from zephon import Pipeline
from zephon.cli import cli
from zephon.errors import ConfigError, PlanWarning
from zephon.io import Dataset
from zephon.planner.best_fit import pack
from zephon.work import MixtureSpec, Phase, StaticMixtureWorkSource

#: Phase 0 (img 1 : txt 1) until the costs reach 30, then phase 1 (img 1 : txt 3), 60 in all.
ANNEAL = Phase(start=30, unit="cost", mixture=MixtureSpec({"img": 1, "txt": 3}))
#: Phase 0 by cost shares (as test_record_costs' cost mixture): txt 2 3 4 | img 12 | txt 5 2 | img 7 — costs
#: 2 5 9 21 26 28 35: the sample of cost 7 crosses 30, so it ends phase 0. Phase 1 counts its shares from its
#: own start: txt finish times (3 4 5 2 3 4)/0.75 → 4 9.3 16 18.7 22.7 28, img (6 9)/0.25 → 24 60. The sample
#: that brings the costs to 62 ≥ 60 ends the plan.
PHASED_DATASETS = [1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1]
PHASED_COSTS = [2, 3, 4, 12, 5, 2, 7, 3, 4, 5, 2, 3, 6, 4]
#: Rows of at most 16: phase 0's rows are closed at position 7, so phase 1 opens its own (3 4 5 2 = 14; 3 6 4 = 13)
PHASED_ROWS = [[0, 1, 2, 4, 5], [3], [6], [7, 8, 9, 10], [11, 12, 13]]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("data"))


def cost_mix(data: Path, weights: dict[str, float], **options) -> StaticMixtureWorkSource:
    options.setdefault("shuffle", IN_ORDER)
    return StaticMixtureWorkSource(
        datasets=[
            Dataset.from_path("img", data / "img", cost=PATCHES),
            Dataset.from_path("txt", data / "txt", cost=PATCHES),
        ],
        mixture=MixtureSpec(weights),
        seed=5,
        mixture_unit="cost",
        **options,
    )


def phased(data: Path, **options) -> StaticMixtureWorkSource:
    return cost_mix(data, {"img": 1, "txt": 1}, num_cost=60, phases=[ANNEAL], **options)


@pytest.fixture(scope="module")
def phased_packed(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return phased(data).plan(tmp_path_factory.mktemp("phased") / "plan", sample_pack=_pack(16))


def manifest(plan: Path) -> dict:
    return json.loads((plan / "plan.json").read_text())


def test_a_phase_in_cost_starts_with_the_sample_after_the_costs_reach_its_start(data: Path, tmp_path: Path):
    plan = phased(data).plan(tmp_path / "p")
    assert column(plan, "dataset_id") == PHASED_DATASETS and column(plan, "tokens") == PHASED_COSTS
    phases = manifest(plan)["phases"]
    assert [(p["first_position"], p["end_position"], p["tokens"]) for p in phases] == [(0, 7, 35), (7, 14, 27)]
    assert phases[1]["start"] == {"start": 30, "unit": "cost", "global_batch_size": None}
    assert phases[1]["start_tokens"] == 30 and phases[1]["weights"] == {"img": 0.25, "txt": 0.75}
    assert [p["planned_tokens"] for p in phases] == [{"img": 19, "txt": 16}, {"img": 6, "txt": 21}]
    # A fraction of a num_cost budget is a start in cost: 0.5 × 60 = 30, the same plan.
    half = Phase(start=0.5, mixture=MixtureSpec({"img": 1, "txt": 3}))
    again = cost_mix(data, {"img": 1, "txt": 1}, num_cost=60, phases=[half]).plan(tmp_path / "f")
    assert (again / "samples.parquet").read_bytes() == (plan / "samples.parquet").read_bytes()
    # A start in documents (a plan position) works in a cost mixture too: position 7 is where cost 30 put it.
    at_7 = Phase(start=7, unit="documents", mixture=MixtureSpec({"img": 1, "txt": 3}))
    by_position = cost_mix(data, {"img": 1, "txt": 1}, num_cost=60, phases=[at_7]).plan(tmp_path / "d")
    assert (by_position / "samples.parquet").read_bytes() == (plan / "samples.parquet").read_bytes()


def test_packed_rows_never_straddle_a_phase_boundary(phased_packed: Path):
    assert column(phased_packed, "dataset_id") == PHASED_DATASETS
    assert bins_rows(phased_packed) == PHASED_ROWS  # one pass without the close: [6, 8, 9] shared a row
    packing = manifest(phased_packed)["sample_packing"]
    assert packing["rows"] == 5 and packing["closes"] == [{"position": 7}]


def test_a_phased_cost_plan_is_byte_identical_across_runs(data: Path, phased_packed: Path, tmp_path: Path):
    again = phased(data).plan(tmp_path / "again", sample_pack=_pack(16))
    for name in ("samples.parquet", "bins.parquet", "shards.parquet", "plan.json"):
        assert (again / name).read_bytes() == (phased_packed / name).read_bytes(), name


def test_a_phased_packed_plan_gives_the_same_steps_at_dp_1_and_2_and_after_resume_across_the_phase(
    phased_packed: Path,
):
    one = steps_of([packed(phased_packed, b=2, g=2)])
    assert {s: sorted(rows) for s, rows in one.items()} == {0: [0, 1], 1: [2, 3], 2: [4]}
    assert one[1] == {2: ["img-1"], 3: ["txt-1", "txt-2", "txt-3", "txt-0"]}  # phase 0's last row, phase 1's first
    two = steps_of([packed(phased_packed, rank=r, size=2, b=1, g=2) for r in range(2)])
    assert two == one
    first = packed(phased_packed, b=2, g=2)
    it = iter(first)
    next(it)
    state = first.state_dict()
    resumed = []
    for rank in range(2):
        pipe = packed(phased_packed, rank=rank, size=2, b=1, g=2)
        pipe.load_state_dict(state)
        resumed.append(pipe)
    assert steps_of(resumed) == {1: one[1], 2: one[2]}


def test_show_and_audit_report_each_phase_of_a_cost_plan(phased_packed: Path):
    shown = CliRunner().invoke(
        cli, ["show", str(phased_packed), "--step", "1", "--batch-size", "2", "--format", "json"]
    )
    assert shown.exit_code == 0, shown.output
    view = json.loads(shown.output)
    members = [(d["sequence"], d["position"], d["phase"], d["tokens"]) for d in view["documents"]]
    assert members == [(2, 6, 0, 7), (3, 7, 1, 3), (3, 8, 1, 4), (3, 9, 1, 5), (3, 10, 1, 2)]
    audit = CliRunner().invoke(cli, ["audit", str(phased_packed), "--batch-size", "1", "--window", "2", "--format",
                                     "json"])  # fmt: skip
    report = json.loads(audit.output)
    assert report["by"] == "cost"
    spans = [(p["first_position"], p["end_position"], p["first_step"], p["last_step"]) for p in report["phases"]]
    assert spans == [(0, 7, 0, 2), (7, 14, 3, 4)]  # rows 0–2 hold phase 0, rows 3–4 phase 1
    shares = [[d["overall_share"] for d in p["datasets"]] for p in report["phases"]]
    assert shares == [pytest.approx([19 / 35, 16 / 35]), pytest.approx([6 / 27, 21 / 27])]


def test_a_config_file_plans_cost_phases_like_the_python_api(data: Path, phased_packed: Path, tmp_path: Path):
    config = tmp_path / "phased.yaml"
    config.write_text(
        "seed: 5\n"
        "datasets:\n"
        f'  - {{name: img, path: {data / "img"}, cost: "{PATCHES}"}}\n'
        f'  - {{name: txt, path: {data / "txt"}, cost: "{PATCHES}"}}\n'
        "mixture: {img: 1, txt: 1}\n"
        "mixture_unit: cost\n"
        "num_cost: 60\n"
        "phases:\n"
        "  - {start: 30, unit: cost, mixture: {img: 1, txt: 3}}\n"
        "shuffle: {enabled: false}\n"
        "pack_samples: {max_cost: 16}\n"
    )
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "cfg")])
    assert result.exit_code == 0, result.output
    for name in ("samples.parquet", "bins.parquet"):
        assert (tmp_path / "cfg" / name).read_bytes() == (phased_packed / name).read_bytes()


def test_phase_units_must_match_the_mixture_unit(data: Path):
    with pytest.raises(ConfigError, match=r'phases of a cost mixture must start in unit="cost", .*got unit=.tokens'):
        cost_mix(data, {"img": 1, "txt": 1}, num_cost=60,
                 phases=[Phase(start=30, unit="tokens", mixture=MixtureSpec({"img": 1}))])  # fmt: skip
    with pytest.raises(ConfigError, match=r"phases in cost need a cost mixture, got mixture_unit=None"):
        StaticMixtureWorkSource(
            datasets=[Dataset.from_path("img", data / "img")], mixture=MixtureSpec({"img": 1}), seed=1,
            num_documents=4, phases=[Phase(start=3, unit="cost", mixture=MixtureSpec({"img": 1}))],
        )  # fmt: skip
    with pytest.raises(ConfigError, match=r"phases must come with a num_documents, num_tokens or num_cost budget"):
        cost_mix(data, {"img": 1, "txt": 1}, phases=[ANNEAL])


# Continuations. The parent: the cost mixture img 1 : txt 1 up to 60 — txt 2 3 4 | img 12 | txt 5 2 | img 7 | txt 3
# 4 | img 6 | txt 5 2 3 | img 9 (costs 2 5 9 21 26 28 35 38 42 48 53 55 58 67).
PARENT_DATASETS = [1, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0]
#: Its rows of at most 16 (test_record_costs' first 14 samples, cut at the budget).
PARENT_ROWS = [[0, 1, 2, 4, 5], [3, 7], [6, 8, 10], [9, 11, 12], [13]]


@pytest.fixture(scope="module")
def parent(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cost_mix(data, {"img": 1, "txt": 1}, num_cost=60).plan(
        tmp_path_factory.mktemp("parent") / "plan", sample_pack=_pack(16)
    )


def test_a_continued_cost_plan_keeps_the_prefix_and_counts_the_new_shares_from_the_seam(data: Path, tmp_path: Path):
    plain = cost_mix(data, {"img": 1, "txt": 1}, num_cost=60).plan(tmp_path / "parent")
    assert column(plain, "dataset_id") == PARENT_DATASETS
    child = cost_mix(data, {"img": 3, "txt": 1}, num_cost=60).plan(
        tmp_path / "child", continue_from=plain, at_step=2, global_batch=3
    )
    # P = 2 × 3 = 6: the prefix read img 12 and txt 2 3 4 5 2 (28). From the seam, img 3 : txt 1 by fresh finish
    # times: img 7 6 9 5 → 9.3 17.3 29.3 36; txt 3 4 5 → 12 28 48. 28 + 7 3 6 4 9 5 = 62 ≥ 60 ends it.
    assert column(child, "dataset_id") == [*PARENT_DATASETS[:6], 0, 1, 0, 1, 0, 0]
    assert column(child, "row") == [0, 1, 2, 0, 3, 0, 1, 1, 2, 2, 3, 4]
    assert column(child, "tokens") == [2, 3, 4, 12, 5, 2, 7, 3, 6, 4, 9, 5]
    lineage = manifest(child)["lineage"]
    assert lineage["branch"] == {"step": 2, "position": 6, "global_batch": 3, "tokens": 28}
    phases = manifest(child)["phases"]
    assert [(p["segment"], p["first_position"], p["planned_tokens"]) for p in phases] == [
        (0, 0, {"img": 12, "txt": 16}),
        (1, 6, {"img": 27, "txt": 7}),
    ]
    # A record run's state after step 2 of 3 samples branches at the same place: the same child, byte for byte.
    run = Pipeline.from_plan(plain).batch(microbatch_size=3)
    it = iter(run)
    next(it), next(it)
    again = cost_mix(data, {"img": 3, "txt": 1}, num_cost=60).plan(
        tmp_path / "again", continue_from=plain, state=run.state_dict()
    )
    for name in ("samples.parquet", "plan.json"):
        assert (again / name).read_bytes() == (child / name).read_bytes(), name


def test_a_continued_packed_plan_keeps_the_parents_rows_and_packs_its_leftovers_first(
    data: Path, parent: Path, tmp_path: Path
):
    assert bins_rows(parent) == PARENT_ROWS
    child = cost_mix(data, {"img": 3, "txt": 1}, num_cost=100).plan(
        tmp_path / "child", sample_pack=_pack(16), continue_from=parent, at_step=1, global_batch=2
    )
    # R = 2 rows kept, holding positions 0–5 and 7: P = 8, and sample 6 (img, 7) is a leftover in row 2. The new
    # samples (costs 6 4 9 5 5 10 2 12 3 7 from position 8) fill row 2 first and open rows from 3 on.
    rows = bins_rows(child)
    assert rows[:2] == PARENT_ROWS[:2]
    assert rows[2:] == [[6, 8, 14], [9, 10, 16], [11, 12], [13], [15], [17]]
    assert column(child, "tokens")[8:] == [6, 4, 9, 5, 5, 10, 2, 12, 3, 7]
    packing = manifest(child)["sample_packing"]
    assert packing["rows"] == 8 and packing["closes"] == [{"position": 8, "rows_below": 2}]
    # The audit checks each segment against its own target: the prefix's img 12 7 / txt 2 3 4 5 2 3 (19 : 19), the
    # new segment's img 6 9 5 10 12 7 / txt 4 5 2 3 (49 : 14); the leftover's row 2 puts phase 0 into step 1.
    audit = CliRunner().invoke(cli, ["audit", str(child), "--batch-size", "2", "--window", "1", "--format", "json"])
    spans = [(p["segment"], p["first_position"], p["end_position"], p["first_step"], p["last_step"],
              [d["overall_share"] for d in p["datasets"]]) for p in json.loads(audit.output)["phases"]]  # fmt: skip
    assert spans == [(0, 0, 8, 0, 1, [0.5, 0.5]), (1, 8, 18, 1, 3, pytest.approx([49 / 63, 14 / 63]))]
    again = cost_mix(data, {"img": 3, "txt": 1}, num_cost=100).plan(
        tmp_path / "again", sample_pack=_pack(16), continue_from=parent, at_step=1, global_batch=2
    )
    for name in ("samples.parquet", "bins.parquet", "plan.json"):
        assert (again / name).read_bytes() == (child / name).read_bytes(), name


def test_parent_then_child_are_the_batches_a_run_resumed_on_the_child_sees(data: Path, parent: Path, tmp_path: Path):
    run = packed(parent, b=2, g=2)
    it = iter(run)
    first = next(it)
    state = run.state_dict()  # after step 0 of the parent
    child = cost_mix(data, {"img": 3, "txt": 1}, num_cost=100).plan(
        tmp_path / "child", sample_pack=_pack(16), state=state, continue_from=parent
    )
    assert manifest(child)["lineage"]["branch"] == {"step": 1, "position": 8, "global_batch": 2, "tokens": 38}
    whole = steps_of([packed(child, b=2, g=2)])
    assert [[r.tolist() for r in first.rows()]] == [[PARENT_ROWS[0], PARENT_ROWS[1]]]
    assert whole[0] == steps_of([packed(parent, b=2, g=2)])[0]
    resumed = []
    for rank in range(2):
        pipe = packed(child, rank=rank, size=2, b=1, g=2)
        pipe.load_state_dict(state)  # the parent's state resumes on the child (its lineage)
        resumed.append(pipe)
    assert steps_of(resumed) == {s: rows for s, rows in whole.items() if s >= 1}


def test_a_continuation_of_a_phased_packed_plan_replays_its_row_closes(data: Path, phased_packed: Path, tmp_path: Path):
    child = phased(data).plan(
        tmp_path / "child", sample_pack=_pack(16), continue_from=phased_packed, at_step=2, global_batch=2
    )
    # R = 4 rows: positions 0–10, so P = 11; the replay closes phase 0's rows at 7 as the parent did.
    rows = bins_rows(child)
    assert rows[:4] == PHASED_ROWS[:4]
    assert manifest(child)["sample_packing"]["closes"] == [{"position": 7}, {"position": 11, "rows_below": 4}]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"sample_pack": _pack(20)},
            r"pack_samples must be the parent's algorithm='best_fit', max_cost=16, .*got .*20",
        ),
        ({"sample_pack": None}, r"pack_samples must be the parent's .*max_cost=16.*, got none"),
        ({"cost": "text_tokens"}, r"dataset 'img': the new config's cost= must be the parent's 'text_tokens \+"),
        ({"cost": None}, r"a continuation of a plan with costs must keep it so, got no costs"),
    ],
)
def test_a_continuation_that_changes_costs_or_packing_is_refused_in_one_line(
    data: Path, parent: Path, tmp_path: Path, change: dict, message: str
):
    pack = change.get("sample_pack", _pack(16))
    if "cost" in change:
        img = Dataset.from_path("img", data / "img", cost=change["cost"])
        txt = Dataset.from_path("txt", data / "txt", cost=PATCHES if change["cost"] else None)
        unit = "cost" if change["cost"] else None
        work = StaticMixtureWorkSource(datasets=[img, txt], mixture=MixtureSpec({"img": 1, "txt": 1}), seed=5,
                                       shuffle=IN_ORDER, mixture_unit=unit)  # fmt: skip
        pack = _pack(16) if change["cost"] else None
    else:
        work = cost_mix(data, {"img": 1, "txt": 1})
    with pytest.raises(ConfigError, match=message) as info:
        work.plan(tmp_path / "c", sample_pack=pack, continue_from=parent, at_step=1, global_batch=2)
    assert "\n" not in str(info.value)


def test_a_parent_without_costs_continued_with_costs_is_refused_before_anything_is_planned(
    data: Path, tmp_path: Path
):
    plain = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("img", data / "img"), Dataset.from_path("txt", data / "txt")],
        mixture=MixtureSpec({"img": 1, "txt": 1}), seed=5, shuffle=IN_ORDER,
    ).plan(tmp_path / "plain")  # fmt: skip
    with pytest.raises(ConfigError, match=r"a continuation of a plan without costs must keep it so, got costs"):
        cost_mix(data, {"img": 1, "txt": 1}).plan(
            tmp_path / "c", sample_pack=_pack(16), continue_from=plain, at_step=1, global_batch=2
        )
    assert not (tmp_path / "c").exists()


def test_a_record_state_must_be_at_a_step_boundary_and_the_step_within_the_parent(parent: Path, data: Path,
                                                                                 tmp_path: Path):  # fmt: skip
    work = cost_mix(data, {"img": 1, "txt": 1})
    with pytest.raises(ConfigError, match=r"--at-step must be within the parent's 2 full steps of 2 rows, got 3"):
        work.plan(tmp_path / "c", sample_pack=_pack(16), continue_from=parent, at_step=3, global_batch=2)
    run = packed(parent, b=1, g=2)  # two microbatches a step
    it = iter(run)
    next(it)
    with pytest.raises(ConfigError, match=r"must be taken at a step boundary, got step 0 microbatch 1"):
        work.plan(tmp_path / "d", sample_pack=_pack(16), continue_from=parent, state=run.state_dict())


def test_the_records_page_s_phases_and_continuation_example_prints_what_it_shows(tmp_path: Path, monkeypatch, capsys):

    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    shown = run_block("records.md", "### Phases and continuations of cost plans")
    assert capsys.readouterr().out.splitlines() == shown


def test_zephon_plan_continues_a_packed_cost_config_and_runs_at_another_batch_with_a_warning(
    data: Path, parent: Path, tmp_path: Path
):
    config = tmp_path / "more.yaml"
    config.write_text(
        "seed: 5\n"
        "datasets:\n"
        f'  - {{name: img, path: {data / "img"}, cost: "{PATCHES}"}}\n'
        f'  - {{name: txt, path: {data / "txt"}, cost: "{PATCHES}"}}\n'
        "mixture: {img: 3, txt: 1}\n"
        "mixture_unit: cost\n"
        "num_cost: 100\n"
        "shuffle: {enabled: false}\n"
        "pack_samples: {max_cost: 16}\n"
    )
    args = ["plan", str(config), "-o", str(tmp_path / "cli"), "--continue-from", str(parent), "--at-step", "1",
            "--global-batch", "2"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "from step 1 (global batch 2), position 8" in result.output.splitlines()[1]
    python = cost_mix(data, {"img": 3, "txt": 1}, num_cost=100).plan(
        tmp_path / "py", sample_pack=_pack(16), continue_from=parent, at_step=1, global_batch=2
    )
    for name in ("samples.parquet", "bins.parquet"):
        assert (tmp_path / "cli" / name).read_bytes() == (python / name).read_bytes(), name
    # A record run's steps are runs of rows: another global batch regroups the same rows (warned, not refused).
    with pytest.warns(PlanWarning, match=r"global batch 1 is not the 2 the continued plan"):
        rows = [b.sequences.tolist() for b in packed(python, b=1, g=1)]
    assert rows == [[r] for r in range(8)]


def test_best_fit_closes_rows_where_told_and_only_those_below_the_limit():
    def rows(bins):
        return [bins.position[bins.sequence == s].tolist() for s in range(bins.sequences)]

    costs = np.array([6, 3, 1, 4])
    assert rows(pack(costs, 10, keep_empty=True)) == [[0, 1, 2], [3]]
    assert rows(pack(costs, 10, keep_empty=True, closes=[(1, None)])) == [[0], [1, 2, 3]]  # the docstring's example
    assert rows(pack(costs, 10, keep_empty=True, closes=[(1, 0)])) == [[0, 1, 2], [3]]  # no row below 0
    # 6 and 3 fill row 0 to 9; closing rows below 1 at position 2 sends 1 and 4 to a new row 1
    assert rows(pack(costs, 10, keep_empty=True, closes=[(2, 1)])) == [[0, 1], [2, 3]]
