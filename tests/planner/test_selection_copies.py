"""materialize_selections: the plan's compact copies of its selected shards' rows (docs/curricula.md).

Copies are checked against the source files with pyarrow; runs are compared batch for batch with the same plan
read from the source.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon import Pipeline
from zephon.errors import ConfigError, DatasetError, PlanFormatError
from zephon.io import Dataset
from zephon.plan.format import COPY_ROW_COLUMN
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

SHARDS, ROWS = 3, 50


def keys_in_text(record: dict) -> dict:
    """A user operator that writes the record's column names into its text: a run shows exactly what it got."""
    return {**record, "text": f"{','.join(sorted(record))} {record['text']}"}


def _write(root: Path, name: str, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    (root / name).mkdir(parents=True)
    for s in range(SHARDS):
        score = rng.integers(0, 6, ROWS)
        text = [f"{name} {s}-{r} " + "word " * int(1 + (r * 7) % 11) for r in range(ROWS)]
        meta = [{"url": f"u{s}/{r}", "n": int(r)} for r in range(ROWS)]
        table = pa.table({"id": [f"{name}-{s}-{r}" for r in range(ROWS)], "text": text, "score": score, "meta": meta})
        codec = "zstd" if name == "web" else "snappy"  # copies take the source's codec
        pq.write_table(table, root / name / f"{s}.parquet", row_group_size=8, compression=codec)
    return root / name


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    _write(root, "web", 1)
    _write(root, "books", 2)
    return root


def _source(
    corpus: Path, *, exact: bool = False, epochs: int = 2, where: str = "score >= 4"
) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[
            Dataset.from_path("web", corpus / "web", where=where),
            Dataset.from_path("books", corpus / "books"),
        ],
        mixture=MixtureSpec({"web": 0.6, "books": 0.4}),
        seed=3,
        epochs=epochs,
        exact_tokens=exact,
        token_estimation=None if exact else TokenEstimation(calibration_samples=20),
        on_exhaustion="new_epoch",
    )


def _plan(corpus: Path, out: Path, tokenizer_dir: str, *, exact: bool = False, copies: bool = True, **kw) -> Path:
    from zephon.specs import PackSpec, TokenizeSpec

    tok, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=33)
    return _source(corpus, exact=exact).plan(out, tokenize=tok, pack=pack, materialize_selections=copies, **kw)


def _batches(plan: Path, tokenizer_dir: str, *ops) -> list[bytes]:
    pipe = Pipeline.from_plan(plan)
    for op in ops:
        pipe = pipe.map_transform(op)
    pipe = pipe.tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=33)
    return [b.tokens.tobytes() + b.lengths.tobytes() for b in pipe.batch(microbatch_size=2)]


def test_each_copy_holds_exactly_the_planned_rows_of_its_shard_and_the_plan_is_unchanged(
    corpus, tmp_path, tokenizer_dir
) -> None:
    plan = _plan(corpus, tmp_path / "p", tokenizer_dir)
    bare = _plan(corpus, tmp_path / "bare", tokenizer_dir, copies=False)
    for name in ("samples.parquet", "shards.parquet"):
        assert (plan / name).read_bytes() == (bare / name).read_bytes()
    manifest, bare_manifest = (json.loads((p / "plan.json").read_text()) for p in (plan, bare))
    assert manifest["config_hash"] == bare_manifest["config_hash"]
    samples = pq.read_table(plan / "samples.parquet").to_pydict()
    shards = pq.read_table(plan / "shards.parquet").to_pydict()
    uri = dict(zip(shards["shard_id"], shards["uri"], strict=True))
    web = [s for s, d in zip(shards["shard_id"], shards["dataset"], strict=True) if d == "web"]
    index = pq.read_table(plan / "selected.parquet").to_pydict()
    assert sorted(index["shard_id"]) == web  # every web shard has planned rows; books has no selection: no copy
    rows_total = 0
    for shard_id, file in zip(index["shard_id"], index["file"], strict=True):
        planned = sorted({r for s, r in zip(samples["shard_id"], samples["row"], strict=True) if s == shard_id})
        copy = pq.read_table(plan / "selected" / file)
        assert copy.column(COPY_ROW_COLUMN).to_pylist() == planned
        source = pq.read_table(uri[shard_id])
        assert copy.drop_columns([COPY_ROW_COLUMN]).equals(source.take(pa.array(planned)))
        assert all(source.column("score").to_numpy()[planned] >= 4)
        meta = pq.ParquetFile(plan / "selected" / file).metadata
        assert meta.row_group(0).column(1).compression == "ZSTD" and meta.row_group(0).num_rows == 8
        rows_total += len(planned)
    copies = manifest["selected_copies"]
    assert list(copies) == ["web"] and copies["web"]["shards"] == SHARDS and copies["web"]["rows"] == rows_total
    assert copies["web"]["bytes"] == sum(index["bytes"])
    again = _plan(corpus, tmp_path / "again", tokenizer_dir)  # the same plan writes the same copies, byte for byte
    for file in index["file"]:
        assert (again / "selected" / file).read_bytes() == (plan / "selected" / file).read_bytes()


