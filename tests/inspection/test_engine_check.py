"""``check_engines``: every installed engine against tokenizers over whole datasets, each in its own process."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import doc_text, write_jsonl_dataset, write_parquet_dataset
from tokenizers import Tokenizer

from zephon.errors import TokenizerError
from zephon.executor.encode.text import Encoder
from zephon.executor.engines.choose import VerdictCache
from zephon.inspection.engine_check import check_engines
from zephon.recipe.dataset import Dataset
from zephon.specs import TokenizeSpec

#: After a newline, GPT-2's pre-tokenizer (the demo tokenizer's) takes ``'s`` of ``'stdout`` as a contraction;
#: kitoken 0.11.1 does not: tokenizers ``[199, 7, 83, 84, ...]``, kitoken ``[199, 7, 329, ...]``.
CONTRACTION = "print(\n'stdout')"


def need(*engines: str) -> None:
    for engine in engines:
        if importlib.util.find_spec(engine) is None:
            pytest.skip(f"{engine} is not installed")


def verdicts(tokenizer_dir: str) -> VerdictCache:
    return VerdictCache(Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).to_str())


def with_contractions(root: Path, rows: int, at: tuple[int, ...]) -> Path:
    """One Parquet shard of ``rows`` documents, the contraction after a newline in rows ``at``."""
    root.mkdir(parents=True)
    texts = [CONTRACTION if r in at else doc_text("web", 0, r) for r in range(rows)]
    pq.write_table(pa.table({"text": texts}), root / "a.parquet", row_group_size=4)
    return root / "a.parquet"


def test_every_document_of_parquet_and_jsonl_datasets_is_compared_and_exact_engines_are_approved(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    need("fastokens", "gigatoken", "tiktoken")
    datasets = [
        Dataset.from_path("prose", write_parquet_dataset(tmp_path, "prose", [9, 5])),
        Dataset.from_path("notes", write_jsonl_dataset(tmp_path, "notes", [6])),
    ]
    result = check_engines(datasets, tokenizer_dir, engines=["fastokens", "gigatoken", "tiktoken"])
    assert result.ok and result.documents == 20 and result.tokens > 20
    assert [e.engine for e in result.engines] == ["fastokens", "gigatoken", "tiktoken"]
    for e in result.engines:
        assert (e.status, e.documents, e.differing, e.first, e.verdict) == ("agrees", 20, 0, None, "approved")
        assert e.tokens_per_s and e.tokens_per_s > 0 and e.reference_tokens_per_s and e.version
        assert verdicts(tokenizer_dir).get(e.engine, e.engine) == (True, "")


def test_limit_stops_after_that_many_documents_in_all(tokenizer_dir: str, tmp_path: Path) -> None:
    need("fastokens")
    datasets = [
        Dataset.from_path("a", write_parquet_dataset(tmp_path, "a", [3, 3])),
        Dataset.from_path("b", write_parquet_dataset(tmp_path, "b", [3])),
    ]
    result = check_engines(datasets, tokenizer_dir, limit=5, engines=["fastokens"])
    assert result.documents == 5 and result.engines[0].documents == 5


def test_kitoken_splitting_a_contraction_after_a_newline_is_refused_with_the_first_differing_document(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """A real difference (docs/performance.md): kitoken on GPT-2's pre-tokenizer, ``\\n'stdout`` in rows 6 and 10."""
    need("kitoken", "fastokens")
    shard = with_contractions(tmp_path / "web", 12, at=(6, 10))
    result = check_engines([Dataset.from_path("web", shard)], tokenizer_dir, engines=["fastokens", "kitoken"])
    fast, kit = result.engines
    assert not result.ok and fast.status == "agrees"
    assert (kit.status, kit.documents, kit.differing, kit.verdict) == ("differs", 12, 2, "refused")
    first = kit.first
    assert first is not None and (first.dataset, first.shard, first.row) == ("web", str(shard), 6)
    assert (first.position, first.expected[:2], first.got[:2]) == (6, (83, 84), (329, 68))  # type: ignore[index]
    assert first.excerpt == "stdout')"
    cached = verdicts(tokenizer_dir).get("kitoken", "kitoken")
    assert cached is not None and cached[0] is False
    assert "on 2 of 12 documents" in cached[1] and "row 6, token 6" in cached[1]
    with pytest.raises(TokenizerError, match="kitoken must .* got: ids differ from tokenizers on 2 of 12 documents"):
        Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), engine="kitoken")  # a run reads the refusal


def test_an_engine_that_segfaults_is_reported_crashed_and_the_others_still_run(
    tokenizer_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real SIGSEGV: a stand-in kitoken, found first on PYTHONPATH, loads and then reads address 0 on its first
    batch; a stand-in fastokens that cannot be imported is reported unavailable and not cached."""
    need("gigatoken")
    site = tmp_path / "site"
    (site / "kitoken").mkdir(parents=True)
    (site / "kitoken" / "__init__.py").write_text(
        "import ctypes\n\n\nclass Kitoken:\n    @staticmethod\n    def from_tokenizers(data):\n"
        "        return Kitoken()\n\n    def encode_all(self, texts, special):\n"
        "        ctypes.string_at(0)  # reads address 0: SIGSEGV\n",
        encoding="utf-8",
    )
    (site / "fastokens").mkdir()
    (site / "fastokens" / "__init__.py").write_text("raise ImportError('stand-in')\n", encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(site))
    datasets = [Dataset.from_path("prose", write_parquet_dataset(tmp_path, "prose", [5]))]
    result = check_engines(datasets, tokenizer_dir, engines=["fastokens", "gigatoken", "kitoken"])
    fast, giga, kit = result.engines
    assert (fast.status, fast.verdict) == ("unavailable", "not cached") and "not installed" in fast.reason
    assert giga.status == "agrees" and giga.documents == 5
    assert (kit.status, kit.documents, kit.verdict) == ("crashed", 0, "refused")
    assert kit.reason.startswith("it crashed (SIGSEGV) in zephon engines check, on dataset 'prose'")
    assert not result.ok
    cache = verdicts(tokenizer_dir)
    assert cache.get("fastokens", "fastokens") is None
    assert cache.get("kitoken", "kitoken") == (False, kit.reason)


