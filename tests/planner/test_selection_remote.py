"""Selections over remote shards and sidecars: s3:// gs:// az:// (real moto, fake-gcs, Azurite servers) and hf://
(the local Hub server), read through the storage layer, pinned (docs/curricula.md, "Remote datasets").

The bar: a plan over the remote copy schedules exactly what the plan over the local files does (samples.parquet
byte for byte, the same selection report, the same sidecar fingerprint), and reads the selection's columns only.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from zephon.errors import ConfigError, DatasetError
from zephon.executor.runner import iterate_batches
from zephon.executor.settings import ExecutorSpec
from zephon.io import Dataset
from zephon.planner.prepare import prepare
from zephon.specs import BatchSpec, PackSpec, StoreOptions, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

SHARDS, ROWS, GROUP = 3, 40, 10
#: Bytes of text per document: one row group's text chunk (80 KB) is wider than the fetch gap (64 KiB), so a
#: selection that fetched it would show in the bytes served.
TEXT = 8000


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=GROUP, compression="none")
    return sink.getvalue()


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    """web/{0,1,2}.parquet (id, text, score 0-5, lang) and side/q.parquet (quality and cluster per id, every id but
    each shard's first, plus two ids no document has)."""
    rng = np.random.default_rng(11)
    out, ids, quality, cluster = {}, [], [], []
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)
    for s in range(SHARDS):
        shard_ids = [f"w{s}-{r}" for r in range(ROWS)]
        text = [rng.choice(letters, TEXT).tobytes().decode() for _ in range(ROWS)]
        score = rng.integers(0, 6, ROWS)
        lang = np.where(rng.random(ROWS) < 0.75, "en", "fr").tolist()
        out[f"web/{s}.parquet"] = _parquet(pa.table({"id": shard_ids, "text": text, "score": score, "lang": lang}))
        for r in range(1, ROWS):
            ids.append(shard_ids[r])
            quality.append(float(rng.random()))
            cluster.append(f"c{(s * ROWS + r) // 3}")
    ids += ["ghost-1", "ghost-2"]
    quality += [0.9, 0.9]
    cluster += ["g", "g"]
    out["side/q.parquet"] = _parquet(pa.table({"id": ids, "quality": quality, "cluster": cluster}))
    return out


def _local(files: dict[str, bytes], root: Path) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _source(ds: Dataset, seed: int = 3) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({ds.name: 1.0}), seed=seed, epochs=2)


SELECTIONS = {
    "where": {"where": "score >= 3 AND lang = 'en'"},
    "sidecar": {"where": "quality > 0.4 OR score = 5", "key": "id"},
    "ordered": {"order_by": "quality DESC", "order_window": 4, "dedup_on": "cluster", "key": "id"},
}


def _selection(plan: Path) -> dict:
    return dict(json.loads((plan / "plan.json").read_text())["datasets"][0]["selection"])


def _same_plans(local: Path, remote: Path) -> None:
    assert (local / "samples.parquet").read_bytes() == (remote / "samples.parquet").read_bytes()
    a, b = _selection(local), _selection(remote)
    a.pop("metadata", None), b.pop("metadata", None)  # the sidecar's path differs, its fingerprint must not
    assert a == b
    assert a["selected"] < a["rows"] or "order_by" in a


@pytest.mark.parametrize("kind", sorted(SELECTIONS))
def test_a_remote_selection_plans_what_the_local_copy_does(bucket, files, tmp_path, kind) -> None:
    root = _local(files, tmp_path / "local")
    bucket.upload_dir(root, "corpus/")
    args = dict(SELECTIONS[kind])
    local_args, remote_args = dict(args), dict(args)
    if "key" in args:
        local_args["metadata"] = root / "side"
        remote_args["metadata"] = bucket.url("corpus/side/")
    local = _source(Dataset.from_path("web", root / "web", **local_args)).plan(tmp_path / "a")
    remote = _source(Dataset.from_path("web", bucket.url("corpus/web/"), **remote_args)).plan(tmp_path / "b")
    _same_plans(local, remote)
    if "key" in args:
        side = _selection(remote)["sidecar"]
        assert side["documents_without_metadata"] == SHARDS and side["metadata_without_document"] == 2


