"""``tokenize_datasets`` (``zephon tokenize``): the demo corpus written as Megatron stores reads back exactly as
the Encoder encodes it; any number of workers writes the same bytes; a killed run resumes; files Zephon did not
write are never replaced; megatron-core's own IndexedDataset reads the stores."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.doc_blocks import run_block

from zephon.demo import demo_dataset_path, demo_dataset_paths, demo_tokenizer_path
from zephon.errors import ConfigError, DatasetError, StorageError, ZephonWarning
from zephon.executor.encode.text import Encoder
from zephon.executor.token_stores import detect_format, open_token_store
from zephon.planner.tokenize.run import tokenize_datasets
from zephon.recipe.dataset import Dataset
from zephon.specs import TokenizeSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "token_stores"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict[str, str]:
    return demo_dataset_paths(tmp_path_factory.mktemp("demo"))


def spec(**options: object) -> TokenizeSpec:
    return TokenizeSpec(tokenizer_id=demo_tokenizer_path(), **options)  # type: ignore[arg-type]


def datasets(paths: dict[str, str], *names: str) -> list[Dataset]:
    return [Dataset.from_path(n, paths[n]) for n in names or tuple(paths)]


def texts_of(pattern: str) -> list[list[str]]:
    """Each shard's texts, in path order."""
    return [pq.read_table(f).column("text").to_pylist() for f in sorted(Path(pattern).parent.glob(Path(pattern).name))]


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_demo_corpus_reads_back_token_for_token_as_the_encoder_encodes_it(tmp_path) -> None:
    path = demo_dataset_path(tmp_path / "data")
    report = tokenize_datasets([Dataset.from_path("prose", path)], spec(), tmp_path / "out", workers=1)
    encoder = Encoder(spec())
    shards = texts_of(path)
    expected = [ids.tolist() for texts in shards for ids in encoder.encode(texts)]
    assert (report.written, report.kept, report.dtype) == (4, 0, "uint16")
    assert report.documents == len(expected) == 1200 and report.tokens == sum(map(len, expected))
    assert all(doc[-1] == encoder.eos_id for doc in expected)  # every document ends in EOS, as --append-eod
    folder = tmp_path / "out" / "prose"
    assert detect_format(str(folder)) == "megatron"
    store = open_token_store(str(folder), vocab_size=encoder.tokenizer.get_vocab_size())
    assert store.format == "megatron" and str(store.dtype) == "uint16" and len(store.parts) == 4
    assert store.token_counts().tolist() == [len(d) for d in expected]
    assert store.read(0, store.num_documents).to_lists() == expected
    first = open_token_store(str(folder / "prose-00000"))  # one prefix: document i is shard row i
    assert first.read(0, first.num_documents).to_lists() == [ids.tolist() for ids in encoder.encode(shards[0])]
    assert report.datasets[0].prefixes == tuple(str(folder / f"prose-{i:05d}") for i in range(4))
    record = json.loads((folder / "prose-00002.zephon.json").read_text())
    assert record["complete"] and record["rows"] == record["documents"] == 300 and record["dtype"] == "uint16"
    assert record["tokenizer_fingerprint"] == encoder.fingerprint


def test_one_worker_and_two_workers_write_the_same_bytes(demo, tmp_path) -> None:
    one = tokenize_datasets(datasets(demo), spec(), tmp_path / "one", workers=1)
    two = tokenize_datasets(datasets(demo), spec(), tmp_path / "two", workers=2)
    assert tree(tmp_path / "one") == tree(tmp_path / "two") and len(tree(tmp_path / "one")) == 7 * 3
    assert (one.tokens, one.documents) == (two.tokens, two.documents) == (954773, 3800)  # zephon count's numbers


def test_on_ray_the_stores_are_byte_identical_to_the_local_engine_s(ray_cluster, demo, tmp_path) -> None:
    """On the two-node cluster, with the first task's worker killed mid-step (its task is run again)."""
    local = tokenize_datasets(datasets(demo, "code"), spec(), tmp_path / "local", workers=1)
    ray_cluster.failpoint.touch()
    ray = tokenize_datasets(datasets(demo, "code"), spec(), tmp_path / "ray", workers=2, engine="ray")
    assert not ray_cluster.failpoint.exists()
    assert tree(tmp_path / "local") == tree(tmp_path / "ray") and ray.written == 2 and ray.tokens == local.tokens


