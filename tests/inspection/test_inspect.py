"""Curriculum inspection: the sequences/steps views, `zephon sql -f parquet`, `zephon show`, `zephon audit`,
`zephon diff`. Expected values are recomputed independently (numpy loops, per-token DuckDB expansions)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from conftest import write_parquet_dataset
from support.synthetic_plans import ROWS, shard_text, token_pattern, write_synthetic_plan

from zephon.cli import cli
from zephon.errors import ConfigError
from zephon.inspection.audit import AuditSpec, audit_plan, plot_shares
from zephon.inspection.diff import ConfigChange, DatasetVolumes, diff_plans
from zephon.inspection.show import preview, short_uris, show_step
from zephon.inspection.steps import resolve_layout
from zephon.inspection.views import connect_with_steps, run_query
from zephon.io import Dataset
from zephon.plan.format import SAMPLES_ROW_GROUP, SAMPLES_SCHEMA
from zephon.plan.manifest import PlanBatch, read_manifest
from zephon.planner.build import seal_bundle
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}
L, B = 33, 4


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="zephon")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for name, rows in (("a", [40, 40]), ("b", [60]), ("c", [80])):
        write_parquet_dataset(root, name, rows)
    return root


def _source(corpus: Path, **kw) -> StaticMixtureWorkSource:
    names = kw.pop("names", ("a", "b", "c"))
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path(n, str(corpus / n)) for n in names],
        mixture=MixtureSpec(kw.pop("weights", WEIGHTS)),
        seed=kw.pop("seed", 3),
        **kw,
    )


@pytest.fixture(scope="module")
def plans(corpus: Path, tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: str) -> dict[str, Path]:
    """One plan of each kind: sample mixture, estimated token mixture, exact wrap, exact best_fit."""
    root = tmp_path_factory.mktemp("plans")
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZEPHON_CACHE_DIR", str(root / "cache"))
        estimate = TokenEstimation(primer=0.25)
        return {
            "samples": _source(corpus, num_documents=200).plan(root / "samples"),
            "estimated": _source(corpus, token_estimation=estimate).plan(root / "estimated", tokenize=tok),
            "wrap": _source(corpus, token_estimation=estimate, exact_tokens=True).plan(
                root / "wrap", tokenize=tok, pack=PackSpec(max_length=L), workers=1
            ),
            "best_fit": _source(corpus, token_estimation=estimate, exact_tokens=True).plan(
                root / "best_fit", tokenize=tok, pack=PackSpec(max_length=L, algorithm="best_fit"), workers=1
            ),
        }


def _samples(plan: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(plan / "samples.parquet")
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}


def _expected_units(plan: Path, per: int) -> list[tuple[int, int, int, int | None]]:
    """(unit, position, dataset_id, tokens inside) for units of ``per`` sequences, by plain Python loops."""
    m = read_manifest(plan)
    s = _samples(plan)
    out: list[tuple[int, int, int, int | None]] = []
    if m.totals.tokens is None:
        return [(int(p) // per, int(p), int(d), None) for p, d in zip(s["position"], s["dataset_id"], strict=True)]
    if m.packing is not None and m.packing.algorithm == "best_fit":
        bins = pq.read_table(plan / "bins.parquet").to_pylist()
        acc: dict[tuple[int, int], int] = {}
        for b in bins:
            key = (b["sequence"] // per, b["position"])
            acc[key] = acc.get(key, 0) + b["length"]
        return sorted((u, p, int(s["dataset_id"][p]), n) for (u, p), n in acc.items())
    unit = per * L
    offset = 0
    for p, d, t in zip(s["position"], s["dataset_id"], s["tokens"], strict=True):
        for k in range(offset // unit, (offset + int(t) - 1) // unit + 1):
            out.append((k, int(p), int(d), min(offset + int(t), (k + 1) * unit) - max(offset, k * unit)))
        offset += int(t)
    return sorted(out)


# ----------------------------------------------------------------------------------------------------
# sequences and steps views
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["samples", "estimated", "wrap", "best_fit"])
def test_steps_and_sequences_views_match_the_definitions_recomputed_in_python(plans, kind) -> None:
    max_length = L if kind == "estimated" else None
    steps = run_query(plans[kind], "SELECT * FROM steps ORDER BY ALL", batch_size=B, max_length=max_length)
    assert steps.columns == ["step", "position", "dataset_id", "tokens_in_step"]
    assert steps.rows == _expected_units(plans[kind], B)
    sequences = run_query(plans[kind], "SELECT * FROM sequences ORDER BY ALL", max_length=max_length)
    assert sequences.columns == ["sequence", "position", "dataset_id", "tokens_in_sequence"]
    assert sequences.rows == _expected_units(plans[kind], 1)


@pytest.mark.parametrize("kind", ["samples", "estimated", "wrap", "best_fit"])
def test_step_documents_macro_equals_the_filtered_view(plans, kind) -> None:
    con = connect_with_steps(plans[kind], B, max_length=L if kind == "estimated" else None)
    try:
        last = con.execute("SELECT max(step) FROM steps").fetchone()[0]
        for n in (0, 1, last // 2, last):
            seek = con.execute("SELECT * FROM step_documents($n)", {"n": n}).fetchall()
            scan = con.execute("SELECT * FROM steps WHERE step = $n ORDER BY position", {"n": n}).fetchall()
            assert seek == scan and seek
            seq = con.execute("SELECT * FROM sequence_documents($n)", {"n": n}).fetchall()
            assert (
                seq == con.execute("SELECT * FROM sequences WHERE sequence = $n ORDER BY position", {"n": n}).fetchall()
            )
    finally:
        con.close()


def test_wrap_steps_hold_batch_times_length_tokens_except_the_last(plans) -> None:
    rows = run_query(
        plans["wrap"], "SELECT step, sum(tokens_in_step) FROM steps GROUP BY step ORDER BY step", batch_size=B
    )
    sums = [t for _, t in rows.rows]
    total = read_manifest(plans["wrap"]).totals.tokens
    assert sums[:-1] == [B * L] * (len(sums) - 1) and sum(sums) == total
    assert len(sums) == -(-read_manifest(plans["wrap"]).exact_packing().sequences // B)


def test_worked_example_of_the_docs(tmp_path) -> None:
    plan = write_synthetic_plan(tmp_path, 3, max_length=4, tokens=[3, 6, 2])
    rows = run_query(plan, "SELECT step, position, tokens_in_step FROM steps ORDER BY ALL", batch_size=2).rows
    assert rows == [(0, 0, 3), (0, 1, 5), (1, 1, 1), (1, 2, 2)]


def test_views_exist_only_where_the_plan_defines_them(plans) -> None:
    def views(plan: Path, **kw) -> set[str]:
        con = connect_with_steps(plan, **kw)
        try:
            return {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        finally:
            con.close()

    base = {"samples", "shards", "datasets", "phases", "segments"}  # segments: one segment 0 without lineage
    assert views(plans["wrap"]) == {*base, "sequences"}
    assert views(plans["wrap"], batch_size=2) == {*base, "sequences", "steps"}
    assert views(plans["estimated"]) == base
    assert views(plans["estimated"], max_length=64) == {*base, "sequences"}
    assert views(plans["best_fit"], batch_size=2) == {*base, "bins", "sequences", "steps"}


def test_layout_errors_name_the_option_to_pass(plans) -> None:
    estimated, wrap, samples = (read_manifest(plans[k]) for k in ("estimated", "wrap", "samples"))
    with pytest.raises(ConfigError, match=r"^max_length must be given for an estimated plan .* pass --max-length L"):
        resolve_layout(estimated, batch_size=4).require_steps()
    with pytest.raises(ConfigError, match=rf"^max_length must be {L} \(fixed by the exact plan's packing\), got 64"):
        resolve_layout(wrap, max_length=64)
    with pytest.raises(ConfigError, match=r"^max_length applies to plans with token counts, got 8"):
        resolve_layout(samples, max_length=8)
    with pytest.raises(ConfigError, match=r"^batch_size must be given to cut the plan into steps"):
        resolve_layout(wrap).require_steps()
    with pytest.raises(ConfigError, match=r"^batch_size must be an integer ≥ 1, got 0"):
        resolve_layout(wrap, batch_size=0)
    recorded = dataclasses.replace(wrap, batch=PlanBatch(global_batch_size=6))
    assert resolve_layout(recorded).batch_size == 6


# ----------------------------------------------------------------------------------------------------
# zephon sql: --batch-size, --format parquet
# ----------------------------------------------------------------------------------------------------


def test_sql_with_batch_size_prints_tokens_per_dataset_per_step(plans) -> None:
    query = (
        "SELECT step, d.name, sum(tokens_in_step) AS tokens FROM steps JOIN datasets d USING (dataset_id) "
        "WHERE step < 2 GROUP BY ALL ORDER BY ALL"
    )
    result = _invoke("sql", str(plans["wrap"]), query, "--batch-size", str(B), "-f", "csv")
    assert result.exit_code == 0, result.output
    expected: dict[tuple[int, str], int] = {}
    for unit, _, d, n in _expected_units(plans["wrap"], B):
        if unit < 2:
            key = (unit, "abc"[d])
            expected[key] = expected.get(key, 0) + n
    assert result.stdout == "step,name,tokens\n" + "".join(f"{s},{n},{t}\n" for (s, n), t in sorted(expected.items()))


def test_sql_parquet_output_round_trips_the_result(plans, tmp_path) -> None:
    out = tmp_path / "step.parquet"
    result = _invoke(
        "sql",
        str(plans["wrap"]),
        "SELECT *, 1 AS step FROM step_documents(2)",
        "-b",
        "4",
        "-f",
        "parquet",
        "-o",
        str(out),
    )
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    expected = [r for r in _expected_units(plans["wrap"], B) if r[0] == 2]
    assert result.stdout == f"wrote {len(expected)} rows (5 columns) to {out}\n"
    assert table.column_names == ["step", "position", "dataset_id", "tokens_in_step", "step_1"]
    assert table.schema.field("position").type == pa.int64()
    assert [tuple(r.values())[:4] for r in table.to_pylist()] == expected


def test_sql_text_output_to_a_file(plans, tmp_path) -> None:
    out = tmp_path / "n.csv"
    result = _invoke("sql", str(plans["samples"]), "SELECT count(*) AS n FROM samples", "-f", "csv", "-o", str(out))
    assert (result.exit_code, result.stdout, out.read_text()) == (0, "", "n\n200\n")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["-f", "parquet"], 2, "parquet output must go to a file, got no -o/--output — add -o FILE"),
        (["-b", "0"], 2, "0 is not in the range x>=1"),
        (
            ["-b", "4", "--max-length", "64"],
            1,
            f"zephon: error: max_length must be {L} (fixed by the exact plan's packing), got 64 — omit --max-length\n",
        ),
    ],
)
def test_sql_option_errors(plans, args, code, message) -> None:
    result = _invoke("sql", str(plans["wrap"]), "SELECT 1", *args)
    assert result.exit_code == code
    assert message in result.stderr


def test_sql_parquet_without_a_result_is_one_line_exit_1(plans, tmp_path) -> None:
    result = _invoke("sql", str(plans["wrap"]), "SET threads = 1", "-f", "parquet", "-o", str(tmp_path / "x.parquet"))
    assert result.exit_code == 1
    assert result.stderr.startswith("zephon: error: ") and result.stderr.count("\n") == 1


# ----------------------------------------------------------------------------------------------------
# zephon show
# ----------------------------------------------------------------------------------------------------


def test_show_prints_the_step_exactly_on_a_small_plan(tmp_path) -> None:
    plan = write_synthetic_plan(tmp_path, 30, max_length=257)
    result = _invoke("show", str(plan), "--step", "3", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "step 3 of 10: sequences 6..7 (exact wrap, 257 tokens per sequence; batch 2), 3 documents, 514 tokens\n"
        "position  dataset  shard          row  tokens  in_step  text\n"
        "--------  -------  -------------  ---  ------  -------  -------------------------------------------------------------\n"
        "      10  beta     beta.parquet     3     291      214  beta row 3⏎second line of beta document 3, padded xxxxxxxxxx…\n"
        "      11  gamma    gamma.parquet    3     110      110  gamma row 3⏎second line of gamma document 3, padded xxxxxxxx…\n"
        "      12  alpha    alpha.parquet    4     229      190  alpha row 4⏎second line of alpha document 4, padded xxxxxxxx…\n"
    )
    # The last step holds the plan's last, partial sequence: 4695 tokens = 18 × 257 + 69.
    no_text = _invoke("show", str(plan), "-s", "9", "-b", "2", "--no-text")
    assert no_text.stdout == (
        "step 9 of 10: sequences 18..18 (exact wrap, 257 tokens per sequence; batch 2), 1 document, 69 tokens\n"
        "position  dataset  shard          row  tokens  in_step\n"
        "--------  -------  -------------  ---  ------  -------\n"
        "      29  gamma    gamma.parquet    9     152       69\n"
    )


def test_show_json_lists_full_uris(tmp_path) -> None:
    plan = write_synthetic_plan(tmp_path, 30)
    result = _invoke("show", str(plan), "-s", "0", "-b", "1", "-f", "json")
    data = json.loads(result.stdout)
    assert (
        data["steps"] == 19 and data["tokens"] == 257 and data["sequences_are"] == "exact wrap, 257 tokens per sequence"
    )
    assert data["documents"][0] == {
        "position": 0,
        "dataset": "alpha",
        "shard": str(tmp_path / "data" / "alpha.parquet"),
        "row": 0,
        "epoch": 0,
        "tokens": 1,
        "tokens_in_step": 1,
        "text": preview(shard_text(0, 0)),
    }


def test_show_seeks_a_plan_of_ten_million_documents(tmp_path) -> None:
    n = 10_000_000
    plan = write_synthetic_plan(tmp_path, n, max_length=257)
    tokens = token_pattern(np.arange(n, dtype=np.int64)).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(tokens)[:-1]))
    batch, unit = 8, 8 * 257
    sequences = -(-int(tokens.sum()) // 257)
    steps = -(-sequences // batch)
    for step in (0, 654_321, steps - 1):
        view = show_step(plan, step, batch_size=batch)
        start, end = step * unit, (step + 1) * unit
        inside = np.minimum(offsets + tokens, end) - np.maximum(offsets, start)
        want = np.flatnonzero(inside > 0)
        assert [r.position for r in view.rows] == want.tolist()
        assert [r.tokens_in_step for r in view.rows] == inside[want].tolist()
        assert [r.text for r in view.rows] == [preview(shard_text(p % 3, (p // 3) % ROWS)) for p in want.tolist()]
    assert view.steps == steps


@pytest.mark.parametrize("kind", ["samples", "estimated", "wrap", "best_fit"])
def test_show_agrees_with_the_steps_view_and_the_shards(plans, kind) -> None:
    max_length = L if kind == "estimated" else None
    plan = plans[kind]
    units = _expected_units(plan, B)
    shards = pq.read_table(plan / "shards.parquet").to_pylist()
    s = _samples(plan)
    for step in (0, units[-1][0] // 2, units[-1][0]):
        view = show_step(plan, step, batch_size=B, max_length=max_length)
        want = [u for u in units if u[0] == step]
        assert [(step, r.position, "abc".index(r.dataset), r.tokens_in_step) for r in view.rows] == want
        for r in view.rows:
            shard = shards[int(s["shard_id"][r.position])]
            text = pq.read_table(shard["uri"]).column("text")[r.row].as_py()
            assert (r.uri, r.row, r.text) == (shard["uri"], int(s["row"][r.position]), preview(text))
            assert r.shard == f"{shard['dataset']}/{Path(shard['uri']).name}"


def test_show_refuses_a_step_out_of_range(plans) -> None:
    result = _invoke("show", str(plans["samples"]), "--step", "50", "-b", "4")
    assert result.exit_code == 1
    assert result.stderr == (
        "zephon: error: step must be an integer in 0..49 (the plan has 50 steps of 4 sequences), got 50 — "
        "pass a step in range\n"
    )
    assert _invoke("show", str(plans["samples"]), "-b", "4").exit_code == 2


def test_preview_and_short_uris() -> None:
    assert preview("a\r\nb\nc\td") == "a⏎b⏎c d"
    assert preview("x" * 61) == "x" * 60 + "…"
    assert short_uris(["/d/a/x.parquet", "/d/b/y.parquet"]) == {
        "/d/a/x.parquet": "a/x.parquet",
        "/d/b/y.parquet": "b/y.parquet",
    }
    assert short_uris(["/d/a/x.parquet"]) == {"/d/a/x.parquet": "x.parquet"}


# ----------------------------------------------------------------------------------------------------
# zephon audit
# ----------------------------------------------------------------------------------------------------


def _independent_window_shares(plan: Path, batch: int, window: int) -> np.ndarray:
    """Token shares per sliding window, by expanding every token of the plan in DuckDB (no views used)."""
    import duckdb

    con = duckdb.connect()
    try:
        rows = con.execute(
            f"""
            WITH tok AS (SELECT dataset_id, unnest(range(token_offset, token_offset + tokens)) AS t
                         FROM read_parquet('{plan / "samples.parquet"}')),
                 per AS (SELECT t // {batch * L} AS step, dataset_id, count(*) AS n FROM tok GROUP BY ALL),
                 grid AS (SELECT s.step, d.dataset_id, coalesce(p.n, 0) AS n
                          FROM (SELECT DISTINCT step FROM per) s CROSS JOIN (SELECT DISTINCT dataset_id FROM per) d
                          LEFT JOIN per p USING (step, dataset_id)),
                 win AS (SELECT step, dataset_id, sum(n) OVER (PARTITION BY dataset_id ORDER BY step
                                ROWS BETWEEN CURRENT ROW AND {window - 1} FOLLOWING) AS n FROM grid)
            SELECT step, dataset_id, n / sum(n) OVER (PARTITION BY step) AS share FROM win
            WHERE step <= (SELECT max(step) FROM grid) - {window - 1} ORDER BY step, dataset_id
            """
        ).fetchall()
    finally:
        con.close()
    steps = max(r[0] for r in rows) + 1
    shares = np.zeros((steps, 3))
    for step, d, share in rows:
        shares[step, d] = share
    return shares


def test_audit_numbers_match_an_independent_duckdb_computation(plans) -> None:
    result = audit_plan(plans["wrap"], AuditSpec(batch_size=2, window=5, tolerance_pp=50))
    shares = _independent_window_shares(plans["wrap"], 2, 5)
    assert result.ok and result.by == "tokens" and result.tokens_are == "exact" and result.target_source == "weights"
    assert result.windows == len(shares) and result.window == 5
    np.testing.assert_allclose(result.window_shares, shares, rtol=0, atol=1e-12)
    weights = np.array([0.5, 0.3, 0.2])
    for i, d in enumerate(result.datasets):
        dev = shares[:, i] - weights[i]
        worst = int(np.argmax(np.abs(dev)))
        assert (d.name, d.weight, d.target) == ("abc"[i], weights[i], weights[i])
        assert (d.worst_first_step, d.worst_last_step) == (worst, worst + 4)
        assert d.worst_share == pytest.approx(shares[worst, i], abs=1e-12)
        assert d.worst_deviation == pytest.approx(dev[worst], abs=1e-12)
    planned = {d.name: d.planned_token_share for d in read_manifest(plans["wrap"]).datasets}
    assert {d.name: d.overall_share for d in result.datasets} == pytest.approx(planned, abs=1e-12)


def _planted(plan: Path, out: Path, stretch: int) -> Path:
    """A copy of ``plan`` whose first ``stretch`` positions hold dataset `a` first (stable), then the rest."""
    shutil.copytree(plan, out)
    table = pq.read_table(plan / "samples.parquet")
    head = table.slice(0, stretch)
    ds = head.column("dataset_id").to_numpy()
    order = np.concatenate([np.flatnonzero(ds == 0), np.flatnonzero(ds != 0)])
    moved = pa.concat_tables([head.take(pa.array(order)), table.slice(stretch)])
    moved = moved.set_column(0, "position", pa.array(np.arange(moved.num_rows), pa.int64())).cast(SAMPLES_SCHEMA)
    pq.write_table(moved, out / "samples.parquet", row_group_size=SAMPLES_ROW_GROUP)
    seal_bundle(out)  # rewritten on purpose: recorded as the bundle's own file
    return out


def test_audit_flags_a_planted_stretch_of_one_dataset(plans, tmp_path) -> None:
    good = _invoke("audit", str(plans["samples"]), "-b", "4", "-w", "5", "-t", "5")
    assert good.exit_code == 0, good.output
    assert (
        good.stdout.splitlines()[-1]
        == "ok: every dataset with weight ≥ 0.05 is within 5.00 pp of its target in every window of 5 steps"
    )
    planted = _planted(plans["samples"], tmp_path / "planted", 100)
    bad = _invoke("audit", str(planted), "-b", "4", "-w", "5", "-t", "5")
    assert bad.exit_code == 1
    lines = bad.stdout.splitlines()
    assert lines[0] == (
        f"audit {planted}: samples per window of 5 steps (46 windows; 50 steps of 4 sequences), tolerance 5.00 pp, "
        "target: mixture weights"
    )
    assert lines[1:4] == [
        "dataset  weight  target  overall  worst window  share   deviation  check",
        "-------  ------  ------  -------  ------------  ------  ---------  -----",
        "a        0.500   0.5000  0.5000   steps 0..4    1.0000  +50.00 pp  FAIL",
    ]
    assert "FAIL a: share 1.0000 in steps 0..4 is +50.00 pp from its target 0.5000 (tolerance 5.00 pp)" in lines
    assert bad.stderr == ""


def test_audit_json_is_machine_readable_and_matches_the_library(plans, tmp_path) -> None:
    planted = _planted(plans["samples"], tmp_path / "planted", 100)
    result = _invoke("audit", str(planted), "-b", "4", "-w", "5", "-t", "5", "--format", "json")
    data = json.loads(result.stdout)
    lib = audit_plan(planted, AuditSpec(batch_size=4, window=5, tolerance_pp=5))
    assert result.exit_code == 1 and data["ok"] is False and data["violations"] == [d.name for d in lib.violations]
    assert "a" in data["violations"]
    assert data["datasets"][0] == {
        "name": "a",
        "dataset_id": 0,
        "weight": 0.5,
        "target": 0.5,
        "overall_share": 0.5,
        "worst_window": {"first_step": 0, "last_step": 4, "share": 1.0, "deviation_pp": 50.0},
        "checked": True,
        "violated": True,
    }
    assert {k: data[k] for k in ("by", "tokens_are", "target", "batch_size", "steps", "window_steps", "windows")} == {
        "by": "samples",
        "tokens_are": None,
        "target": "weights",
        "batch_size": 4,
        "steps": 50,
        "window_steps": 5,
        "windows": 46,
    }


def test_audit_by_the_other_unit_targets_the_overall_share(plans) -> None:
    result = audit_plan(plans["wrap"], AuditSpec(batch_size=4, window=10, by="samples", tolerance_pp=100))
    assert result.target_source == "overall" and result.by == "samples"
    counts = np.bincount(_samples(plans["wrap"])["dataset_id"], minlength=3)
    assert [d.target for d in result.datasets] == pytest.approx(list(counts / counts.sum()))


def test_audit_by_tokens_needs_tokens(plans) -> None:
    result = _invoke("audit", str(plans["samples"]), "-b", "4", "--by", "tokens")
    assert result.exit_code == 1
    assert result.stderr.startswith("zephon: error: by must be 'samples' for a plan without token counts, got 'tokens'")


def test_audit_small_datasets_never_fail(plans, tmp_path) -> None:
    planted = _planted(plans["samples"], tmp_path / "planted", 100)
    result = audit_plan(planted, AuditSpec(batch_size=4, window=5, tolerance_pp=5, min_weight=0.6))
    assert result.ok and not any(d.checked for d in result.datasets)


def test_audit_plot_writes_a_png_and_explains_a_missing_matplotlib(plans, tmp_path, monkeypatch) -> None:
    out = tmp_path / "shares.png"
    result = _invoke("audit", str(plans["wrap"]), "-b", "2", "-w", "5", "-t", "100", "--plot", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match=r"^matplotlib must be installed to plot the audit, got ModuleNotFoundError"):
        plot_shares(audit_plan(plans["wrap"], AuditSpec(batch_size=2)), tmp_path / "x.png")


# ----------------------------------------------------------------------------------------------------
# zephon diff
# ----------------------------------------------------------------------------------------------------


def _documents(plan: Path) -> list[tuple[str, int]]:
    uris = pq.read_table(plan / "shards.parquet").column("uri").to_pylist()
    s = _samples(plan)
    return [(uris[i], int(r)) for i, r in zip(s["shard_id"], s["row"], strict=True)]


def _first_mismatch(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_diff_of_another_seed(corpus, plans, tmp_path) -> None:
    other = _source(corpus, num_documents=200, seed=4).plan(tmp_path / "seed4")
    d = diff_plans(plans["samples"], other, batch_size=4)
    first = _first_mismatch(_documents(plans["samples"]), _documents(other))
    assert d.config_changes == (ConfigChange(path="seed", a=3, b=4),)
    assert d.first_difference is not None and d.first_difference.position == first
    assert (d.first_difference.step_a, d.first_difference.step_b) == (first // 4, first // 4)
    assert d.datasets == (
        DatasetVolumes(name="a", documents_a=100, documents_b=100, tokens_a=None, tokens_b=None),
        DatasetVolumes(name="b", documents_a=60, documents_b=60, tokens_a=None, tokens_b=None),
        DatasetVolumes(name="c", documents_a=40, documents_b=40, tokens_a=None, tokens_b=None),
    )
    assert (d.shards_added, d.shards_removed, d.identical) == ((), (), False)
    doc_a, doc_b = _documents(plans["samples"])[first], _documents(other)[first]
    short = short_uris([doc_a[0], doc_b[0]])
    ha, hb = read_manifest(plans["samples"]).config_hash[:12], read_manifest(other).config_hash[:12]
    name_a, name_b = Path(doc_a[0]).parent.name, Path(doc_b[0]).parent.name
    result = _invoke("diff", str(plans["samples"]), str(other), "-b", "4")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"diff {plans['samples']} → {other}\n"
        f"config {ha} → {hb}: 1 difference\n"
        "  seed  3 → 4\n"
        f"first difference: position {first} (step {first // 4} in A, step {first // 4} in B)\n"
        f"  A  {name_a}  {short[doc_a[0]]}  row {doc_a[1]}\n"
        f"  B  {name_b}  {short[doc_b[0]]}  row {doc_b[1]}\n"
        "documents: 200 → 200\n"
        "  dataset  documents A  documents B  Δ documents\n"
        "  -------  -----------  -----------  -----------\n"
        "  a                100          100            0\n"
        "  b                 60           60            0\n"
        "  c                 40           40            0\n"
        "shards: 0 added, 0 removed\n"
    )


def test_diff_of_another_weight_counts_documents_and_tokens_moved(corpus, plans, tmp_path, tokenizer_dir) -> None:
    weights = {"a": 0.4, "b": 0.4, "c": 0.2}
    other = _source(corpus, weights=weights, token_estimation=TokenEstimation(primer=0.25), exact_tokens=True).plan(
        tmp_path / "w", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=PackSpec(max_length=L), workers=1
    )
    d = diff_plans(plans["wrap"], other)
    assert d.config_changes == (
        ConfigChange(path="mixture.weights.a", a="1/2", b="2/5"),
        ConfigChange(path="mixture.weights.b", a="3/10", b="2/5"),
    )
    first = _first_mismatch(_documents(plans["wrap"]), _documents(other))
    assert d.first_difference is not None and d.first_difference.position == first
    assert d.first_difference.step_a is None  # no batch size given
    for plan, side in ((plans["wrap"], "a"), (other, "b")):
        s = _samples(plan)
        docs = np.bincount(s["dataset_id"], minlength=3).tolist()
        toks = np.bincount(s["dataset_id"], weights=s["tokens"], minlength=3).astype(int).tolist()
        assert [getattr(v, f"documents_{side}") for v in d.datasets] == docs
        assert [getattr(v, f"tokens_{side}") for v in d.datasets] == toks
    data = json.loads(_invoke("diff", str(plans["wrap"]), str(other), "-f", "json").stdout)
    assert data["config_changes"] == [
        {"path": "mixture.weights.a", "a": "1/2", "b": "2/5"},
        {"path": "mixture.weights.b", "a": "3/10", "b": "2/5"},
    ]
    assert data["first_difference"]["position"] == first and data["first_difference"]["step_a"] is None


def test_diff_of_an_added_shard(corpus, tmp_path) -> None:
    copy = tmp_path / "corpus"
    shutil.copytree(corpus, copy)
    before = _source(copy, num_documents=200).plan(tmp_path / "before")
    write_parquet_dataset(tmp_path / "extra", "c", [30])
    added = copy / "c" / "part-00001.parquet"
    shutil.copy(tmp_path / "extra" / "c" / "part-00000.parquet", added)
    after = _source(copy, num_documents=200).plan(tmp_path / "after")

    d = diff_plans(before, after)
    fingerprint = pq.read_table(after / "shards.parquet").to_pylist()[-1]["fingerprint"]
    assert [(s.dataset, s.uri, s.fingerprint) for s in d.shards_added] == [("c", str(added), fingerprint)]
    assert d.shards_removed == ()
    ca, cb = read_manifest(before).config["datasets"][2], read_manifest(after).config["datasets"][2]
    assert d.config_changes == (
        ConfigChange(path="datasets.2.shards", a=1, b=2),
        ConfigChange(path="datasets.2.rows", a=80, b=110),
        ConfigChange(path="datasets.2.fingerprint", a=ca["fingerprint"], b=cb["fingerprint"]),
    )
    first = _first_mismatch(_documents(before), _documents(after))
    assert d.first_difference is not None and d.first_difference.position == first
    lines = _invoke("diff", str(before), str(after)).stdout.splitlines()
    assert lines[-2:] == ["shards: 1 added, 0 removed", f"  + c  part-00001.parquet  {fingerprint}"]


def test_diff_of_a_plan_with_itself_is_empty(plans) -> None:
    result = _invoke("diff", str(plans["best_fit"]), str(plans["best_fit"]))
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[1].endswith(": 0 differences")
    assert (
        lines[2]
        == f"first difference: none (the same {read_manifest(plans['best_fit']).totals.documents} documents in the same order)"
    )
    assert lines[-1] == "shards: 0 added, 0 removed"