def _text_chunks(data: bytes) -> list[tuple[int, int]]:
    meta = pq.read_metadata(pa.BufferReader(data))
    out = []
    for g in range(meta.num_row_groups):
        chunk = meta.row_group(g).column(1)
        assert chunk.path_in_schema == "text"
        start = min(chunk.data_page_offset, chunk.dictionary_page_offset or chunk.data_page_offset)
        out.append((start, start + chunk.total_compressed_size))
    return out


def test_a_remote_selection_reads_only_its_columns(s3, s3_proxy, files, tmp_path) -> None:
    """Besides each shard's tail (the footer, by one GET of the last 64 KiB: the storage layer's scan), every
    range the planning GETs misses the text column's chunks."""
    root = _local(files, tmp_path / "local")
    s3.upload_dir(root, "corpus/")
    s3_proxy.clear()
    ds = Dataset.from_path("web", s3.url("corpus/web/"), where="score >= 3", metadata=s3.url("corpus/side/"), key="id")
    _source(ds).plan(tmp_path / "p")
    chunk_gets = 0
    for seen in s3_proxy.seen:
        key = seen.path.split("?")[0].removeprefix(f"/{s3.name}/").removeprefix("corpus/")
        if seen.method != "GET" or not key.startswith("web/") or seen.range is None:
            continue
        first, last = (int(x) for x in seen.range.removeprefix("bytes=").split("-"))
        if last == len(files[key]) - 1:
            continue  # the tail
        chunk_gets += 1
        for lo, hi in _text_chunks(files[key]):
            assert last < lo or first >= hi, (key, seen.range, lo, hi)
    assert chunk_gets >= SHARDS


def test_a_changed_remote_sidecar_changes_the_plan_hash(s3, files, tmp_path) -> None:
    root = _local(files, tmp_path / "local")
    s3.upload_dir(root, "corpus/")

    def config_hash() -> str:
        ds = Dataset.from_path(
            "web", s3.url("corpus/web/"), where="quality > 0.5", metadata=s3.url("corpus/side/"), key="id"
        )
        return prepare(_source(ds)).config_hash

    before = config_hash()
    assert config_hash() == before
    table = pq.read_table(pa.BufferReader(files["side/q.parquet"]))
    quality = table.column("quality").to_pylist()
    quality[7] = 0.123456  # one score, same selection
    s3.put("corpus/side/q.parquet", _parquet(table.set_column(1, "quality", pa.array(quality))))
    assert config_hash() != before


def test_remote_selection_errors_are_one_line(s3, files, tmp_path) -> None:
    root = _local(files, tmp_path / "local")
    s3.upload_dir(root, "corpus/")
    s3.put("jsonl/a.jsonl", b'{"text": "x", "score": 1}\n')
    s3.put("side-dup/q.parquet", _parquet(pa.table({"id": ["w0-1", "w0-1"], "quality": [0.1, 0.2]})))
    web = s3.url("corpus/web/")
    cases = [
        (ConfigError, "names column 'nope', which the dataset lacks — it has id, text, score, lang",
         Dataset.from_path("web", web, where="nope > 1")),
        (ConfigError, "where must be a DuckDB SQL expression",
         Dataset.from_path("web", web, where="score >")),
        (DatasetError, "sidecar key 'id' must be unique, got 2 rows for 'w0-1'",
         Dataset.from_path("web", web, metadata=s3.url("side-dup/"), key="id")),
        (DatasetError, "selection must keep at least one row, got 0 of 120",
         Dataset.from_path("web", web, where="score > 100")),
        (DatasetError, "selection must keep at least one row, got 0 of 1",
         Dataset.from_path("j", s3.url("jsonl/"), where="score > 1")),
    ]  # fmt: skip
    for kind, message, ds in cases:
        with pytest.raises(kind, match=message) as info:
            prepare(_source(ds))
        assert "\n" not in str(info.value)