@pytest.mark.parametrize("exact", [False, True], ids=["estimated", "exact"])
def test_a_run_reads_the_copies_and_yields_the_same_batches(corpus, tmp_path, tokenizer_dir, exact) -> None:
    plan = _plan(corpus, tmp_path / "p", tokenizer_dir, exact=exact)
    bare = _plan(corpus, tmp_path / "bare", tokenizer_dir, exact=exact, copies=False)
    want = _batches(bare, tokenizer_dir)
    assert _batches(plan, tokenizer_dir) == want
    if not exact:  # record mode (an exact plan runs with the operators it was counted with): no column added
        assert _batches(plan, tokenizer_dir, keys_in_text) == _batches(bare, tokenizer_dir, keys_in_text)
    shutil.rmtree(corpus / "web")  # the selected source is gone: the run reads only the plan's copies
    assert _batches(plan, tokenizer_dir) == want
    with pytest.raises(DatasetError, match=r"dataset 'web': shard \S+/web/\d\.parquet must exist as planned"):
        _batches(bare, tokenizer_dir)


def test_a_missing_or_changed_copy_is_one_line_naming_it(corpus, tmp_path, tokenizer_dir) -> None:
    plan = _plan(corpus, tmp_path / "p", tokenizer_dir)
    files = sorted((plan / "selected").iterdir())
    files[0].rename(tmp_path / "away.parquet")
    with pytest.raises(
        DatasetError, match=r"^dataset 'web': the copy \S+ of shard \S+ must exist as planned, got No such"
    ):
        _batches(plan, tokenizer_dir)
    shutil.copyfile(files[1], files[0])  # another shard's copy in its place
    with pytest.raises(
        DatasetError, match=r"^dataset 'web': (the copy \S+ of shard \S+ must be \d+ bytes|shard \S+ changed)"
    ):
        _batches(plan, tokenizer_dir)
    (plan / "selected.parquet").write_bytes(b"not parquet")
    with pytest.raises(PlanFormatError, match=r"selected\.parquet"):
        Pipeline.from_plan(plan).num_steps()


def test_materialize_needs_a_parquet_selection(corpus, tmp_path, tokenizer_dir) -> None:
    books = Dataset.from_path("books", corpus / "books")
    plain = StaticMixtureWorkSource(datasets=[books], mixture=MixtureSpec({"books": 1.0}), seed=1)
    with pytest.raises(ConfigError, match=r"^materialize_selections copies the rows of datasets with a selection"):
        plain.plan(tmp_path / "p", materialize_selections=True)
    assert not (tmp_path / "p").exists()
    (corpus / "lines").mkdir()
    (corpus / "lines" / "a.jsonl").write_text("".join(json.dumps({"text": f"t{i}", "k": i}) + "\n" for i in range(9)))
    jsonl = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("lines", corpus / "lines", where="k > 3")],
        mixture=MixtureSpec({"lines": 1.0}),
        seed=1,
    )
    with pytest.raises(
        ConfigError, match=r"^materialize_selections copies Parquet shards, got dataset 'lines' with shard"
    ):
        jsonl.plan(tmp_path / "q", materialize_selections=True)
    assert not (tmp_path / "q").exists()


def test_overwrite_replaces_a_bundle_with_copies_but_never_a_foreign_file_among_them(corpus, tmp_path, tokenizer_dir):
    plan = _plan(corpus, tmp_path / "p", tokenizer_dir)
    _plan(corpus, plan, tokenizer_dir, overwrite=True)  # a bundle with copies is ours to replace
    assert (plan / "selected.parquet").is_file()
    (plan / "selected" / "notes.txt").write_text("mine")
    before = sorted(p.name for p in plan.rglob("*"))
    with pytest.raises(ConfigError, match=r"overwrite replaces only a plan bundle, got \S+ with 'selected' in it"):
        _plan(corpus, plan, tokenizer_dir, overwrite=True)
    assert sorted(p.name for p in plan.rglob("*")) == before