def test_a_killed_run_resumes_keeping_finished_stores_and_writing_the_rest(demo, tmp_path) -> None:
    whole = tokenize_datasets(datasets(demo, "prose"), spec(), tmp_path / "whole", workers=1)
    out = tmp_path / "out"
    tokenize_datasets(datasets(demo, "prose"), spec(), out, workers=1)
    folder = out / "prose"
    # prose-00001: killed while encoding (a partial temporary, nothing in place)
    for suffix in (".bin", ".idx", ".zephon.json"):
        (folder / f"prose-00001{suffix}").unlink()
    (folder / ".prose-00001.bin.zephon-tmp-99999-deadbeef").write_bytes(b"\x01\x00" * 7)
    # prose-00002: killed between the renames (its record claims the files, incomplete)
    (folder / "prose-00002.idx").unlink()
    record = json.loads((folder / "prose-00002.zephon.json").read_text())
    (folder / "prose-00002.zephon.json").write_text(json.dumps({**record, "complete": False}))
    kept = {n: (folder / n).stat().st_mtime_ns for n in ("prose-00000.bin", "prose-00003.idx")}
    report = tokenize_datasets(datasets(demo, "prose"), spec(), out, workers=2)
    assert (report.written, report.kept) == (2, 2) and report.tokens == whole.tokens
    assert tree(out) == tree(tmp_path / "whole")  # the temporary swept; the same bytes as one uninterrupted run
    assert {n: (folder / n).stat().st_mtime_ns for n in kept} == kept  # kept stores were not rewritten
    again = tokenize_datasets(datasets(demo, "prose"), spec(), out)
    assert (again.written, again.kept) == (0, 4)


def test_a_finished_store_whose_files_were_damaged_is_written_again(demo, tmp_path) -> None:
    out = tmp_path / "out"
    tokenize_datasets(datasets(demo, "code"), spec(), out, workers=1)
    before = tree(out)
    with open(out / "code" / "code-00001.bin", "r+b") as f:
        f.truncate(10)
    report = tokenize_datasets(datasets(demo, "code"), spec(), out, workers=1)
    assert (report.written, report.kept) == (1, 1) and tree(out) == before


def test_a_user_s_file_at_a_prefix_is_refused_and_nothing_is_written(demo, tmp_path) -> None:
    folder = tmp_path / "out" / "code"
    folder.mkdir(parents=True)
    (folder / "code-00001.bin").write_bytes(b"mine")
    with pytest.raises(
        StorageError,
        match=r"code-00001\.bin must not be there for zephon tokenize to write .*got a file it did not write .*move it away, or choose another -o",
    ):
        tokenize_datasets(datasets(demo, "code"), spec(), tmp_path / "out", workers=1, overwrite=True)
    assert tree(tmp_path / "out") == {"code/code-00001.bin": b"mine"}


def test_stores_of_other_input_are_refused_unless_overwrite(demo, tmp_path) -> None:
    out = tmp_path / "out"
    tokenize_datasets(datasets(demo, "short"), spec(), out, workers=1)
    before = tree(out)
    other = spec(special_tokens="none")  # another tokenizer fingerprint: no EOS
    with pytest.raises(
        StorageError,
        match=r"short-00000 must be a store of this run's input to be kept, got one zephon tokenize wrote from other input: its tokenizer fingerprint .* pass --overwrite",
    ):
        tokenize_datasets(datasets(demo, "short"), other, out, workers=1)
    assert tree(out) == before
    report = tokenize_datasets(datasets(demo, "short"), other, out, workers=1, overwrite=True)
    assert report.written == 1 and report.tokens == 30731 - 2000  # the same documents without their EOS


def test_stores_of_shards_no_longer_in_the_dataset_are_left_with_a_warning(demo, tmp_path) -> None:
    tokenize_datasets(datasets(demo, "code"), spec(), tmp_path / "out", workers=1)
    one = Dataset.from_path("code", demo["code"].replace("*", "00000"))
    with pytest.warns(ZephonWarning, match=r"holds 1 store\(s\) of shards not in dataset 'code' now .*code-00001"):
        report = tokenize_datasets([one], spec(), tmp_path / "out", workers=1)
    assert report.kept == 1 and (tmp_path / "out" / "code" / "code-00001.bin").exists()


def test_a_bad_document_is_one_line_naming_its_row_and_nothing_is_half_written(tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"text": ["fine", None, "also fine"]}), data / "bad.parquet")
    with pytest.raises(DatasetError, match=r"bad\.parquet row 1 .*null"):
        tokenize_datasets([Dataset.from_path("bad", str(data))], spec(), tmp_path / "out", workers=1)
    assert tree(tmp_path / "out") == {}
    assert not (tmp_path / "out").exists()  # nor the folders the failed run made (they were left empty)


def test_a_failed_run_removes_only_the_empty_folders_it_made(demo, tmp_path) -> None:
    """A wrong --field fails in the workers: the run's own empty folders go, a folder of the user's stays whole."""
    with pytest.raises(DatasetError, match="must have the column 'body'"):
        tokenize_datasets(datasets(demo, "short"), spec(field="body"), tmp_path / "new", workers=1)
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine" / "notes").mkdir(parents=True)
    (tmp_path / "mine" / "notes" / "a.txt").write_text("mine")
    with pytest.raises(DatasetError, match="must have the column 'body'"):
        tokenize_datasets(datasets(demo, "short"), spec(field="body"), tmp_path / "mine", workers=1)
    assert tree(tmp_path / "mine") == {"notes/a.txt": b"mine"}
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes"]


