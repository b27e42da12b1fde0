"""Selections by metadata: where, sidecar metadata, subsets of one source, order_by, dedup_on (docs/curricula.md).

Every check recomputes the expected rows from the Parquet files with pyarrow, not with the planner's DuckDB.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.raw_strings import raw_strings
from tokenizers import Tokenizer

from zephon.config_file import load_work_source
from zephon.errors import ConfigError, DatasetError
from zephon.executor.runner import iterate_batches
from zephon.executor.settings import ExecutorSpec
from zephon.io import Dataset
from zephon.plan.manifest import read_manifest
from zephon.planner.prepare import prepare
from zephon.specs import BatchSpec, PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

SHARDS, ROWS = 4, 60


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """web/: 4 shards × 60 rows (row groups of 10) with id, text, score 0-5, lang; side/: quality per id
    (every id but the first of each shard, plus 3 ids no document has), cluster ids in pairs."""
    root = tmp_path_factory.mktemp("sel")
    (root / "web").mkdir()
    (root / "side").mkdir()
    rng = np.random.default_rng(7)
    ids, quality, cluster = [], [], []
    for s in range(SHARDS):
        score = rng.integers(0, 6, ROWS)
        lang = np.where(rng.random(ROWS) < 0.8, "en", "fr")
        shard_ids = [f"w{s}-{r}" for r in range(ROWS)]
        text = [("hi " if sc >= 3 else "lo ") * int(2 + r % 5) + f"s{s}" for r, sc in enumerate(score)]
        table = pa.table({"id": shard_ids, "text": text, "score": score, "lang": lang})
        pq.write_table(table, root / "web" / f"{s}.parquet", row_group_size=10)
        for r in range(1, ROWS):
            ids.append(shard_ids[r])
            quality.append(float(rng.random()))
            cluster.append(f"c{(s * ROWS + r) // 2}")
    ids += ["ghost-1", "ghost-2", "ghost-3"]
    quality += [0.5, 0.5, 0.5]
    cluster += ["g", "g", "g"]
    pq.write_table(pa.table({"id": ids, "quality": quality, "cluster": cluster}), root / "side" / "q.parquet")
    return root


def _table(corpus: Path) -> dict[str, np.ndarray]:
    """Every document of web/ with its shard and row, plus the sidecar's columns (NaN / None without a row)."""
    parts = [pq.read_table(corpus / "web" / f"{s}.parquet").to_pydict() for s in range(SHARDS)]
    side = pq.read_table(corpus / "side" / "q.parquet").to_pydict()
    q = dict(zip(side["id"], side["quality"], strict=True))
    c = dict(zip(side["id"], side["cluster"], strict=True))
    ids = [i for p in parts for i in p["id"]]
    return {
        "shard": np.repeat(np.arange(SHARDS), ROWS),
        "row": np.tile(np.arange(ROWS), SHARDS),
        "score": np.concatenate([p["score"] for p in parts]),
        "lang": np.array([x for p in parts for x in p["lang"]]),
        "quality": np.array([q.get(i, np.nan) for i in ids]),
        "cluster": np.array([c.get(i) for i in ids], dtype=object),
    }


def _source(*datasets: Dataset, weights: dict[str, float] | None = None, **kw) -> StaticMixtureWorkSource:
    weights = weights or {d.name: 1.0 for d in datasets}
    return StaticMixtureWorkSource(datasets=list(datasets), mixture=MixtureSpec(weights), seed=kw.pop("seed", 5), **kw)


def _samples(plan: Path) -> dict[str, np.ndarray]:
    samples = pq.read_table(plan / "samples.parquet").to_pydict()
    shards = pq.read_table(plan / "shards.parquet").to_pydict()
    local = {sid: int(Path(uri).stem) for sid, uri in zip(shards["shard_id"], shards["uri"], strict=True)}
    return {
        "dataset": np.array(samples["dataset_id"]),
        "shard": np.array([local[s] for s in samples["shard_id"]]),
        "row": np.array(samples["row"]),
        "epoch": np.array(samples["epoch"]),
    }


def _codes(shard: np.ndarray, row: np.ndarray) -> np.ndarray:
    return np.asarray(shard) * ROWS + np.asarray(row)


