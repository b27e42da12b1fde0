"""Phases: a schedule of mixtures compiled into one plan, continuous per dataset, audited phase by phase."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from zephon.cli import cli
from zephon.config_file import load_work_source
from zephon.demo import write_demo_dataset
from zephon.errors import ConfigError
from zephon.inspection.audit import AuditSpec, audit_plan
from zephon.io import Dataset
from zephon.pipeline import Pipeline
from zephon.planner.build import seal_bundle
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, Phase, StaticMixtureWorkSource, TokenEstimation

NAMES = ("prose", "code", "short")
BASE = MixtureSpec({"prose": 0.5, "code": 0.3, "short": 0.2})
ANNEAL = MixtureSpec({"code": 1, "short": 1})


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_demo_dataset(tmp_path_factory.mktemp("demo"))


def _source(demo: str, **kw) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path(n, f"{demo}/{n}-*.parquet") for n in NAMES],
        mixture=kw.pop("mixture", BASE),
        seed=kw.pop("seed", 3),
        **kw,
    )


def _samples(plan: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(plan / "samples.parquet")
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}


def _manifest(plan: Path) -> dict:
    return json.loads((plan / "plan.json").read_text())


@pytest.fixture(scope="module")
def plans(demo: str, tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plans")
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    te = TokenEstimation(calibration_samples=64)
    three = [Phase(start=0.6, mixture=ANNEAL), Phase(start=0.9, mixture=MixtureSpec({"prose": 1}))]
    specs = {
        "samples": _source(demo, num_documents=3000, phases=three),
        "samples_flat": _source(demo, num_documents=30_000),
        "tokens": _source(demo, num_tokens=300_000, token_estimation=te, phases=[Phase(start=0.9, mixture=ANNEAL)]),
        "steps": _source(
            demo,
            num_tokens=300_000,
            token_estimation=te,
            exact_tokens=True,
            phases=[Phase(start=40, unit="steps", global_batch_size=8, mixture=ANNEAL)],
        ),
    }
    return {name: src.plan(root / name, tokenize=tok, pack=PackSpec(max_length=512)) for name, src in specs.items()}


# ----------------------------------------------------------------------------------------------------
# Layout
# ----------------------------------------------------------------------------------------------------


def test_sample_phases_start_at_their_fraction_and_hold_each_mixture_in_every_prefix(plans) -> None:
    s = _samples(plans["samples"])
    m = _manifest(plans["samples"])
    spans = [(p["first_position"], p["end_position"]) for p in m["phases"]]
    assert spans == [(0, 1800), (1800, 2700), (2700, 3000)]  # floor(0.6 × 3000), floor(0.9 × 3000)
    for phase, (lo, hi) in zip(m["phases"], spans, strict=True):
        weights = np.array([phase["weights"].get(n, 0.0) for n in NAMES])
        d = s["dataset_id"][lo:hi]
        counts = np.cumsum(np.eye(3, dtype=np.int64)[d], axis=0)  # c_i(n) for every prefix of the phase
        n = np.arange(1, hi - lo + 1)[:, None]
        assert np.abs(counts - weights * n).max() < 1, phase["index"]
        assert phase["planned_documents"] == dict(zip(NAMES, counts[-1].tolist(), strict=True))


def test_each_dataset_reads_on_across_phases_in_its_own_epoch_order(plans) -> None:
    phased, flat = _samples(plans["samples"]), _samples(plans["samples_flat"])
    for i in range(3):
        mine = phased["dataset_id"] == i
        theirs = flat["dataset_id"] == i
        ours = np.stack([phased["shard_id"][mine], phased["row"][mine], phased["epoch"][mine]])
        reference = np.stack([flat["shard_id"][theirs], flat["row"][theirs], flat["epoch"][theirs]])
        assert ours.shape[1] > 0
        assert np.array_equal(ours, reference[:, : ours.shape[1]]), NAMES[i]


def test_token_phase_starts_after_the_document_that_reaches_its_token(plans) -> None:
    s = _samples(plans["tokens"])
    m = _manifest(plans["tokens"])
    boundary = m["phases"][1]["start_tokens"]
    assert boundary == 270_000 and m["phases"][1]["start"] == {
        "start": "9/10",
        "unit": "fraction",
        "global_batch_size": None,
    }
    first = m["phases"][1]["first_position"]
    before = np.cumsum(s["tokens"].astype(np.int64))
    assert before[first - 1] >= boundary > before[first - 2]  # phase 0's last document crosses the boundary
    assert not (s["dataset_id"][first:] == 0).any()  # the anneal mix reads no prose
    tokens = np.bincount(s["dataset_id"][first:], weights=s["tokens"][first:], minlength=3)
    assert abs(tokens[1] / tokens.sum() - 0.5) < 0.01
    assert m["totals"]["tokens"] >= 300_000 and m["phases"][1]["tokens"] == int(tokens.sum())


def test_a_phase_in_steps_begins_in_that_step_of_an_exact_wrap_plan(plans) -> None:
    s = _samples(plans["steps"])
    m = _manifest(plans["steps"])
    step_tokens = 8 * 512
    first = m["phases"][1]["first_position"]
    assert m["phases"][1]["start_tokens"] == 40 * step_tokens
    assert s["token_offset"][first] // step_tokens == 40
    assert s["token_offset"][first - 1] < 40 * step_tokens


def test_phased_plans_are_byte_identical_and_the_phases_enter_the_config_hash(demo, tokenizer_dir, tmp_path) -> None:
    phases = [Phase(start=1000, unit="documents", mixture=MixtureSpec({"short": 2, "code": 1}))]
    a = _source(demo, num_documents=2000, phases=phases).plan(tmp_path / "a")
    b = _source(demo, num_documents=2000, phases=phases).plan(tmp_path / "b")
    flat = _source(demo, num_documents=2000).plan(tmp_path / "flat")
    for name in ("samples.parquet", "shards.parquet", "plan.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ma, mf = _manifest(a), _manifest(flat)
    assert ma["config"]["phases"] == [
        {"start": 1000, "unit": "documents", "global_batch_size": None, "weights": {"code": "1/3", "short": "2/3"}}
    ]
    assert ma["config_hash"] != mf["config_hash"] and "phases" not in mf
    # Phase 0 is the same plan as the unphased one.
    assert np.array_equal(_samples(a)["row"][:1000], _samples(flat)["row"][:1000])
    assert not np.array_equal(_samples(a)["dataset_id"][1000:], _samples(flat)["dataset_id"][1000:])


def test_stop_ends_a_phased_plan_before_a_dataset_starts_a_second_pass(demo, tmp_path) -> None:
    # code has 600 documents: 0.3 × 1500 in phase 0, then only code until its pass ends.
    src = _source(
        demo, num_documents=5000, on_exhaustion="stop", phases=[Phase(start=0.3, mixture=MixtureSpec({"code": 1}))]
    )
    plan = src.plan(tmp_path / "p")
    s, m = _samples(plan), _manifest(plan)
    assert len(s["row"]) == 1500 + 150 and (s["epoch"] == 0).all()
    assert m["phases"][1]["planned_documents"] == {"prose": 0, "code": 150, "short": 0}


def test_the_executor_runs_a_phased_plan_like_any_other(plans, tokenizer_dir) -> None:
    pipe = Pipeline.from_plan(plans["steps"]).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=512)
    batches = list(pipe.batch(microbatch_size=8))
    m = _manifest(plans["steps"])
    assert len(batches) == -(-m["packing"]["sequences"] // 8)
    assert sum(int((b.lengths > 0).sum()) for b in batches) == m["packing"]["sequences"]


# ----------------------------------------------------------------------------------------------------
# Audit
# ----------------------------------------------------------------------------------------------------


def _independent_phase_shares(plan: Path, batch: int, window: int, lo: int, hi: int) -> np.ndarray:
    """Document shares per sliding window of the steps holding positions [lo, hi), straight from DuckDB."""
    rows = duckdb.sql(
        f"""
        WITH d AS (SELECT position // {batch} AS step, dataset_id FROM read_parquet('{plan / "samples.parquet"}')
                   WHERE position >= {lo} AND position < {hi}),
             grid AS (SELECT s.step, k.dataset_id, count(d.dataset_id) AS n
                      FROM (SELECT DISTINCT step FROM d) s CROSS JOIN (SELECT unnest([0, 1, 2]) AS dataset_id) k
                      LEFT JOIN d USING (step, dataset_id) GROUP BY ALL),
             win AS (SELECT step, dataset_id, sum(n) OVER (PARTITION BY dataset_id ORDER BY step
                            ROWS BETWEEN CURRENT ROW AND {window - 1} FOLLOWING) AS n FROM grid)
        SELECT step, dataset_id, n / sum(n) OVER (PARTITION BY step) FROM win
        WHERE step <= (SELECT max(step) FROM grid) - {window - 1} ORDER BY step, dataset_id
        """
    ).fetchall()
    return np.array([r[2] for r in rows]).reshape(-1, 3)


def test_audit_reports_each_phase_against_its_own_weights(plans) -> None:
    result = audit_plan(plans["samples"], AuditSpec(batch_size=10, window=20, tolerance_pp=1))
    assert result.ok and [p.index for p in result.phases] == [0, 1, 2]
    assert [(p.first_step, p.last_step) for p in result.phases] == [(0, 179), (180, 269), (270, 299)]
    shares = []
    for phase in result.phases:
        independent = _independent_phase_shares(plans["samples"], 10, 20, phase.first_position, phase.end_position)
        assert phase.windows == len(independent)
        shares.append(independent)
    np.testing.assert_allclose(result.window_shares, np.vstack(shares), rtol=0, atol=1e-12)
    assert {d.name: d.target for d in result.phases[1].datasets} == {"prose": 0.0, "code": 0.5, "short": 0.5}
    # Overall: 1800 × (.5, .3, .2) + 900 × (0, .5, .5) + 300 × (1, 0, 0) over 3000 documents.
    np.testing.assert_allclose([d.target for d in result.datasets], [0.4, 0.33, 0.27], atol=1e-12)


def test_audit_fails_a_planted_violation_inside_one_phase(plans, tmp_path) -> None:
    planted = tmp_path / "planted"
    planted.mkdir()
    for name in ("plan.json", "shards.parquet"):
        (planted / name).write_bytes((plans["samples"] / name).read_bytes())
    table = pq.read_table(plans["samples"] / "samples.parquet")
    d = table.column("dataset_id").to_numpy().copy()
    d[2000:2100] = 1  # 100 positions of phase 1 all code (its mix is code/short 50/50)
    pq.write_table(table.set_column(1, "dataset_id", [d]), planted / "samples.parquet")
    seal_bundle(planted)  # rewritten on purpose: recorded as the bundle's own file
    result = CliRunner().invoke(cli, ["audit", str(planted), "-b", "10", "-w", "20", "-t", "5"])
    assert result.exit_code == 1, result.output
    fails = [line for line in result.output.splitlines() if line.startswith("FAIL")]
    assert fails and all(" in phase 1: " in line for line in fails), fails
    assert "phase 1: positions 1800..2699, steps 180..269" in result.output
    data = json.loads(CliRunner().invoke(cli, ["audit", str(planted), "-b", "10", "-w", "20", "-f", "json"]).output)
    assert [p["ok"] for p in data["phases"]] == [True, False, True]
    assert data["phases"][1]["violations"] == ["code", "short"]


def test_audit_of_a_token_phased_plan_by_tokens(plans) -> None:
    result = audit_plan(plans["steps"], AuditSpec(batch_size=8, window=10, tolerance_pp=3))
    assert result.ok and result.by == "tokens" and len(result.phases) == 2
    assert result.phases[1].first_step == 40
    assert result.phases[0].last_step == 40  # the boundary step holds the end of phase 0 and the start of phase 1


# ----------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------


def test_phases_from_a_config_file(demo, tmp_path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"""
seed: 3
datasets:
  - {{name: prose, path: "{demo}/prose-*.parquet"}}
  - {{name: code, path: "{demo}/code-*.parquet"}}
  - {{name: short, path: "{demo}/short-*.parquet"}}
