"""examples/train_vlm_tiny.py: image–caption pairs from WebDataset shards planned from a CONFIG file, decoded and
augmented in a seeded map_transform, packed by TokenRows; the batches are exactly the planned records, resume
exactly, and a tiny model's loss goes down."""

from __future__ import annotations

import importlib.util
import io
import math
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from PIL import Image

from zephon.errors import DatasetError

REPO = Path(__file__).resolve().parents[1]


def load_example():
    spec = importlib.util.spec_from_file_location("train_vlm_tiny", REPO / "examples" / "train_vlm_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vlm = load_example()


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vlm.prepare(tmp_path_factory.mktemp("vlm"))


@pytest.fixture(scope="module")
def tok():
    return vlm.tokenizer()


def planned(plan: Path) -> list[tuple[str, int, int, int]]:
    """(dataset, shard number, row, position) of every plan position, read from the bundle itself."""
    samples = pq.read_table(plan / "samples.parquet").to_pydict()
    shards = pq.read_table(plan / "shards.parquet").to_pydict()
    by_id = {
        s: (d, int(Path(u).stem)) for s, d, u in zip(shards["shard_id"], shards["dataset"], shards["uri"], strict=True)
    }
    return [(*by_id[s], r, p) for s, r, p in zip(samples["shard_id"], samples["row"], samples["position"], strict=True)]


def crop_of(png: bytes, seed: int, position: int) -> np.ndarray:
    """The documented seeded crop of a record, recomputed: rng = default_rng([plan seed, position, 0])."""
    rng = np.random.default_rng([seed, position, 0])
    image = Image.open(io.BytesIO(png)).convert("RGB")
    x, y = (int(v) for v in rng.integers(0, [image.width - 40, image.height - 40], endpoint=True))
    image = image.crop((x, y, x + 40, y + 40)).resize((32, 32), Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.asarray(image, np.float32) / 255.0
    return pixels.reshape(4, 8, 4, 8, 3).swapaxes(1, 2).reshape(16, 192)


def test_the_first_batch_holds_the_planned_records_each_caption_behind_16_placeholders(config: Path, tok) -> None:
    pipe = vlm.make_pipeline(config, tok)
    batch = next(iter(pipe))
    t = batch.data
    image_id = tok.token_to_id("<image>")
    assert image_id == 4096
    rows = planned(pipe.plan_dir)[:8]
    kinds = ("shapes", "stripes")
    assert t["__key__"] == [f"{d}-{s:03d}-{r:04d}" for d, s, r, _ in rows]
    assert batch.positions.tolist() == [p for *_, p in rows] == list(range(8))
    drawn = [vlm.draw(d, np.random.default_rng([0, kinds.index(d), s, r])) for d, s, r, _ in rows]
    captions = [[*tok.encode(caption).ids, 0] for _, caption in drawn]
    # Shapes: 8 records packed in order into rows of 64 inputs; 16 patches of 8·8·3 values per image.
    assert t["pixel_values"].shape == (8, 16, 192) and t["pixel_values"].dtype == torch.float32
    assert t["input_ids"].shape[1] == 64 and t["labels"].shape == t["input_ids"].shape
    assert int((t["input_ids"] == image_id).sum()) == 8 * 16
    # The token stream, row by row (a full row's last token is only a label), is each record in turn.
    stream: list[int] = []
    for ids, mask, labels in zip(t["input_ids"], t["attention_mask"], t["labels"], strict=True):
        stream += ids[mask == 1].tolist() + ([int(labels[-1])] if labels[-1] != -100 else [])
    assert stream == [i for c in captions for i in [image_id] * 16 + c]
    # Labels train on the captions and their EOS only: never a placeholder, padding, or the next record's start.
    assert not (t["labels"] == image_id).any()
    assert int(t["num_valid_tokens"]) == int((t["labels"] != -100).sum()) == sum(len(c) for c in captions)
    # Packing, as documented: records in order, a new row of 65 tokens when the next record does not fit.
    records = [[image_id] * 16 + c for c in captions]
    packed: list[list[list[int]]] = [[]]
    for record in records:
        if packed[-1] and sum(map(len, packed[-1])) + len(record) > 65:
            packed.append([])
        packed[-1].append(record)
    want_ids = [([i for record in row for i in record] + [0] * 65)[:64] for row in packed]
    assert t["input_ids"].tolist() == want_ids
    bounds = [0]  # records cut at each row's 64 inputs, then the row's padding
    for r, row in enumerate(packed):
        at = 64 * r
        for record in row:
            at = min(at + len(record), 64 * (r + 1))
            bounds.append(at)
        if at < 64 * (r + 1):
            bounds.append(64 * (r + 1))
    assert t["cu_seqlens"].tolist() == bounds
    # The crop and flip of record j are the documented draw from (plan seed 0, position j, operator 0).
    for j in (0, 5):
        assert np.array_equal(t["pixel_values"][j].numpy(), crop_of(drawn[j][0], 0, j))


def test_resuming_the_vlm_pipeline_gives_the_same_batches(config: Path, tok) -> None:
    pipe = vlm.make_pipeline(config, tok)
    whole = [b.data for b, _ in zip(pipe, range(5), strict=False)]
    first = vlm.make_pipeline(config, tok)
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    resumed = vlm.make_pipeline(config, tok)
    resumed.load_state_dict(state)
    again = [b.data for b, _ in zip(resumed, range(3), strict=False)]
    for want, got in zip(whole[2:], again, strict=True):
        assert want.keys() == got.keys()
        for key, value in want.items():
            same = torch.equal(value, got[key]) if isinstance(value, torch.Tensor) else value == got[key]
            assert same, key


def test_the_vlm_example_trains_and_its_loss_goes_down(tmp_path: Path, capsys) -> None:
    losses = vlm.main(["--workdir", str(tmp_path), "--steps", "6"])
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 2.0  # about 8.7 → 4.2 for this seed
    out = capsys.readouterr().out
    assert re.search(r"step 5: loss \d+\.\d+ \(8 images in \d rows\)", out)


def test_the_documented_vlm_example_is_the_examples_pipeline(config: Path, tok) -> None:
    page = (REPO / "docs" / "records.md").read_text(encoding="utf-8").split("## A VLM example", 1)[1]
    yaml_block = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert yaml.safe_load(yaml_block) == yaml.safe_load(vlm.CONFIG.read_text(encoding="utf-8"))
    namespace: dict = {}
    exec(compile(code, "<docs/records.md: A VLM example>", "exec"), namespace)  # the documented code, as written
    documented = next(iter(namespace["make_pipeline"](config, tok))).data
    example = next(iter(vlm.make_pipeline(config, tok))).data
    assert documented.keys() == example.keys()
    for key, value in example.items():
        assert torch.equal(value, documented[key]) if isinstance(value, torch.Tensor) else value == documented[key]


def test_a_record_too_long_for_a_row_is_one_line_naming_its_dataset_shard_row_and_key(
    config: Path, tok, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vlm, "MAX_LENGTH", 20)  # 16 placeholders + a caption of 5 or more tokens do not fit
    pipe = vlm.make_pipeline(config, tok)
    dataset, shard, row, _ = planned(pipe.plan_dir)[0]
    uri = config.parent / "pairs" / dataset / f"{shard:03d}.tar"
    want = (
        rf"^dataset '{dataset}': shard {re.escape(str(uri))} row {row} key '{dataset}-{shard:03d}-{row:04d}': "
        rf"record '{dataset}-{shard:03d}-{row:04d}' "
        r"must have at most max_length=20 tokens in 'input_ids', got \d+ — cut the caption in map_transform"
    )
    with pytest.raises(DatasetError, match=want):
        next(iter(pipe))


def test_dataloader_workers_hand_out_the_same_vlm_batches(config: Path, tok) -> None:
    want = [b.data for b, _ in zip(vlm.make_pipeline(config, tok), range(4), strict=False)]
    got = [t for t, _ in zip(vlm.make_pipeline(config, tok).dataloader(num_workers=2), range(4), strict=False)]
    assert len(got) == 4
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys()
        for key, value in a.items():
            assert torch.equal(value, b[key]) if isinstance(value, torch.Tensor) else value == b[key], key