def test_where_plans_exactly_the_rows_satisfying_the_predicate_each_once_per_epoch(corpus, tmp_path) -> None:
    ds = Dataset.from_path("web", corpus / "web", where="score >= 3 AND lang = 'en'")
    plan = _source(ds, epochs=2).plan(tmp_path / "p")
    t = _table(corpus)
    want = np.flatnonzero((t["score"] >= 3) & (t["lang"] == "en"))
    got = _samples(plan)
    codes = _codes(got["shard"], got["row"])
    for epoch in (0, 1):
        assert np.array_equal(np.sort(codes[got["epoch"] == epoch]), want)
    assert len(codes) == 2 * len(want)
    entry = json.loads((plan / "plan.json").read_text())["datasets"][0]
    assert entry["selection"] == {
        "where": "score >= 3 AND lang = 'en'",
        "rows": SHARDS * ROWS,
        "selected": len(want),
        "skipped_by_where": SHARDS * ROWS - len(want),
        "skipped_by_dedup": 0,
    }
    assert entry["passes_completed"] == 2
    assert read_manifest(plan).datasets[0].documents == len(want)


def test_the_executor_yields_only_selected_documents(corpus, tmp_path, tokenizer_dir) -> None:
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    pack = PackSpec(max_length=33)
    tok_est = TokenEstimation(calibration_samples=40)
    for exact in (False, True):
        ds = Dataset.from_path("web", corpus / "web", where="score >= 3")
        source = _source(ds, token_estimation=None if exact else tok_est, exact_tokens=exact)
        plan = source.plan(tmp_path / f"p{exact}", tokenize=tok, pack=pack)
        decoder = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
        words: set[str] = set()
        spec = ExecutorSpec(tokenize=tok, pack=pack, batch=BatchSpec(microbatch_size=4))
        for batch in iterate_batches(plan, spec):
            for tokens, n in zip(batch.tokens, batch.lengths, strict=True):
                words |= set(decoder.decode(tokens[:n].tolist()).split())
        assert "hi" in words and "lo" not in words, (exact, words)


def test_sidecar_columns_filter_and_unmatched_keys_are_counted(corpus, tmp_path) -> None:
    ds = Dataset.from_path("web", corpus / "web", where="quality > 0.5", metadata=corpus / "side", key="id")
    plan = _source(ds).plan(tmp_path / "p")
    t = _table(corpus)
    want = np.flatnonzero(t["quality"] > 0.5)  # NaN (no sidecar row) compares false, like SQL NULL
    got = _samples(plan)
    assert np.array_equal(np.sort(_codes(got["shard"], got["row"])), want)
    sel = json.loads((plan / "plan.json").read_text())["datasets"][0]["selection"]
    assert sel["sidecar"]["documents_without_metadata"] == SHARDS  # the first row of each shard
    assert sel["sidecar"]["metadata_without_document"] == 3  # the ghosts
    assert sel["sidecar"]["rows"] == SHARDS * (ROWS - 1) + 3
    assert sel["sidecar"]["fingerprint"].startswith("sha256:")


def test_a_changed_sidecar_changes_the_plan_hash(corpus, tmp_path) -> None:
    side = tmp_path / "side"
    side.mkdir()
    table = pq.read_table(corpus / "side" / "q.parquet")
    pq.write_table(table, side / "q.parquet")
    ds = Dataset.from_path("web", corpus / "web", where="quality > 0.5", metadata=side, key="id")
    before = prepare(_source(ds)).config_hash
    assert prepare(_source(ds)).config_hash == before
    quality = table.column("quality").to_pylist()
    quality[10] = 0.123456  # one score, same selection
    pq.write_table(table.set_column(1, "quality", pa.array(quality)), side / "q.parquet")
    assert prepare(_source(ds)).config_hash != before


