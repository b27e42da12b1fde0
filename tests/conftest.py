"""Shared fixtures: isolated caches, the shipped demo tokenizer, and tiny datasets written per test."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon.demo import demo_tokenizer_path

# The Hub test server and its fixtures (hub_server, reference_hub) live in tests/servers/hub_fixtures.py; the
# object-store servers (s3_server, s3, s3_proxy) in tests/servers/object_fixtures.py; the two-node Ray cluster
# (ray_cluster) in tests/servers/ray_fixtures.py.
pytest_plugins = ["servers.hub_fixtures", "servers.object_fixtures", "servers.ray_fixtures"]


@pytest.fixture(autouse=True)
def _one_process_per_test_for_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh process would for a crash-prone engine's one-tokenizer rule
    (``zephon.executor.engines.choose._HELD``; tested on its own in test_fast_tokenize.py)."""
    from zephon.executor.engines import choose

    monkeypatch.setattr(choose, "_HELD", {})


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path_factory.mktemp("zephon-cache")
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


@pytest.fixture(scope="session")
def tokenizer_dir() -> str:
    return demo_tokenizer_path()


@pytest.fixture(scope="session")
def cl100k_converted_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiktoken-derived tokenizer.json (Llama-3's shape) that crashed kitoken runs and that fastokens, gigatoken
    and tiktoken refuse to load (tests/fixtures/tokenizers/cl100k-converted)."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "tokenizers" / "cl100k-converted"
    out = tmp_path_factory.mktemp("cl100k-converted")
    (out / "tokenizer.json").write_bytes(gzip.decompress((fixture / "tokenizer.json.gz").read_bytes()))
    (out / "tokenizer_config.json").write_bytes((fixture / "tokenizer_config.json").read_bytes())
    return str(out)


def batches_per_setting(
    monkeypatch: pytest.MonkeyPatch, plan: Path, tokenizer_dir: str, variable: str, values: tuple[str, ...]
) -> list[list[bytes]]:
    """The token bytes of every microbatch of ``plan``'s run (pack 33, microbatches of 2), once per value of the
    environment ``variable``: an execution setting must give the same list for every value."""
    from zephon import Pipeline

    runs = []
    for value in values:
        monkeypatch.setenv(variable, value)
        pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=33)
        runs.append([b.tokens.tobytes() for b in pipe.batch(microbatch_size=2)])
    return runs


def doc_text(dataset: str, shard: int, row: int) -> str:
    """Deterministic text whose length varies with the row, so documents span rows when packed."""
    words = " ".join(f"{dataset}{shard}w{(row * 7 + i) % 13}" for i in range(3 + (row * 5) % 17))
    return f"{dataset} shard {shard} row {row}: {words}."


def write_parquet_dataset(root: Path, name: str, rows_per_shard: list[int], *, row_group_size: int = 4) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    for shard, n in enumerate(rows_per_shard):
        table = pa.table(
            {"id": [f"{name}-{shard}-{r}" for r in range(n)], "text": [doc_text(name, shard, r) for r in range(n)]}
        )
        pq.write_table(table, directory / f"part-{shard:05d}.parquet", row_group_size=row_group_size)
    return directory


def write_jsonl_dataset(root: Path, name: str, rows_per_shard: list[int], *, compression: str = "") -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    for shard, n in enumerate(rows_per_shard):
        data = "".join(json.dumps({"id": r, "text": doc_text(name, shard, r)}) + "\n" for r in range(n)).encode()
        suffix = ".jsonl"
        if compression == "gz":
            data, suffix = gzip.compress(data, mtime=0), ".jsonl.gz"
        elif compression == "zst":
            import zstandard

            data, suffix = zstandard.ZstdCompressor().compress(data), ".jsonl.zst"
        (directory / f"part-{shard:05d}{suffix}").write_bytes(data)
    return directory


@pytest.fixture
def make_parquet(tmp_path: Path) -> Callable[..., Path]:
    return lambda name, rows, **kw: write_parquet_dataset(tmp_path / "data", name, rows, **kw)


@pytest.fixture
def make_jsonl(tmp_path: Path) -> Callable[..., Path]:
    return lambda name, rows, **kw: write_jsonl_dataset(tmp_path / "data", name, rows, **kw)


_FULL_DISK = """
import resource, sys
from zephon.io import Dataset
from zephon.planner.prepare import shard_refs
from zephon.planner.selection.evaluate import select_rows
from zephon.work import MixtureSpec, StaticMixtureWorkSource
ds = Dataset.from_path("web", {dataset})
refs = shard_refs(StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({{"web": 1.0}}), seed=3), progress=False)
{setup}
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
try:
    select_rows(ds.selection, refs[0], seed=3, dataset_index=0, {options})
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def selection_under_full_disk(
    corpus: Path, tmp_path: Path, *, dataset: str, limit: int, options: str, setup: str = ""
) -> tuple[str, Path]:
    """A selection under a file-size limit of ``limit`` bytes (a full disk), in a process of its own with its
    ``TMPDIR`` a new scratch folder: the one line it printed, and that folder (for what the selection left in it).
    ``dataset``: ``Dataset.from_path``'s arguments after the name (``sys.argv[1]`` is ``corpus``); ``options``:
    ``select_rows``' keyword arguments beyond the plan's; ``setup``: Python run before the limit is set."""
    script = _FULL_DISK.format(dataset=dataset, limit=limit, options=options, setup=setup)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    out = subprocess.run([sys.executable, "-c", script, str(corpus)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip(), scratch