def test_zephon_plan_materialize_selections_writes_and_reports_the_copies(corpus, tmp_path) -> None:
    from click.testing import CliRunner

    from zephon.cli import cli

    (tmp_path / "c.yaml").write_text(
        f"seed: 3\ndatasets:\n  - {{name: web, path: {corpus / 'web'}, where: 'score >= 4'}}\n"
        f"  - {{name: books, path: {corpus / 'books'}}}\nmixture: {{web: 1, books: 1}}\n"
    )
    out = tmp_path / "plan"
    result = CliRunner().invoke(cli, ["plan", str(tmp_path / "c.yaml"), "-o", str(out), "--materialize-selections"])
    assert result.exit_code == 0, result.output
    copies = json.loads((out / "plan.json").read_text())["selected_copies"]["web"]
    assert f"  copies of web: {copies['rows']} planned rows of {SHARDS} shards in selected/" in result.output
    assert len(list((out / "selected").iterdir())) == SHARDS


def test_a_continued_plan_with_copies_runs_as_without(corpus, tmp_path, tokenizer_dir) -> None:
    """A continuation's kept steps and its new segment read their copies too (copies of the child's own samples)."""
    from zephon.specs import PackSpec, TokenizeSpec

    parent = _plan(corpus, tmp_path / "parent", tokenizer_dir, exact=True, copies=False)
    tok, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=33)
    child = _source(corpus, exact=True, epochs=3)  # one more pass than the parent
    kw = {"continue_from": parent, "at_step": 3, "global_batch": 2, "tokenize": tok, "pack": pack}
    copied = child.plan(tmp_path / "copied", materialize_selections=True, **kw)
    bare = child.plan(tmp_path / "bare", **kw)
    assert (copied / "samples.parquet").read_bytes() == (bare / "samples.parquet").read_bytes()
    assert json.loads((copied / "plan.json").read_text())["selected_copies"]["web"]["shards"] == SHARDS
    want = _batches(bare, tokenizer_dir)
    shutil.rmtree(corpus / "web")
    assert _batches(copied, tokenizer_dir) == want


def test_a_row_the_copy_lacks_is_an_error_naming_both_files(corpus, tmp_path, tokenizer_dir) -> None:
    from zephon.executor.plan_reader import PlanBundle
    from zephon.executor.read.shard_reader import ShardReader

    plan = _plan(corpus, tmp_path / "p", tokenizer_dir)
    bundle = PlanBundle(plan)
    shard_id = next(iter(bundle.copies))
    reader = ShardReader(bundle.shards, "text", capacity=2, copies=bundle.copies)
    kept = reader.open_shard(shard_id).text.source_rows  # type: ignore[union-attr]
    assert reader.texts(np.full(2, shard_id), kept[[-1, 0]])[0].startswith("web ")
    for missing in (int(np.setdiff1d(np.arange(ROWS), kept)[0]), ROWS + 5):  # a gap, and past the last copied row
        rows = np.array([kept[0], missing])
        with pytest.raises(DatasetError, match=rf"^dataset 'web': row {missing} of shard \S+ must be in its copy "):
            reader.texts(np.full(2, shard_id), rows)


def test_a_pipeline_plans_with_copies_into_a_cached_bundle_of_its_own(corpus, tmp_path, tokenizer_dir) -> None:
    """``Pipeline(ws).options(materialize_selections=True, plan_workers=, plan_progress=)`` reaches the planner: the
    cache holds the bundle with copies beside the one without, and both run the same batches."""

    def run(copies: bool) -> tuple[Path, list[bytes]]:
        pipe = Pipeline(_source(corpus)).options(materialize_selections=copies, plan_workers=1, plan_progress=False)
        pipe = pipe.tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=33).batch(microbatch_size=2)
        return pipe.plan_dir, [b.tokens.tobytes() + b.lengths.tobytes() for b in pipe]

    with_copies, batches = run(True)
    bare, bare_batches = run(False)
    assert with_copies.name == bare.name + "-copies" and with_copies.parent == bare.parent
    assert (with_copies / "selected.parquet").is_file() and not (bare / "selected.parquet").exists()
    assert batches == bare_batches
    assert run(True)[0] == with_copies  # found in the cache the next time


def test_planning_options_on_a_written_plan_are_refused_in_one_line(corpus, tmp_path, tokenizer_dir) -> None:
    plan = _plan(corpus, tmp_path / "p", tokenizer_dir, copies=False)
    with pytest.raises(ConfigError, match=r"^plan_workers, plan_progress and materialize_selections must go to the"):
        Pipeline.from_plan(plan).options(materialize_selections=True)
    with pytest.raises(ConfigError, match=r"^plan_workers must be an integer ≥ 1, got 0"):
        Pipeline(_source(corpus)).options(plan_workers=0)