def test_duplicate_sidecar_keys_are_refused_with_an_example(corpus, tmp_path) -> None:
    pq.write_table(pa.table({"id": ["w0-1", "w0-2", "w0-2"], "quality": [1.0, 2.0, 3.0]}), tmp_path / "dup.parquet")
    ds = Dataset.from_path("web", corpus / "web", metadata=tmp_path / "dup.parquet", key="id", where="quality > 0")
    with pytest.raises(DatasetError, match=r"sidecar key 'id' must be unique, got 2 rows for 'w0-2'"):
        prepare(_source(ds))
    # A duplicated key that no document has is refused too.
    pq.write_table(pa.table({"id": ["w0-1", "zz", "zz", "zz"], "quality": [1.0, 2, 3, 4]}), tmp_path / "dup2.parquet")
    ds = Dataset.from_path("web", corpus / "web", metadata=tmp_path / "dup2.parquet", key="id", where="quality > 0")
    with pytest.raises(DatasetError, match=r"sidecar key 'id' must be unique, got 3 rows for 'zz'"):
        prepare(_source(ds))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"where": "nope > 1"}, r"dataset 'web': where names column 'nope', which the dataset lacks — it has id, "),
        ({"where": "score >="}, r"dataset 'web': where must be a DuckDB SQL expression, got 'score >='"),
        ({"order_by": "missing DESC"}, r"dataset 'web': order_by names column 'missing'"),
        ({"dedup_on": "nada"}, r"dataset 'web': dedup_on names column 'nada'"),
        ({"where": "score > 100"}, r"selection must keep at least one row, got 0 of 240"),
        ({"metadata": "side"}, r"metadata= needs key= too"),
        ({"where": "  "}, r"where must be a non-empty SQL predicate, got '  ' — write e.g. where=\"int_score >= 3\""),
        ({"metadata": "", "key": "id"}, r"metadata must be a non-empty path of a sidecar table, got '' — write e.g. "
         r"metadata=\"scores/\*\.parquet\""),
        ({"metadata": "side", "key": " "}, r"key must be a non-empty column name, got ' ' — write e.g. key=\"id\""),
        ({"order_by": ""}, r"order_by must be a non-empty column or SQL expression, got '' — write e.g. "
         r"order_by=\"quality DESC\""),
    ],
)
def test_bad_selections_fail_in_one_line(corpus, kw, message) -> None:
    if kw.get("metadata") == "side":
        kw = {**kw, "metadata": corpus / "side"}
    with pytest.raises((ConfigError, DatasetError), match=message) as info:
        prepare(_source(Dataset.from_path("web", corpus / "web", **kw)))
    assert "\n" not in str(info.value)


def test_strings_that_are_not_utf8_are_blamed_on_the_data_not_the_expression(tmp_path) -> None:
    """DuckDB checks the UTF-8 of the strings a selection reads: one line naming the file and the value, with the
    data's fix (the expression is right) — whether the bad column is the dataset's or the sidecar's."""
    (tmp_path / "web").mkdir()
    lang = raw_strings([b"en", b"fr", b"e\xffn", b"en"])
    shard = tmp_path / "web" / "0.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "text": ["t"] * 4, "lang": lang}), shard)
    message = "^" + re.escape(
        f"dataset 'web': {shard} must hold UTF-8 strings in the columns where=\"lang = 'en'\" reads, got the value "
        '"e\\xFFn" — write those columns again as UTF-8, or select on other columns'
    )
    with pytest.raises(DatasetError, match=message):
        prepare(_source(Dataset.from_path("web", tmp_path / "web", where="lang = 'en'")))
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "text": ["t"] * 4}), shard)
    side = tmp_path / "side.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "lang": lang}), side)
    with pytest.raises(DatasetError, match=rf"^dataset 'web': {re.escape(str(side))} must hold UTF-8 strings"):
        prepare(_source(Dataset.from_path("web", tmp_path / "web", metadata=side, key="id", where="lang = 'en'")))


def test_sidecar_key_missing_and_column_clash_are_refused(corpus, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"key 'uid' must be a column of the dataset table, got columns id, text"):
        prepare(_source(Dataset.from_path("web", corpus / "web", metadata=corpus / "side", key="uid")))
    pq.write_table(pa.table({"id": ["w0-1"], "score": [1]}), tmp_path / "clash.parquet")
    with pytest.raises(ConfigError, match=r"sidecar column 'score' must not also be a dataset column"):
        prepare(_source(Dataset.from_path("web", corpus / "web", metadata=tmp_path / "clash.parquet", key="id")))