mixture: {{prose: 0.5, code: 0.3, short: 0.2}}
num_documents: 3000
phases:
  - {{start: 0.6, mixture: {{code: 1, short: 1}}}}
  - {{start: 0.9, mixture: {{prose: 1}}}}
""",
        encoding="utf-8",
    )
    src = load_work_source(config)
    assert src.phases == (
        Phase(start=0.6, mixture=MixtureSpec({"code": 1, "short": 1})),
        Phase(start=0.9, mixture=MixtureSpec({"prose": 1})),
    )
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert [p["first_position"] for p in _manifest(tmp_path / "out")["phases"]] == [0, 1800, 2700]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(phases=[Phase(start=0.5, mixture=ANNEAL)]),
            r"^phases must come with a num_documents, num_tokens or num_cost budget",
        ),
        (
            dict(
                num_documents=10,
                phases=[Phase(start=0.5, mixture=ANNEAL), Phase(start=5, unit="documents", mixture=ANNEAL)],
            ),
            r"^phases must share one unit, got \['documents', 'fraction'\]",
        ),
        (
            dict(num_documents=10, phases=[Phase(start=0.7, mixture=ANNEAL), Phase(start=0.5, mixture=ANNEAL)]),
            r"^phase starts must strictly increase, got \[0.7, 0.5\]",
        ),
        (
            dict(num_documents=10, phases=[Phase(start=0.5, mixture=MixtureSpec({"math": 1}))]),
            r"^phase mixture names must be dataset names \['prose', 'code', 'short'\], got unknown \['math'\]",
        ),
        (
            dict(num_documents=10, phases=[Phase(start=5, unit="tokens", mixture=ANNEAL)]),
            r"^phases in tokens need a token mixture, got token_estimation=None",
        ),
        (
            dict(
                num_tokens=10,
                token_estimation=TokenEstimation(),
                phases=[Phase(start=5, unit="steps", global_batch_size=8, mixture=ANNEAL)],
            ),
            r"^phases in steps need an exact plan",
        ),
        (dict(num_tokens=1000), r"^num_tokens=1000 needs a token mixture, got token_estimation=None"),
        (  # a phase that would never begin (it was planned without it, silently)
            dict(num_documents=10, phases=[Phase(start=10, unit="documents", mixture=ANNEAL)]),
            r"^phase starts must lie inside the budget of 10 documents, got a phase at 10 documents, which would "
            r"never begin — lower its start",
        ),
        (  # one Phase, not a list of them (a TypeError: 'Phase' object is not iterable)
            dict(num_documents=10, phases=Phase(start=0.5, mixture=ANNEAL)),
            r"^phases must be a list of zephon.work.Phase, got Phase — pass phases=\[Phase\(\.\.\.\), \.\.\.\]$",
        ),
    ],
)
def test_phase_settings_are_checked_with_a_fix(demo, kw, message) -> None:
    with pytest.raises(ConfigError, match=message):
        _source(demo, **kw)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(start=1.0), r"^Phase start as a fraction of the budget must be in \(0, 1\), got 1.0"),
        (dict(start=0), r"^Phase start must be a number > 0, got 0"),
        (dict(start=2.5, unit="documents"), r"^Phase start in documents must be an integer, got 2.5"),
        (dict(start=3, unit="epochs"), r'^Phase unit must be "fraction", "documents", "tokens", "cost" or "steps", got'),
        (dict(start=3, unit="steps"), r"^a Phase in steps must give global_batch_size"),
        (dict(start=0.5, global_batch_size=8), r'^Phase global_batch_size is only for unit="steps"'),
    ],
)
def test_a_phase_is_checked_when_made(kw, message) -> None:
    with pytest.raises(ConfigError, match=message):
        Phase(mixture=ANNEAL, **kw)


def test_steps_need_wrap_packing(demo, tokenizer_dir, tmp_path) -> None:
    src = _source(
        demo,
        num_tokens=50_000,
        token_estimation=TokenEstimation(calibration_samples=32),
        exact_tokens=True,
        phases=[Phase(start=2, unit="steps", global_batch_size=4, mixture=ANNEAL)],
    )
    with pytest.raises(ConfigError, match=r"^phases in steps need wrap packing .* got 'best_fit'"):
        src.plan(
            tmp_path / "p",
            tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir),
            pack=PackSpec(max_length=64, algorithm="best_fit"),
        )


def test_a_config_phase_error_names_the_entry(demo, tmp_path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"""
seed: 3
datasets: [{{name: code, path: "{demo}/code-*.parquet"}}]
mixture: {{code: 1}}
num_documents: 100
phases:
  - {{start: 0.5, unit: step, mixture: {{code: 1}}}}
