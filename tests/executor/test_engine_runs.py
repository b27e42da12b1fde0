"""The engine layer in whole runs: every plan kind gives the same batches on every engine and any number of
tokenizer threads, and ``Pipeline.stats()`` names the engine and the refused ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from test_stats import KINDS, algorithm_of, make_plan, pipeline

from zephon.errors import ConfigError
from zephon.executor.encode.text import ENGINE_ENV
from zephon.executor.engines import choose
from zephon.executor.settings import ExecutorSpec
from zephon.specs import BatchSpec, PackSpec, TokenizeSpec

# kitoken is refused for the demo tokenizer (a contraction after a newline: test_fast_tokenize.py), so it runs
# on DeepSeek V4's tokenizer.json below.
ENGINES = [
    e for e in choose.CANDIDATES if e != "kitoken" and (e == "tokenizers" or importlib.util.find_spec(e) is not None)
]


def batches(plan: Path, tokenizer_dir: str, kind: str, **options) -> list[np.ndarray]:
    pipe = pipeline(plan, tokenizer_dir, algorithm=algorithm_of(kind), **options)
    return [b.tokens.copy() for b in pipe], pipe.stats()


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_engine_and_thread_count_gives_the_same_batches(kind, tmp_path, tokenizer_dir, monkeypatch) -> None:
    plan = make_plan(tmp_path, kind, tokenizer_dir)
    monkeypatch.setenv(ENGINE_ENV, "tokenizers")
    expected, _ = batches(plan, tokenizer_dir, kind)
    for engine in ENGINES:
        monkeypatch.setenv(ENGINE_ENV, engine)
        for threads in (1, 3):
            got, stats = batches(plan, tokenizer_dir, kind, tokenizer_threads=threads)
            assert stats.tokenizer_engine == engine
            assert len(got) == len(expected)
            assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True)), (engine, threads)


def test_stats_name_the_engine_and_why_faster_ones_were_refused(tmp_path, tokenizer_dir, monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "fastokens", None)  # as if not installed
    monkeypatch.setattr(choose, "_BUILT", {})  # and never built in this process
    plan = make_plan(tmp_path, "samples", tokenizer_dir)
    _, stats = batches(plan, tokenizer_dir, "samples")
    assert stats.tokenizer_engine == next(e for e in ENGINES if e != "fastokens")
    assert stats.refused_engines["fastokens"] == "fastokens is not installed (pip install 'zephon[fast]')"


def test_tokenizer_threads_must_be_a_positive_integer(tmp_path, tokenizer_dir) -> None:
    spec = {
        "tokenize": TokenizeSpec(tokenizer_id="x"),
        "pack": PackSpec(max_length=8),
        "batch": BatchSpec(microbatch_size=1),
    }
    with pytest.raises(ConfigError, match="tokenizer_threads must be an integer ≥ 1 or None, got 0"):
        ExecutorSpec(**spec, tokenizer_threads=0)
    from zephon import Pipeline

    with pytest.raises(ConfigError, match="tokenizer_threads must be an integer ≥ 1 or None, got 'two'"):
        Pipeline.from_plan(make_plan(tmp_path, "samples", tokenizer_dir)).options(tokenizer_threads="two")


@pytest.mark.parametrize("kind", ["samples", "exact_wrap"])
def test_kitoken_runs_give_the_same_batches_on_a_vendor_tokenizer(kind, tmp_path, monkeypatch) -> None:
    """kitoken is exact for DeepSeek V4's tokenizer.json: whole runs match tokenizers batch for batch."""
    from test_fast_tokenize import deepseek_dir, need

    need("kitoken")
    (tmp_path / "tokenizer").mkdir()
    tokenizer = deepseek_dir(tmp_path / "tokenizer")
    plan = make_plan(tmp_path, kind, tokenizer)
    monkeypatch.setenv(ENGINE_ENV, "tokenizers")
    expected, _ = batches(plan, tokenizer, kind)
    monkeypatch.setenv(ENGINE_ENV, "kitoken")
    got, stats = batches(plan, tokenizer, kind)
    assert stats.tokenizer_engine == "kitoken" and len(got) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