def test_selection_and_sidecar_over_hf(hub_server, files, tmp_path) -> None:
    web = {f"data/train-{n[4]}.parquet": d for n, d in files.items() if n.startswith("web/")}
    hub_server.add_dataset("org/web", web, lfs=list(web))
    hub_server.add_dataset("org/scores", {"data/train-0.parquet": files["side/q.parquet"]})
    root = _local(files, tmp_path / "local")
    (root / "hub-side").mkdir()
    (root / "hub-side" / "train-0.parquet").write_bytes(files["side/q.parquet"])  # its name is fingerprinted too
    args = {"where": "quality > 0.4 AND lang = 'en'", "order_by": "score DESC", "key": "id"}
    local = _source(Dataset.from_path("web", root / "web", metadata=root / "hub-side", **args)).plan(tmp_path / "a")
    remote = _source(Dataset.from_path("web", "hf://org/web/train", metadata="hf://org/scores/train", **args))
    _same_plans(local, remote.plan(tmp_path / "b"))


def _as_jsonl(files: dict[str, bytes], root: Path, suffix: str) -> Path:
    """web/ as JSONL shards (``suffix``: .jsonl, .jsonl.gz or .jsonl.zst), with the first row of each shard
    lacking its ``lang`` field (a NULL for the selection)."""
    import gzip

    import zstandard

    (root / "web").mkdir(parents=True)
    for name, data in files.items():
        if not name.startswith("web/"):
            continue
        rows = pq.read_table(pa.BufferReader(data)).to_pylist()
        del rows[0]["lang"]
        text = "".join(json.dumps(r) + "\n" for r in rows).encode()
        text = {".jsonl": text, ".jsonl.gz": gzip.compress(text), ".jsonl.zst": zstandard.compress(text)}[suffix]
        (root / name.replace(".parquet", suffix)).write_bytes(text)
    return root / "web"


def _codes(plan: Path) -> list[tuple[int, int, int]]:
    samples = pq.read_table(plan / "samples.parquet").to_pydict()
    shards = pq.read_table(plan / "shards.parquet").to_pydict()
    stem = {i: Path(u).name.split(".")[0] for i, u in zip(shards["shard_id"], shards["uri"], strict=True)}
    return [(e, int(stem[s]), r) for e, s, r in zip(samples["epoch"], samples["shard_id"], samples["row"], strict=True)]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_a_jsonl_selection_keeps_what_the_parquet_one_does(files, tmp_path, suffix) -> None:
    root = _local(files, tmp_path / "pq")
    web = _as_jsonl(files, tmp_path / "js", suffix)
    args = {"where": "quality > 0.3 AND lang = 'en'", "order_by": "score DESC", "metadata": root / "side", "key": "id"}
    a = _source(Dataset.from_path("web", root / "web", **args)).plan(tmp_path / "a")
    b = _source(Dataset.from_path("web", web, **args)).plan(tmp_path / "b")
    # Same selection, except each shard's first row: its missing lang is NULL, so the JSONL plan drops it (and
    # it has no sidecar row in the first place: quality is NULL too — so the selections are equal).
    assert _codes(a) == _codes(b)
    assert _selection(a) | {"metadata": None} == _selection(b) | {"metadata": None}


def test_a_remote_jsonl_selection_plans_what_the_local_copy_does(s3, files, tmp_path) -> None:
    web = _as_jsonl(files, tmp_path / "js", ".jsonl.gz")
    s3.upload_dir(web, "js/")
    args = {"where": "score >= 2 AND lang IS NOT NULL", "dedup_on": "score"}
    a = _source(Dataset.from_path("web", web, **args)).plan(tmp_path / "a")
    b = _source(Dataset.from_path("web", s3.url("js/"), **args)).plan(tmp_path / "b")
    _same_plans(a, b)


def test_jsonl_rows_that_are_not_objects_or_mix_types_are_refused(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "0.jsonl").write_text('{"text": "x", "score": 1}\n[1, 2]\n')
    with pytest.raises(DatasetError, match=r"0.jsonl row 1 must be a JSON object, got list — fix the line"):
        prepare(_source(Dataset.from_path("a", tmp_path / "a", where="score > 0")))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "0.jsonl").write_text('{"text": "x", "score": 1}\n{"text": "y", "score": "high"}\n')
    with pytest.raises(DatasetError, match=r"field 'score' of shard .*0.jsonl must hold one type in every row"):
        prepare(_source(Dataset.from_path("b", tmp_path / "b", where="score > 0")))


