"""Pytest plugin: the ``hub_server`` fixture and small generated copies of real Hub datasets.

Register it from ``tests/conftest.py`` with ``pytest_plugins = ["servers.hub_fixtures"]`` (``tests/`` is on
``sys.path`` under pytest's default rootdir/prepend import mode).

``hub_server`` starts a :class:`hub_server.HubServer` on 127.0.0.1 (random port), points ``HF_ENDPOINT`` at
it, sets ``HF_HUB_DISABLE_TELEMETRY=1``, unsets ``HF_HUB_OFFLINE``/``HF_TOKEN``, isolates ``HF_HOME`` (and the
token path huggingface_hub computed at import) under ``tmp_path`` and makes Zephon's Hub retries fast. It also
points the endpoint that ``huggingface_hub`` computed at import (``constants.ENDPOINT``, the resolve URL
template) and transformers' shared ``HfApi`` at the server, so ``AutoTokenizer.from_pretrained("gpt2")`` and
``hf_hub_download(repo_id="gpt2", ...)`` download from it.

``add_reference_datasets(hub)`` adds deterministic, small repos laid out like the real ones:

* ``HuggingFaceFW/fineweb-edu`` — README ``configs:`` ``default`` (``data/*/*``, ``default: true``),
  ``sample-10BT`` (``sample/10BT/*``) and ``CC-MAIN-2024-10``; branch ``v1.4.0`` and tag ``v1.0.0`` at the
  first commit (2 sample shards), ``main`` one commit later (3 sample shards). Columns ``id``, ``text``,
  ``token_count``; 100 rows a shard.
* ``wikimedia/wikipedia`` — configs ``20231101.en`` (``20231101.en/train-*``, 2 shards of 150 rows) and
  ``20231101.id`` (1 shard). Columns ``id``, ``url``, ``title``, ``text``.
* ``yahma/alpaca-cleaned`` — README without configs, ``alpaca_data_cleaned.json`` (a JSON array, not a
  format Zephon reads) and branch ``refs/convert/parquet`` with ``default/train/0000.parquet`` (300 rows of
  ``instruction``, ``input``, ``output``).

``add_demo_gpt2(hub)`` publishes Zephon's embedded demo tokenizer (``zephon.demo.demo_tokenizer_path()``:
``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``) as model repos ``gpt2`` and
``openai-community/gpt2``, so code written for the real GPT-2 tokenizer (``tokenize(tokenizer_id="gpt2")``) runs
unchanged; the ``gpt2_hub`` fixture is ``hub_server`` holding them.
"""

from __future__ import annotations

import io
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import constants as hf_constants
from servers.hub_server import HubServer

FINEWEB = "HuggingFaceFW/fineweb-edu"
WIKIPEDIA = "wikimedia/wikipedia"
ALPACA = "yahma/alpaca-cleaned"
GPT2_REPOS = ("gpt2", "openai-community/gpt2")
DEMO_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

_WORDS = [
    "the",
    "model",
    "reads",
    "data",
    "from",
    "shards",
    "and",
    "learns",
    "language",
    "structure",
    "quickly",
    "while",
    "every",
    "rank",
    "sees",
    "the",
    "same",
    "batch",
    "because",
    "the",
    "plan",
    "pins",
    "commits",
    "tokens",
    "flow",
    "through",
    "packing",
    "into",
    "fixed",
    "windows",
    "education",
    "science",
    "history",
    "river",
    "mountain",
    "school",
    "teacher",
    "student",
    "energy",
    "water",
    "light",
]

FINEWEB_README = """---
license: odc-by
task_categories:
- text-generation
configs:
- config_name: default
  data_files:
  - split: train
    path: data/*/*
  default: true
- config_name: sample-10BT
  data_files:
  - split: train
    path: sample/10BT/*
- config_name: CC-MAIN-2024-10
  data_files:
  - split: train
    path: data/CC-MAIN-2024-10/*
---
# FineWeb-Edu (test copy)
"""

WIKIPEDIA_README = """---
language:
- en
- id
configs:
- config_name: 20231101.en
  data_files:
  - split: train
    path: 20231101.en/train-*
- config_name: 20231101.id
  data_files:
  - split: train
    path: 20231101.id/train-*
---
# Wikipedia (test copy)
"""

ALPACA_README = """---
license: cc-by-4.0
language:
- en
---
# Alpaca-Cleaned (test copy)
"""


def _texts(seed: int, count: int, low: int = 8, high: int = 60) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high))) for _ in range(count)]


def parquet_bytes(table: pa.Table, row_group_size: int = 50) -> bytes:
    """Serialize ``table`` to Parquet bytes (deterministic for a given pyarrow version)."""
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return sink.getvalue()