def test_documents_max_tokens_cuts_are_counted_in_the_records_and_the_report(demo, tmp_path) -> None:
    plain = Encoder(spec())
    whole = [len(ids) for texts in texts_of(demo["prose"]) for ids in plain.encode(texts)]  # BOS? + text + EOS
    report = tokenize_datasets(datasets(demo, "prose"), spec(max_tokens=200), tmp_path / "o", workers=1)
    (prose,) = report.datasets
    longer = [n for n in whole if n > 200]
    assert 0 < len(longer) < len(whole)
    assert (prose.truncated, prose.truncated_tokens) == (len(longer), sum(n - 200 for n in longer))
    assert prose.tokens + prose.truncated_tokens == sum(whole)
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "o" / "prose").glob("*.zephon.json"))]
    assert sum(r["truncated"] for r in records) == len(longer)
    kept = tokenize_datasets(datasets(demo, "prose"), spec(max_tokens=200), tmp_path / "o", workers=1)
    assert kept.kept == len(records) and kept.datasets == report.datasets  # a rerun reads them from the records
    untouched = tokenize_datasets(datasets(demo, "prose"), spec(), tmp_path / "p", workers=1)
    assert (untouched.datasets[0].truncated, untouched.datasets[0].truncated_tokens) == (0, 0)


def test_settings_a_megatron_store_cannot_hold_are_refused(demo, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"must write plain token ids, got long_documents: split"):
        tokenize_datasets(datasets(demo, "short"), spec(max_tokens=64, long_documents="split"), tmp_path / "o")
    selected = Dataset.from_path("short", demo["short"], where="length(text) > 10")
    with pytest.raises(ConfigError, match=r"dataset 'short' must have no selection .*select when planning"):
        tokenize_datasets([selected], spec(), tmp_path / "o")
    with pytest.raises(ConfigError, match=r'engine must be "local" or "ray", got \'spark\''):
        tokenize_datasets(datasets(demo, "short"), spec(), tmp_path / "o", engine="spark")
    assert not (tmp_path / "o").exists()


def _megatron_python() -> str | None:
    python = os.environ.get("ZEPHON_MEGATRON_PYTHON", "/tmp/fx-megatron/bin/python")
    return python if os.path.exists(python) else None


@pytest.mark.skipif(_megatron_python() is None, reason="no Python with megatron-core (ZEPHON_MEGATRON_PYTHON)")
def test_megatron_core_s_indexed_dataset_reads_the_stores(demo, tmp_path) -> None:
    report = tokenize_datasets(datasets(demo, "code", "short"), spec(), tmp_path / "out", workers=1)
    prefixes = [p for d in report.datasets for p in d.prefixes]
    result = subprocess.run(
        [_megatron_python(), str(FIXTURES / "read_with_megatron.py"), *prefixes],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    read = json.loads(result.stdout)
    encoder = Encoder(spec())
    for prefix in prefixes:
        name = Path(prefix).name.split("-")[0]
        texts = texts_of(demo[name])[int(Path(prefix).name.split("-")[1])]
        assert read[prefix]["dtype"] == "uint16"
        assert read[prefix]["documents"] == [ids.tolist() for ids in encoder.encode(texts)]
    assert np.sum([len(d) for p in prefixes for d in read[p]["documents"]]) == report.tokens


def test_the_token_stores_page_s_writing_example_prints_what_it_shows(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ZEPHON_DEMO_DIR", str(tmp_path / "demo"))
    monkeypatch.chdir(tmp_path)
    shown = run_block("token-stores.md", "## Writing a store: `zephon tokenize`")
    assert capsys.readouterr().out.splitlines() == shown


def test_a_dataset_on_an_object_store_gives_the_local_copy_s_stores(demo, s3, tmp_path) -> None:
    s3.upload_dir(Path(demo["code"]).parent, "corpus/")
    remote = Dataset.from_path("code", s3.url("corpus/code-*.parquet"))
    report = tokenize_datasets([remote], spec(), tmp_path / "remote", workers=2)
    tokenize_datasets(datasets(demo, "code"), spec(), tmp_path / "local", workers=1)
    data = {k: v for k, v in tree(tmp_path / "local").items() if not k.endswith(".json")}
    assert {k: v for k, v in tree(tmp_path / "remote").items() if not k.endswith(".json")} == data
    assert report.written == 2 and len(data) == 4
    record = json.loads((tmp_path / "remote" / "code" / "code-00001.zephon.json").read_text())
    assert record["shard"] == s3.url("corpus/code-00001.parquet")