def test_the_executor_reads_only_the_selected_jsonl_documents(tmp_path, tokenizer_dir) -> None:
    (tmp_path / "web").mkdir()
    for s in range(2):
        rows = [{"text": ("hi " if r % 3 == 0 else "lo ") * (2 + r % 4), "score": r % 3} for r in range(30)]
        (tmp_path / "web" / f"{s}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=33)
    ds = Dataset.from_path("web", tmp_path / "web", where="score = 0")
    source = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=1, exact_tokens=True)
    plan = source.plan(tmp_path / "p", tokenize=tok, pack=pack)
    decoder = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    words: set[str] = set()
    for batch in iterate_batches(plan, ExecutorSpec(tokenize=tok, pack=pack, batch=BatchSpec(microbatch_size=4))):
        for tokens, n in zip(batch.tokens, batch.lengths, strict=True):
            words |= set(decoder.decode(tokens[:n].tolist()).split())
    assert words == {"hi"}


def test_sql_show_and_audit_read_remote_and_jsonl_metadata_as_the_local_plan_does(s3, files, tmp_path) -> None:
    from zephon.inspection.column_audit import column_windows
    from zephon.inspection.show import show_step
    from zephon.inspection.sql import run_sql

    root = _local(files, tmp_path / "local")
    s3.upload_dir(root, "corpus/")
    web = _as_jsonl(files, tmp_path / "js", ".jsonl.zst")
    s3.upload_dir(web, "js/")
    args = {"where": "score >= 1", "key": "id", "order_by": "quality", "order_window": 1}
    plans = [
        _source(Dataset.from_path("web", root / "web", metadata=root / "side", **args)).plan(tmp_path / "a"),
        _source(Dataset.from_path("web", s3.url("corpus/web/"), metadata=s3.url("corpus/side/"), **args)).plan(
            tmp_path / "b"
        ),
        _source(Dataset.from_path("web", s3.url("js/"), metadata=s3.url("corpus/side/"), **args)).plan(tmp_path / "c"),
    ]
    query = "SELECT m.score, m.lang, m.quality FROM samples s JOIN metadata m USING (shard_id, row) ORDER BY position"
    local_rows = run_sql(plans[0], query)[1]
    assert len(local_rows) == 2 * _selection(plans[0])["selected"]
    assert run_sql(plans[1], query)[1] == local_rows
    # the JSONL copy lacks each shard's first lang (NULL): the documents without a sidecar row (no quality)
    assert run_sql(plans[2], query)[1] == [(s, lang if q is not None else None, q) for s, lang, q in local_rows]
    means = [column_windows(p, "quality", batch_size=4, window=5).means for p in plans]
    assert np.array_equal(means[0], means[1], equal_nan=True) and np.array_equal(means[0], means[2], equal_nan=True)
    shown = [
        [r.metadata for r in show_step(p, 2, batch_size=4, columns=["quality", "score"], text=False).rows]
        for p in plans
    ]
    assert shown[0] == shown[1] == shown[2] and len(shown[0]) == 4 and shown[0][0]["quality"] is not None


def _sorted_shards(root: Path) -> Path:
    """3 shards × 40 rows in row groups of 10, sorted: r = 40·shard + row, name = r as 4 digits, x = r / 10."""
    (root / "web").mkdir(parents=True)
    for s in range(SHARDS):
        r = np.arange(s * ROWS, (s + 1) * ROWS)
        table = pa.table({"text": [f"doc {v}" for v in r], "r": r, "name": [f"{v:04d}" for v in r], "x": r / 10})
        (root / "web" / f"{s}.parquet").write_bytes(_parquet(table))
    return root / "web"


def test_bounds_of_a_where_clause() -> None:
    import duckdb

    from zephon.planner.selection.pruning import Bound, bounds_of

    def parsed(where: str):
        con = duckdb.connect()
        tree = json.loads(
            con.execute("SELECT json_serialize_sql($q)", {"q": f"SELECT 1 WHERE ({where})"}).fetchall()[0][0]
        )
        return bounds_of(tree["statements"][0]["node"]["where_clause"])

    assert parsed("r >= 50 AND (name < '0105' AND 3 > R) AND x >= 0.5 AND lower(name) = 'a'") == (
        Bound(column="r", op=">=", value=50),
        Bound(column="name", op="<", value="0105"),
        Bound(column="r", op="<", value=3),
    )
    assert parsed("r >= 50 OR name = 'x'") == () and parsed("NOT r = 2") == ()


