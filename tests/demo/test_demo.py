"""Tests for the embedded demo tokenizer and the shipped demo corpus and its shards (``zephon.demo``).

The grammar that generated the corpus (``scripts/demo_grammar``, not installed) is tested in test_demo_grammar.py."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import demo_grammar
import pyarrow.parquet as pq
import pytest
import zstandard
from tokenizers import Tokenizer

from zephon.demo import (
    DEMO_KINDS,
    demo_dataset_path,
    demo_dataset_paths,
    demo_tokenizer_path,
    generate_demo_documents,
    write_demo_dataset,
)

EOS = "<|endoftext|>"
EXPECTED_FILES = {
    "prose": [f"prose-{i:05d}.parquet" for i in range(4)],
    "code": ["code-00000.parquet", "code-00001.parquet"],
    "short": ["short-00000.parquet"],
}
EXPECTED_ROWS = {"prose": 300, "code": 300, "short": 2000}
REAL_TEXT = (
    "Hello, world! The harbor at dawn: 42 boats, 3.5 knots, naïve café — “quoted” 日本語 🙂\n"
    "def f(x):\n    return x ** 2  # square\n\n\ttabs and  double  spaces\r\n"
)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(os.path.join(demo_tokenizer_path(), "tokenizer.json"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_demo_dataset(tmp_path_factory.mktemp("demo-root")))


def _read_texts(directory: Path, kind: str) -> list[str]:
    return [
        text
        for name in EXPECTED_FILES[kind]
        for text in pq.read_table(directory / name, columns=["text"])["text"].to_pylist()
    ]


# ----------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------


def test_tokenizer_path_is_packaged_directory() -> None:
    path = Path(demo_tokenizer_path())
    assert path.is_absolute()
    assert path.parts[-2:] == ("assets", "tokenizer")
    assert (path / "tokenizer.json").is_file()
    assert (path / "tokenizer_config.json").is_file()
    assert (path / "tokenizer.json").stat().st_size < 400_000


def test_tokenizers_load(tokenizer: Tokenizer) -> None:
    assert tokenizer.get_vocab_size() == 4096
    assert tokenizer.token_to_id(EOS) == 0
    assert tokenizer.id_to_token(0) == EOS
    encoding = tokenizer.encode(REAL_TEXT)
    assert 0 not in encoding.ids
    assert tokenizer.decode(encoding.ids) == REAL_TEXT
    # No BOS/EOS is added: encoding is the plain concatenation of the pieces.
    assert tokenizer.encode("the").ids == tokenizer.encode("the", add_special_tokens=True).ids
    assert tokenizer.encode("a" + EOS + "b").ids.count(0) == 1


def test_transformers_load_offline(monkeypatch: pytest.MonkeyPatch, tokenizer: Tokenizer) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(demo_tokenizer_path())
    assert hf.is_fast
    assert hf.eos_token == hf.bos_token == hf.unk_token == EOS
    assert hf.eos_token_id == 0
    assert hf.bos_token_id == 0
    assert len(hf) == 4096

    ids = hf(REAL_TEXT)["input_ids"]
    assert ids == tokenizer.encode(REAL_TEXT).ids
    assert ids[0] != 0 and ids[-1] != 0  # neither BOS nor EOS added
    assert hf.decode(ids) == REAL_TEXT
    assert hf.encode("hello") == tokenizer.encode("hello").ids

    for kind in DEMO_KINDS:
        for doc in demo_grammar.generate_demo_documents(kind, 5, seed=7):
            assert hf(doc)["input_ids"] == tokenizer.encode(doc).ids


def test_transformers_load_in_fresh_offline_process(tmp_path: Path) -> None:
    """A fresh interpreter with an empty HF cache and the hub switched off loads the tokenizer."""
    script = textwrap.dedent(
        """
        from transformers import AutoTokenizer
        from zephon.demo import demo_tokenizer_path
        tok = AutoTokenizer.from_pretrained(demo_tokenizer_path())
        assert tok.is_fast and tok.eos_token_id == 0, (tok.is_fast, tok.eos_token_id)
        ids = tok("the river")["input_ids"]
        assert 0 not in ids and tok.decode(ids) == "the river", ids
        print("ok")
        """
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf-home"),
    }
    env.pop("HF_HUB_CACHE", None)
    env.pop("TRANSFORMERS_CACHE", None)
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


# ----------------------------------------------------------------------------------------------------
# Shipped corpus
# ----------------------------------------------------------------------------------------------------


def test_shipped_corpus_is_the_grammars_seed_0() -> None:
    for kind in DEMO_KINDS:
        assert generate_demo_documents(kind, 50) == demo_grammar.generate_demo_documents(kind, 50, seed=0)
    assert generate_demo_documents("short", 0, seed=0) == []
    assert len(generate_demo_documents("short", 2000)) == 2000


def test_shipped_corpus_refuses_what_it_does_not_hold() -> None:
    with pytest.raises(ValueError, match=r"^kind must be one of \('prose', 'code', 'short'\), got 'poetry' — "):
        generate_demo_documents("poetry", 1)
    with pytest.raises(ValueError, match=r"^seed must be 0 \(the demo corpus shipped with Zephon\), got 3 — .*demo_grammar"):
        generate_demo_documents("prose", 1, seed=3)
    with pytest.raises(ValueError, match=r"^count must be in \[0, 600\] for 'code' \(the shipped demo corpus\), got 601 — "):
        generate_demo_documents("code", 601)
    with pytest.raises(ValueError, match=r"^count must be in \[0, 1200\] for 'prose'"):
        generate_demo_documents("prose", -1)


def test_corpus_asset_is_compact() -> None:
    asset = Path(demo_tokenizer_path()).parent / "demo" / "corpus.jsonl.zst"
    assert asset.is_file()
    assert asset.stat().st_size < 1_500_000
    assert sorted(os.listdir(asset.parent)) == ["corpus.jsonl.zst"]


# ----------------------------------------------------------------------------------------------------
# Parquet dataset
# ----------------------------------------------------------------------------------------------------


def test_layout_rows_and_columns(dataset: Path) -> None:
    expected = sorted(name for names in EXPECTED_FILES.values() for name in names)
    assert sorted(os.listdir(dataset)) == expected  # and no temporary files left behind
    for kind, names in EXPECTED_FILES.items():
        for shard, name in enumerate(names):
            parquet = pq.ParquetFile(dataset / name)
            assert parquet.metadata.num_rows == EXPECTED_ROWS[kind]
            assert parquet.metadata.num_row_groups == -(-EXPECTED_ROWS[kind] // 100)
            assert all(parquet.metadata.row_group(i).num_rows <= 100 for i in range(parquet.metadata.num_row_groups))
            assert parquet.metadata.row_group(0).column(1).compression.lower() == "zstd"
            table = parquet.read()
            assert table.column_names == ["id", "text"]
            assert str(table.schema.field("id").type) == "string"
            assert str(table.schema.field("text").type) == "string"
            ids = table["id"].to_pylist()
            assert ids == [f"{kind}-{shard}-{row}" for row in range(EXPECTED_ROWS[kind])]


def test_shards_hold_the_shipped_documents(dataset: Path) -> None:
    for kind in DEMO_KINDS:
        assert _read_texts(dataset, kind) == generate_demo_documents(kind, EXPECTED_ROWS[kind] * len(EXPECTED_FILES[kind]))


def test_byte_identical_across_roots(dataset: Path, tmp_path: Path) -> None:
    other = Path(write_demo_dataset(tmp_path / "other"))
    assert other == tmp_path / "other" / "demo"
    for names in EXPECTED_FILES.values():
        for name in names:
            assert (dataset / name).read_bytes() == (other / name).read_bytes(), name


def test_other_seeds_need_the_grammar(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^seed must be 0 .*scripts/demo_grammar"):
        write_demo_dataset(tmp_path, seed=1)
    other = Path(demo_grammar.write_demo_dataset(tmp_path, seed=1))
    assert write_demo_dataset(tmp_path, seed=1) == str(other)  # complete shards of seed 1 are reused, not regenerated
    assert (other / "short-00000.parquet").read_bytes() != (dataset / "short-00000.parquet").read_bytes()
    assert set(_read_texts(other, "prose")).isdisjoint(_read_texts(dataset, "prose"))


def test_second_call_does_not_rewrite(tmp_path: Path) -> None:
    out = Path(write_demo_dataset(tmp_path))
    before = {name: (out / name).stat().st_mtime_ns for name in os.listdir(out)}
    inodes = {name: (out / name).stat().st_ino for name in os.listdir(out)}
    assert write_demo_dataset(tmp_path) == str(out)
    assert {name: (out / name).stat().st_mtime_ns for name in os.listdir(out)} == before
    assert {name: (out / name).stat().st_ino for name in os.listdir(out)} == inodes


def test_incomplete_shard_is_rewritten(dataset: Path, tmp_path: Path) -> None:
    out = Path(write_demo_dataset(tmp_path))
    victim = out / "prose-00002.parquet"
    victim.write_bytes(victim.read_bytes()[:1000])
    (out / "code-00001.parquet").unlink()
    untouched = (out / "prose-00000.parquet").stat().st_mtime_ns
    write_demo_dataset(tmp_path)
    assert victim.read_bytes() == (dataset / "prose-00002.parquet").read_bytes()
    assert (out / "code-00001.parquet").read_bytes() == (dataset / "code-00001.parquet").read_bytes()
    assert (out / "prose-00000.parquet").stat().st_mtime_ns == untouched


def test_token_totals(dataset: Path, tokenizer: Tokenizer) -> None:
    totals = {
        kind: sum(len(enc.ids) for enc in tokenizer.encode_batch(_read_texts(dataset, kind))) for kind in DEMO_KINDS
    }
    assert totals["prose"] >= 200_000
    assert sum(totals.values()) >= 400_000


def test_dataset_path_helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = demo_dataset_paths(tmp_path)
    assert paths == {kind: str(tmp_path / "demo" / f"{kind}-*.parquet") for kind in DEMO_KINDS}
    assert demo_dataset_path(tmp_path) == paths["prose"]
    for kind, pattern in paths.items():
        assert sorted(os.path.basename(p) for p in glob.glob(pattern)) == EXPECTED_FILES[kind]

    env_root = tmp_path / "from-env"
    monkeypatch.setenv("ZEPHON_DEMO_DIR", str(env_root))
    assert demo_dataset_path() == str(env_root / "demo" / "prose-*.parquet")
    assert len(glob.glob(demo_dataset_path())) == 4

    monkeypatch.delenv("ZEPHON_DEMO_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / ".cache" / "zephon" / "demo-data" / "demo" / "prose-*.parquet"
    assert demo_dataset_path() == str(expected)
    assert len(glob.glob(str(expected))) == 4


def test_a_corpus_file_that_does_not_match_the_layout_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from zephon.demo import corpus

    wrong = zstandard.ZstdCompressor().compress(b'{"id": "prose-0-1", "text": "a"}\n')
    monkeypatch.setattr(corpus, "corpus_bytes", lambda: wrong)
    corpus._texts.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"corpus\.jsonl\.zst must hold the rows of DEMO_SHARDS in order, got other "
                                             r"ids for 'prose' — rebuild it with scripts/build_demo_corpus\.py$"):
            generate_demo_documents("prose", 1)
    finally:
        corpus._texts.cache_clear()