def test_subsets_of_one_source_mix_and_their_repetition_is_reported(corpus, tmp_path) -> None:
    web = corpus / "web"
    hq = Dataset.from_path("web_hq", web, where="score >= 4")
    rest = Dataset.from_path("web", web, where="score >= 2")  # overlaps web_hq on purpose
    plan = _source(hq, rest, weights={"web_hq": 0.5, "web": 0.5}, num_documents=400).plan(tmp_path / "p")
    t = _table(corpus)
    got = _samples(plan)
    codes = _codes(got["shard"], got["row"])
    for index, mask in ((0, t["score"] >= 4), (1, t["score"] >= 2)):
        assert set(codes[got["dataset"] == index]) <= set(np.flatnonzero(mask))
        assert (got["dataset"] == index).sum() == 200
    m = json.loads((plan / "plan.json").read_text())
    (src,) = m["sources"]
    n_hq, n_rest = int((t["score"] >= 4).sum()), int((t["score"] >= 2).sum())
    assert src["datasets"] == ["web_hq", "web"]
    assert src["documents"] == n_rest and src["in_several_selections"] == n_hq
    reads = np.bincount(codes, minlength=SHARDS * ROWS)[t["score"] >= 2]
    assert src["reads_per_document"] == {"min": int(reads.min()), "max": int(reads.max())}


def test_order_by_reads_in_key_order_nulls_last_with_local_windows(corpus, tmp_path) -> None:
    t = _table(corpus)
    strict = Dataset.from_path(
        "web", corpus / "web", metadata=corpus / "side", key="id", order_by="quality DESC", order_window=1
    )
    got = _samples(_source(strict).plan(tmp_path / "strict"))
    q = t["quality"][_codes(got["shard"], got["row"])]
    known = q[~np.isnan(q)]
    assert np.all(np.diff(known) <= 0) and np.isnan(q[-SHARDS:]).all()  # descending, the 4 NULLs last
    windowed = Dataset.from_path("web", corpus / "web", order_by="score", order_window=16)
    got = _samples(_source(windowed, epochs=2).plan(tmp_path / "win"))
    codes = _codes(got["shard"], got["row"])
    order = np.lexsort((t["row"], t["shard"], t["score"]))  # key, then shard, then row
    for epoch in (0, 1):
        run = codes[got["epoch"] == epoch]
        for start in range(0, len(run), 16):  # each window holds exactly the next 16 in key order
            assert set(run[start : start + 16]) == set(order[start : start + 16])
    first, second = codes[got["epoch"] == 0], codes[got["epoch"] == 1]
    assert not np.array_equal(first, second)  # windows shuffled per epoch


def test_dedup_keeps_one_document_per_key_chosen_by_the_seed(corpus, tmp_path) -> None:
    t = _table(corpus)
    picks = []
    for seed in (1, 2):
        ds = Dataset.from_path("web", corpus / "web", metadata=corpus / "side", key="id", dedup_on="cluster")
        plan = _source(ds, seed=seed).plan(tmp_path / f"p{seed}")
        got = _samples(plan)
        codes = np.sort(_codes(got["shard"], got["row"]))
        clusters = t["cluster"][codes]
        keyed = clusters[clusters != None]  # noqa: E711 - object array comparison
        assert len(set(keyed)) == len(keyed)  # one per cluster
        assert set(keyed) == {c for c in t["cluster"] if c is not None}
        assert (clusters == None).sum() == SHARDS  # noqa: E711 - documents without a key are all kept
        sel = json.loads((plan / "plan.json").read_text())["datasets"][0]["selection"]
        assert sel["skipped_by_dedup"] == SHARDS * ROWS - len(codes)
        picks.append(codes)
        again = _samples(_source(ds, seed=seed).plan(tmp_path / f"q{seed}"))
        assert np.array_equal(np.sort(_codes(again["shard"], again["row"])), codes)  # deterministic
    assert not np.array_equal(picks[0], picks[1])  # the seed chooses