def test_an_earlier_refusal_is_final_even_when_the_engine_agrees_here(tokenizer_dir: str, tmp_path: Path) -> None:
    need("fastokens")
    cache = verdicts(tokenizer_dir)
    cache.put("fastokens", "fastokens", False, "ids differ from tokenizers on a document of another run")
    datasets = [Dataset.from_path("prose", write_parquet_dataset(tmp_path, "prose", [4]))]
    (fast,) = check_engines(datasets, tokenizer_dir, engines=["fastokens"]).engines
    assert (fast.status, fast.verdict) == ("agrees", "refused") and fast.reason.startswith("refused before: ids")
    assert cache.get("fastokens", "fastokens") == (False, "ids differ from tokenizers on a document of another run")


def test_an_engine_that_fails_a_probe_is_refused_even_if_the_data_agrees(tokenizer_dir: str, tmp_path: Path) -> None:
    """An approval lets a run skip the probes, so it is cached only when the probes pass too."""
    need("kitoken")
    datasets = [Dataset.from_path("prose", write_parquet_dataset(tmp_path, "prose", [4]))]
    (kit,) = check_engines(datasets, tokenizer_dir, engines=["kitoken"]).engines
    assert (kit.status, kit.differing, kit.verdict) == ("fails probes", 0, "refused")
    assert kit.reason == "ids differ from tokenizers on the contractions after whitespace probe"


def test_an_engine_whose_library_refuses_the_tokenizer_is_unavailable_and_cached_refused(
    cl100k_converted_dir: str, tmp_path: Path
) -> None:
    """fastokens cannot load the tiktoken-derived cl100k conversion: reported ``unavailable`` with the library's
    reason and cached as refused, as a run caches it."""
    need("fastokens")
    datasets = [Dataset.from_path("prose", write_parquet_dataset(tmp_path, "prose", [3]))]
    (fast,) = check_engines(datasets, cl100k_converted_dir, engines=["fastokens"]).engines
    assert (fast.status, fast.verdict) == ("unavailable", "refused")
    assert fast.reason.startswith("cannot load this tokenizer (ValueError: ")
    assert verdicts(cl100k_converted_dir).get("fastokens", "fastokens") == (False, fast.reason)
