"""The documented API's two README examples, unchanged but for the cache root, against the Hub test server.

The server holds repos laid out like the real ones (HuggingFaceFW/fineweb-edu with config sample-10BT,
wikimedia/wikipedia with config 20231101.en, yahma/alpaca-cleaned with its Parquet conversion) and the demo
tokenizer published as model `gpt2`, so `tokenizer_id="gpt2"` is the real loading path.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from demo_grammar import generate_demo_documents
from servers.hub_fixtures import add_demo_gpt2, parquet_bytes

from zephon import Pipeline
from zephon.io import Dataset
from zephon.specs import CacheOptions, StoreOptions
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


@pytest.fixture
def seed_hub(reference_hub):
    """Reference repos with enough text for full 8 × 2049 batches, and `gpt2`."""
    hub, _ = reference_hub
    docs = generate_demo_documents("prose", 600, seed=5)
    hub.commit(
        "HuggingFaceFW/fineweb-edu",
        {f"sample/10BT/00{i}_00000.parquet": parquet_bytes(pa.table({"text": docs[i::3]})) for i in range(3)},
        keep=True,
    )
    wiki = generate_demo_documents("prose", 300, seed=6)
    hub.commit(
        "wikimedia/wikipedia",
        {
            f"20231101.en/train-0000{i}-of-00002.parquet": parquet_bytes(pa.table({"text": wiki[i::2]}))
            for i in range(2)
        },
        keep=True,
    )
    add_demo_gpt2(hub)
    return hub


def test_first_seed_example_prints_the_documented_shapes(seed_hub, tmp_path, capsys) -> None:
    dataset = Dataset.from_path("fineweb_edu", "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train")
    work_source = StaticMixtureWorkSource(
        datasets=[dataset],
        mixture=MixtureSpec({"fineweb_edu": 1.0}),
        seed=42,
    )
    cache = CacheOptions(enabled=True, root=str(tmp_path / "zephon-cache"), limit_bytes=50 << 30)  # 50 GiB

    pipeline = (
        Pipeline(work_source)
        .options(io_options=StoreOptions(cache=cache))
        .tokenize(tokenizer_id="gpt2", field="text")
        .pack_flat(max_length=2049, algorithm="wrap")
        .batch(microbatch_size=8)
    )

    for batch in pipeline:
        tensors = batch.to_training(return_labels=True)
        print(tensors["input_ids"].shape, tensors["labels"].shape)  # (8, 2048) (8, 2048)
        break
    assert capsys.readouterr().out == "torch.Size([8, 2048]) torch.Size([8, 2048])\n"


def test_second_seed_example_mixes_by_tokens(seed_hub, tmp_path) -> None:
    work_source = StaticMixtureWorkSource(
        datasets=[
            Dataset.from_path("fineweb_edu", "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train"),
            Dataset.from_path("wikipedia", "hf://wikimedia/wikipedia/20231101.en/train"),
        ],
        mixture=MixtureSpec({"fineweb_edu": 0.7, "wikipedia": 0.3}),
        seed=42,
        token_estimation=TokenEstimation(primer="measure", calibration_samples=2048, calibration_shards_max=4),
    )
    cache = CacheOptions(enabled=True, root=str(tmp_path / "zephon-cache"), limit_bytes=50 << 30)  # 50 GiB

    pipeline = (
        Pipeline(work_source)
        .options(io_options=StoreOptions(cache=cache))
        .tokenize(tokenizer_id="gpt2", field="text")
        .pack_flat(max_length=2049, algorithm="wrap")
        .batch(microbatch_size=8)
    )
    first = next(iter(pipeline)).to_training(return_labels=True)
    assert tuple(first["input_ids"].shape) == (8, 2048) and tuple(first["labels"].shape) == (8, 2048)
    manifest = json.loads((pipeline.plan_dir / "plan.json").read_text())
    assert manifest["mixture"]["unit"] == "tokens"
    shares = {d["name"]: d["planned_token_share"] for d in manifest["datasets"]}
    assert shares["fineweb_edu"] == pytest.approx(0.7, abs=0.01) and shares["wikipedia"] == pytest.approx(0.3, abs=0.01)
    assert all("@" in d["pinned"] for d in manifest["datasets"])  # pinned to commits


def test_alpaca_parquet_conversion_path_reads(seed_hub, tmp_path) -> None:
    ds = Dataset.from_path("alpaca", "hf://yahma/alpaca-cleaned@~parquet/train")
    src = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"alpaca": 1.0}), seed=0)
    cache = CacheOptions(enabled=True, root=str(tmp_path / "c"), limit_bytes=1 << 30)
    pipe = (
        Pipeline(src)
        .options(io_options=StoreOptions(cache=cache))
        .tokenize(tokenizer_id="gpt2", field="output")
        .pack_flat(max_length=129)
        .batch(microbatch_size=4)
    )
    assert tuple(next(iter(pipe)).to_training()["input_ids"].shape) == (4, 128)