def fineweb_shard(seed: int, rows: int = 100) -> bytes:
    texts = _texts(seed, rows)
    return parquet_bytes(
        pa.table(
            {
                "id": [f"<urn:uuid:{seed:04d}-{i:05d}>" for i in range(rows)],
                "text": texts,
                "token_count": pa.array([len(t.split()) * 4 // 3 for t in texts], pa.int64()),
            }
        )
    )


def wikipedia_shard(seed: int, lang: str, rows: int = 150) -> bytes:
    texts = _texts(seed, rows, 30, 120)
    return parquet_bytes(
        pa.table(
            {
                "id": [str(seed * 1000 + i) for i in range(rows)],
                "url": [f"https://{lang}.wikipedia.org/wiki?curid={seed * 1000 + i}" for i in range(rows)],
                "title": [" ".join(t.split()[:2]).title() for t in texts],
                "text": texts,
            }
        )
    )


def alpaca_records(rows: int = 300) -> list[dict[str, str]]:
    instructions, inputs, outputs = _texts(31, rows, 4, 12), _texts(32, rows, 0, 10), _texts(33, rows, 5, 40)
    return [{"instruction": a, "input": b, "output": c} for a, b, c in zip(instructions, inputs, outputs, strict=True)]


def add_reference_datasets(hub: HubServer) -> dict[str, str]:
    """Add the three reference datasets; returns named commits (``fineweb_v1``, ``fineweb_main``, ...)."""
    first = hub.add_dataset(
        FINEWEB,
        {
            "sample/10BT/000_00000.parquet": fineweb_shard(1),
            "sample/10BT/001_00000.parquet": fineweb_shard(2),
            "data/CC-MAIN-2024-10/000_00000.parquet": fineweb_shard(3),
            ".gitattributes": "*.parquet filter=lfs diff=lfs merge=lfs -text\n",
        },
        readme=FINEWEB_README,
    )
    hub.create_branch(FINEWEB, "v1.4.0", first)
    hub.create_tag(FINEWEB, "v1.0.0", first)
    fineweb_main = hub.commit(FINEWEB, {"sample/10BT/002_00000.parquet": fineweb_shard(4)}, keep=True)

    wikipedia = hub.add_dataset(
        WIKIPEDIA,
        {
            "20231101.en/train-00000-of-00002.parquet": wikipedia_shard(11, "en"),
            "20231101.en/train-00001-of-00002.parquet": wikipedia_shard(12, "en"),
            "20231101.id/train-00000-of-00001.parquet": wikipedia_shard(13, "id", rows=100),
        },
        readme=WIKIPEDIA_README,
    )

    records = alpaca_records()
    alpaca = hub.add_dataset(ALPACA, {"alpaca_data_cleaned.json": json.dumps(records, indent=4)}, readme=ALPACA_README)
    conversion = hub.add_parquet_conversion(
        ALPACA,
        {
            "default/train/0000.parquet": parquet_bytes(pa.Table.from_pylist(records), row_group_size=100),
        },
    )
    return {
        "fineweb_v1": first,
        "fineweb_main": fineweb_main,
        "wikipedia_main": wikipedia,
        "alpaca_main": alpaca,
        "alpaca_conversion": conversion,
    }


def demo_tokenizer_files() -> dict[str, bytes]:
    """The files of Zephon's embedded demo tokenizer, by name."""
    from zephon.demo import demo_tokenizer_path

    root = Path(demo_tokenizer_path())
    return {name: (root / name).read_bytes() for name in DEMO_TOKENIZER_FILES}


def add_demo_gpt2(hub: HubServer) -> dict[str, str]:
    """Publish the demo tokenizer as model repos ``gpt2`` and ``openai-community/gpt2``; returns their commits."""
    files = demo_tokenizer_files()
    return {repo_id: hub.add_model(repo_id, files) for repo_id in GPT2_REPOS}


def _transformers_hub_module():  # transformers.utils.hub when transformers is imported (never imports it)
    return sys.modules.get("transformers.utils.hub")


@pytest.fixture
def hub_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    """A running :class:`HubServer` with the environment pointed at it (see the module docstring)."""
    import zephon.storage.hub.retry

    hub = HubServer().start()
    home = tmp_path / "hf_home"
    home.mkdir()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    for name in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_TOKEN_PATH",
        "HF_OIDC_RESOURCE",
    ):
        monkeypatch.delenv(name, raising=False)
    # huggingface_hub computed these at import time from the environment of that moment.
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HOME", str(home))
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(hf_constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(hf_constants, "AGENT_HARNESSES_PATH", str(home / ".agent_harnesses.json"))
    # hf_hub_download and a default HfApi() read the endpoint from these (computed at import), not HF_ENDPOINT.
    monkeypatch.setattr(hf_constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(
        hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(hf_constants, "HF_URL_HOSTS", hf_constants.HF_URL_HOSTS | {urlsplit(hub.url).hostname})
    # transformers keeps one HfApi, with the endpoint of its creation: start from a fresh one.
    transformers_hub = _transformers_hub_module()
    if transformers_hub is not None:
        monkeypatch.setattr(transformers_hub, "_hf_api", None)
    monkeypatch.setattr(  # where the default is read at call time (zephon.storage.hub.client re-exports it)
        zephon.storage.hub.retry,
        "DEFAULT_RETRY",
        zephon.storage.hub.retry.RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05),
    )
    url = hub.url
    try:
        yield hub
    finally:
        hub.stop()
        transformers_hub = _transformers_hub_module()  # imported during the test: drop the HfApi bound to `hub`
        api = getattr(transformers_hub, "_hf_api", None)
        if api is not None and api.endpoint == url:
            transformers_hub._hf_api = None


@pytest.fixture
def reference_hub(hub_server: HubServer) -> tuple[HubServer, dict[str, str]]:
    """``hub_server`` holding the reference datasets, and their named commits."""
    return hub_server, add_reference_datasets(hub_server)


@pytest.fixture
def gpt2_hub(hub_server: HubServer) -> HubServer:
    """``hub_server`` holding the demo tokenizer as model repos ``gpt2`` and ``openai-community/gpt2``."""
    add_demo_gpt2(hub_server)
    return hub_server
