"""The count pass and token calibration on every engine: the same cached counts and ratios as ``tokenizers``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from test_token_plans import corpus as corpus  # the module's corpus fixture
from test_token_plans import source

from zephon.executor.encode.text import ENGINE_ENV
from zephon.executor.engines import choose
from zephon.planner.prepare import prepare
from zephon.specs import PackSpec, TokenizeSpec

# kitoken is refused for the demo tokenizer (a contraction after a newline: test_fast_tokenize.py), so it runs
# on DeepSeek V4's tokenizer.json below.
ENGINES = [
    e for e in choose.CANDIDATES if e != "kitoken" and (e == "tokenizers" or importlib.util.find_spec(e) is not None)
]


def counted(corpus, tokenizer_dir: str, cache: Path, monkeypatch, engine: str, workers: int):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(cache))
    monkeypatch.setenv(ENGINE_ENV, engine)
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir, add_bos=True)
    got = prepare(source(corpus, exact_tokens=True), tokenize=tok, pack=PackSpec(max_length=64), workers=workers)
    arrays = {p.name: np.load(p) for p in (cache / "token-counts").glob("*.npy")}
    estimated = prepare(source(corpus), tokenize=tok)  # calibrated on a seeded sample of each dataset
    return arrays, got.count_report, estimated.token_provenance


@pytest.mark.parametrize("workers", [1, 2])
def test_every_engine_counts_and_calibrates_exactly_as_tokenizers(
    corpus, tokenizer_dir, tmp_path, monkeypatch, workers
):
    """``tokenizers`` with 2 workers counts in subprocesses; a GIL-releasing engine on threads of this process."""
    expected, report, ratios = counted(corpus, tokenizer_dir, tmp_path / "ref", monkeypatch, "tokenizers", workers)
    assert report.counted == 7 and len(expected) == 7
    assert [d["method"] for d in ratios.values()] == ["measure"] * 3
    for engine in ENGINES[:-1]:
        arrays, got, calibration = counted(corpus, tokenizer_dir, tmp_path / engine, monkeypatch, engine, workers)
        assert sorted(arrays) == sorted(expected)
        for name, array in arrays.items():
            assert array.dtype == expected[name].dtype and array.tobytes() == expected[name].tobytes(), engine
        assert got.tokens == report.tokens and calibration == ratios