def test_config_file_keys_select(corpus, tmp_path) -> None:
    (tmp_path / "c.yaml").write_text(
        f"seed: 3\ndatasets:\n  - {{name: web, path: {corpus / 'web'}, where: 'score = 5', metadata: "
        f"{corpus / 'side'}, key: id, order_by: quality, order_window: 8, dedup_on: cluster}}\nmixture: {{web: 1}}\n"
    )
    ds = load_work_source(tmp_path / "c.yaml").datasets[0]
    assert ds.selection is not None
    assert (ds.selection.where, ds.selection.order_window, ds.selection.dedup_on) == ("score = 5", 8, "cluster")
    (tmp_path / "bad.yaml").write_text(
        f"seed: 3\ndatasets:\n  - {{name: web, path: {corpus / 'web'}, order_window: 0}}\nmixture: {{web: 1}}\n"
    )
    with pytest.raises(ConfigError, match=r"bad.yaml: `datasets\[0\].order_window` must be"):
        load_work_source(tmp_path / "bad.yaml")


def test_a_dataset_without_selection_plans_as_before(corpus, tmp_path) -> None:
    plain = _source(Dataset.from_path("web", corpus / "web")).plan(tmp_path / "a")
    assert Dataset.from_path("web", corpus / "web", order_window=7).selection is None
    m = json.loads((plain / "plan.json").read_text())
    assert "selection" not in m["datasets"][0] and "sources" not in m


def test_sql_metadata_view_and_audit_by_column_report_the_column_over_training(corpus, tmp_path) -> None:
    from click.testing import CliRunner

    from zephon.cli.app import cli
    from zephon.inspection.column_audit import column_windows
    from zephon.inspection.sql import run_sql

    ds = Dataset.from_path(
        "web", corpus / "web", metadata=corpus / "side", key="id", order_by="quality", order_window=1
    )
    plan = _source(ds).plan(tmp_path / "p")
    t = _table(corpus)
    got = _samples(plan)
    q = t["quality"][_codes(got["shard"], got["row"])]
    _, rows = run_sql(plan, "SELECT m.quality FROM samples s JOIN metadata m USING (shard_id, row) ORDER BY position")
    assert np.allclose(np.array([r[0] if r[0] is not None else np.nan for r in rows]), q, equal_nan=True)
    cw = column_windows(plan, "quality", batch_size=4, window=10)  # 40 documents per window
    for k, mean in enumerate(cw.means):
        part = q[k * 40 : (k + 1) * 40]
        assert np.isclose(mean, np.nanmean(part)) if (~np.isnan(part)).any() else np.isnan(mean)
    assert cw.nulls == SHARDS and np.all(np.diff(cw.means[~np.isnan(cw.means)]) > 0)  # ascending curriculum
    result = CliRunner().invoke(cli, ["audit", str(plan), "--by-column", "quality", "--batch-size", "4", "-w", "10"])
    assert result.exit_code == 0 and result.output.startswith("quality: mean ")
    result = CliRunner().invoke(cli, ["audit", str(plan), "--by-column", "nope", "--batch-size", "4"])
    assert result.exit_code != 0 and "--by-column must name a metadata column" in result.output
    from zephon.inspection.show import show_step

    view = show_step(plan, 3, batch_size=4, columns=["quality", "score"], text=False)
    for r in view.rows:
        code = _codes(int(Path(r.uri).stem), r.row)
        assert r.metadata["score"] == t["score"][code]
        assert (
            (r.metadata["quality"] is None)
            if np.isnan(t["quality"][code])
            else r.metadata["quality"] == t["quality"][code]
        )
    result = CliRunner().invoke(cli, ["show", str(plan), "-s", "0", "--batch-size", "4", "--column", "quality"])
    assert result.exit_code == 0 and "quality" in result.output.splitlines()[1]