def test_remote_row_groups_excluded_by_statistics_are_not_read(s3, tmp_path) -> None:
    from zephon.planner.selection.pruning import Bound
    from zephon.planner.selection.tables import Wanted, read_documents

    web = _sorted_shards(tmp_path / "local")
    s3.upload_dir(web, "sorted/")
    where = "r >= 50 AND name < '0105' AND x >= 0 AND r % 3 <> 1"
    local = _source(Dataset.from_path("web", web, where=where, order_by="x DESC")).plan(tmp_path / "a")
    remote_ds = Dataset.from_path("web", s3.url("sorted/"), where=where, order_by="x DESC")
    _same_plans(local, _source(remote_ds).plan(tmp_path / "b"))
    refs = tuple(s.placed(shard_id=i, dataset_id=0, dataset="web") for i, s in enumerate(remote_ds.shards()))
    prune = (Bound(column="r", op=">=", value=50), Bound(column="name", op="<", value="0105"))
    table, columns = read_documents("web", refs, Wanted(names=frozenset({"r", "name", "x"}), prune=prune))
    assert columns == ["text", "r", "name", "x"]
    # shard 0 (r 0-39) wholly excluded; shard 1 from r 50 (its first group, 40-49, excluded); shard 2 up to 109
    assert table.column("r").to_pylist() == list(range(50, 80)) + list(range(80, 110))
    assert table.column("file_row_number").to_pylist() == list(range(10, 40)) + list(range(0, 30))
    # with a sidecar nothing is pruned: every document takes part in the key counts
    side = pa.table({"r": np.arange(0, 200, 2), "q": np.linspace(0, 1, 100)})
    s3.put("side/q.parquet", _parquet(side))
    (tmp_path / "side").mkdir()
    (tmp_path / "side" / "q.parquet").write_bytes(_parquet(side))
    args = {"where": "r >= 50 AND q > 0.3", "key": "r"}
    a = _source(Dataset.from_path("web", web, metadata=tmp_path / "side", **args)).plan(tmp_path / "c")
    b = _source(Dataset.from_path("web", s3.url("sorted/"), metadata=s3.url("side/"), **args)).plan(tmp_path / "d")
    _same_plans(a, b)
    assert _selection(b)["sidecar"]["documents_without_metadata"] == 60


def test_copies_of_a_remote_selection_are_the_local_ones_and_runs_never_reach_the_store(
    s3, files, tmp_path, tokenizer_dir
) -> None:
    """materialize_selections over s3://: the copies are byte for byte those of the same plan over the local files,
    and a run reads them with no shard cache (a run that had to reach the store would be refused without one)."""
    root = _local(files, tmp_path / "local")
    s3.upload_dir(root, "corpus/")
    where = {"where": "score >= 3 AND lang = 'en'"}
    local = _source(Dataset.from_path("web", root / "web", **where)).plan(tmp_path / "a", materialize_selections=True)
    remote = _source(Dataset.from_path("web", s3.url("corpus/web/"), **where))
    remote_plan = remote.plan(tmp_path / "b", materialize_selections=True)
    _same_plans(local, remote_plan)
    copies = sorted(p.name for p in (local / "selected").iterdir())
    assert copies == sorted(p.name for p in (remote_plan / "selected").iterdir()) and len(copies) == SHARDS
    for name in copies:
        assert (local / "selected" / name).read_bytes() == (remote_plan / "selected" / name).read_bytes()
    spec = ExecutorSpec(
        tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir),
        pack=PackSpec(max_length=64),
        batch=BatchSpec(microbatch_size=4),
    )  # no StoreOptions: no shard cache

    def run(plan: Path) -> list[bytes]:
        return [b.tokens.tobytes() for b in iterate_batches(plan, spec)]

    assert run(remote_plan) == run(local)
    # Without copies the run reads the selected objects themselves: by ranges by default (no cache, no disk),
    # refused only when the shard cache is asked for and not enabled.
    bare = _source(Dataset.from_path("web", s3.url("corpus/web/"), **where)).plan(tmp_path / "c")
    assert run(bare) == run(local)
    cache_mode = dataclasses.replace(spec, io=StoreOptions(remote_read="cache"))
    with pytest.raises(ConfigError, match=r"remote shards must be read through the shard cache"):
        list(iterate_batches(bare, cache_mode))