""",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"`phases\[0\]`: Phase unit must be"):
        load_work_source(config)


def test_the_phases_view_places_every_document_in_its_phase(plans) -> None:
    from zephon.inspection.sql import run_sql

    _, rows = run_sql(
        plans["samples"],
        "SELECT p.phase, s.dataset_id, count(*), any_value(p.weight), any_value(p.planned_documents) "
        "FROM samples s JOIN phases p ON s.position >= p.first_position AND s.position < p.end_position "
        "AND s.dataset_id = p.dataset_id GROUP BY ALL ORDER BY ALL",
    )
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (0, 0, 900),
        (0, 1, 540),
        (0, 2, 360),
        (1, 1, 450),
        (1, 2, 450),
        (2, 0, 300),
    ]
    assert all(r[2] == r[4] and r[3] > 0 for r in rows)
    _, flat = run_sql(
        plans["samples_flat"], "SELECT phase, first_position, end_position, sum(weight) FROM phases GROUP BY ALL"
    )
    assert flat == [(0, 0, 30_000, 1.0)]


def test_zephon_plan_prints_a_line_per_phase(demo, tmp_path) -> None:
    config = tmp_path / "c.toml"
    tables = "".join(f'[[datasets]]\nname = "{n}"\npath = "{demo}/{n}-*.parquet"\n' for n in NAMES)
    config.write_text(
        f"""seed = 3
mixture = {{ prose = 0.5, code = 0.3, short = 0.2 }}
num_documents = 3000
{tables}
[[phases]]
start = 2000
unit = "documents"
mixture = {{ code = 1 }}
""",
        encoding="utf-8",
    )
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-2:] == [
        "  phase 0: positions 0..1999, 2000 documents; prose 0.500, code 0.300, short 0.200",
        "  phase 1: positions 2000..2999, 1000 documents; code 1.000",
    ]


def test_zephon_show_names_the_phase_of_each_document(plans) -> None:
    result = CliRunner().invoke(
        cli, ["show", str(plans["samples"]), "-s", "179", "-b", "10", "--no-text", "-f", "json"]
    )
    assert result.exit_code == 0, result.output
    docs = json.loads(result.output)["documents"]
    assert [(d["position"], d["phase"]) for d in docs] == [(p, 0) for p in range(1790, 1800)]
    boundary = CliRunner().invoke(cli, ["show", str(plans["samples"]), "-s", "180", "-b", "10", "--no-text"])
    assert boundary.output.splitlines()[1].split() == ["position", "dataset", "shard", "row", "phase"]
    assert {line.split()[4] for line in boundary.output.splitlines()[3:]} == {"1"}