def test_the_curricula_doc_example_on_the_demo_sidecar(tmp_path, monkeypatch) -> None:
    """docs/curricula.md's worked example, run as written; its printed summary is the doc's."""
    import re

    from zephon.cli.plan_commands import plan_summary
    from zephon.demo import demo_scores_path
    from zephon.demo.scores import demo_scores_table

    monkeypatch.setenv("ZEPHON_DEMO_DIR", str(tmp_path / "demo-data"))
    assert demo_scores_table(0).equals(demo_scores_table(0)) and not demo_scores_table(0).equals(demo_scores_table(1))
    assert demo_scores_path() == demo_scores_path()  # written once, then reused
    doc = (Path(__file__).parents[2] / "docs" / "curricula.md").read_text(encoding="utf-8")
    code = doc.split("## Worked example on the demo data")[1].split("```python\n")[1].split("```")[0]
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(compile(code, "curricula.md", "exec"), names)  # the documented example, as written
    shown = doc.split("`zephon plan` (or")[1].split("```\n")[1].split("```")[0].splitlines()
    lines = plan_summary(read_manifest(tmp_path / "curriculum"), "curriculum")

    def masked(line: str) -> str:  # paths and the config hash (which hashes them) depend on the machine
        return re.sub(r"config \w+$", "config", re.sub(r"sidecar \S+ on", "sidecar on", line))

    assert [masked(x) for x in lines] == [masked(x) for x in shown]
    # "Copies of the selected rows": the same plan with copies prints the lines the doc shows, after the others
    names["work_source"].plan("curriculum", materialize_selections=True, overwrite=True)
    copied = doc.split("adds to its summary:")[1].split("```\n")[1].split("```")[0].splitlines()
    lines_copied = plan_summary(read_manifest(tmp_path / "curriculum"), "curriculum")
    assert [masked(x) for x in lines_copied] == [masked(x) for x in shown + copied]


def test_a_selection_past_duckdbs_memory_limit_says_which_setting_to_raise(corpus, tmp_path, monkeypatch) -> None:
    import zephon.planner.selection.evaluate as selection

    monkeypatch.setattr(selection, "MEMORY_LIMIT", "1KB")  # as ZEPHON_SELECT_MEMORY=1KB would set it
    ds = Dataset.from_path("web", corpus / "web", where="quality > 0.5", metadata=corpus / "side", key="id")
    with pytest.raises(ConfigError, match=r"must fit DuckDB's memory limit ZEPHON_SELECT_MEMORY=1KB, got .*raise") as e:
        _source(ds).plan(tmp_path / "p")
    assert "\n" not in str(e.value) and "None" not in str(e.value)  # names the settings given, only them
    assert "where='quality > 0.5'" in str(e.value) and "key='id'" in str(e.value)


@pytest.mark.parametrize("limit", ["2000000000", "2G", "1.5GiB"])
def test_a_memory_setting_duckdbs_parser_refuses_or_reads_otherwise_plans_the_same(corpus, tmp_path, monkeypatch, limit):
    """A plain number of bytes (which DuckDB's own ``memory_limit`` parser refuses) and every unit ``size_bytes``
    reads plan exactly what the default ``2GB`` plans: DuckDB is given the bytes."""
    import zephon.planner.selection.evaluate as selection

    ds = Dataset.from_path("web", corpus / "web", where="score >= 3")
    default = _source(ds).plan(tmp_path / "default")
    monkeypatch.setattr(selection, "MEMORY_LIMIT", limit)  # as ZEPHON_SELECT_MEMORY=<limit> would set it
    plan = _source(ds).plan(tmp_path / "p")
    assert (plan / "samples.parquet").read_bytes() == (default / "samples.parquet").read_bytes()
    assert len(_samples(plan)["row"]) > 0


def test_a_memory_setting_that_is_not_a_size_is_one_line_before_anything_is_made(corpus, tmp_path, monkeypatch):
    import zephon.planner.selection.evaluate as selection

    monkeypatch.setattr(selection, "MEMORY_LIMIT", "lots")  # as ZEPHON_SELECT_MEMORY=lots would set it
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)
    ds = Dataset.from_path("web", corpus / "web", where="score >= 3")
    refused = r"^ZEPHON_SELECT_MEMORY must be a size such as 2GB or 512MiB \(GB = 10\^9 bytes, GiB = 2\^30\), got 'lots'"
    with pytest.raises(ConfigError, match=refused):
        _source(ds).plan(tmp_path / "p")
    assert not (tmp_path / "p").exists() and list((tmp_path / "scratch").iterdir()) == []
