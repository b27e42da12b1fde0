"""Train a tiny vision-language model on image–caption pairs from WebDataset shards, on CPU.

    python examples/train_vlm_tiny.py [--workdir DIR] [--steps 30]

1. Writes two small WebDataset datasets (``{key}.png`` + ``{key}.txt``; images drawn with Pillow from a seed)
   under ``DIR/pairs`` and copies ``train_vlm_tiny.yaml`` (the CONFIG file: datasets, mixture, seed) beside them.
2. The Zephon part, ``make_pipeline``: the CONFIG file planned into a samples plan; ``map_transform(seeded=True)``
   decodes each PNG with Pillow, crops and flips it at random from the record's own generator (the plan seed and
   the record's position: the same crop after a resume and at any dp size), resizes it to 32×32 and cuts 16
   patches of 8×8; it tokenizes the caption with the demo tokenizer behind 16 ``<image>`` placeholder tokens;
   ``zephon.records.TokenRows`` packs the records into rows with ``labels`` (-100 on placeholders, padding and
   record boundaries), ``attention_mask``, ``position_ids`` and ``cu_seqlens``.
3. A patch embedding and a 2-layer causal transformer (attention kept inside each record) train for ``--steps``
   steps; the script prints each step's loss.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from tokenizers import Tokenizer

from zephon import Pipeline
from zephon.config_file import load_work_source
from zephon.demo import demo_tokenizer_path
from zephon.records import TokenRows

CONFIG = Path(__file__).with_name("train_vlm_tiny.yaml")
IMAGE, EOS = "<image>", 0  # the placeholder token (added to the demo tokenizer) and <|endoftext|>
SIDE, PATCH = 32, 8  # images resized to 32×32, cut into (32/8)² = 16 patches of 8·8·3 values
PATCHES, PATCH_DIM = (SIDE // PATCH) ** 2, PATCH * PATCH * 3
MAX_LENGTH = 65  # tokens per packed row (context + 1): two or three records of 16 + ~8 tokens


def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(os.path.join(demo_tokenizer_path(), "tokenizer.json"))
    tok.add_special_tokens([IMAGE])
    return tok


# --- the Zephon part: the user's ~20 lines -------------------------------------------------------------------


def make_pipeline(config: str | Path, tok: Tokenizer, microbatch_size: int = 8) -> Pipeline:
    image_id = tok.token_to_id(IMAGE)

    def to_sample(record: dict, rng: np.random.Generator) -> dict:
        image = Image.open(io.BytesIO(record["png"])).convert("RGB")
        x, y = (int(v) for v in rng.integers(0, [image.width - 40, image.height - 40], endpoint=True))
        image = image.crop((x, y, x + 40, y + 40)).resize((SIDE, SIDE), Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        pixels = np.asarray(image, np.float32) / 255.0  # (32, 32, 3) → 16 patches of 8·8·3, row by row
        patches = pixels.reshape(SIDE // PATCH, PATCH, SIDE // PATCH, PATCH, 3).swapaxes(1, 2).reshape(PATCHES, -1)
        caption = [*tok.encode(record["txt"].decode()).ids, EOS]
        return {"__key__": record["__key__"], "pixel_values": patches, "input_ids": [image_id] * PATCHES + caption}

    rows = TokenRows(max_length=MAX_LENGTH, pad_token_id=EOS, ignore_ids=(image_id,), pack=True)
    return (
        Pipeline(load_work_source(config))
        .map_transform(to_sample, seeded=True)
        .batch(microbatch_size=microbatch_size, collate=rows)
    )


# --- the model: image patches scattered into the placeholder positions, a causal transformer ------------------


class TinyVLM(torch.nn.Module):
    def __init__(self, vocab: int, image_id: int, width: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.image_id, self.heads = image_id, heads
        self.tokens = torch.nn.Embedding(vocab, width)
        self.patches = torch.nn.Linear(PATCH_DIM, width)
        self.positions = torch.nn.Embedding(MAX_LENGTH, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, t: dict) -> torch.Tensor:
        ids, positions = t["input_ids"], t["position_ids"]
        is_image = ids == self.image_id
        x = self.tokens(ids).masked_scatter(is_image[..., None], self.patches(t["pixel_values"]))
        x = x + self.positions(positions)
        # Attend causally and inside one record: a segment starts wherever the position ids restart.
        segment = torch.cumsum(positions == 0, dim=1)
        causal = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
        allowed = (segment[:, :, None] == segment[:, None, :]) & causal
        blocked = (~allowed).repeat_interleave(self.heads, dim=0)  # (B·heads, L, L): True = may not attend
        for block in self.blocks:
            x = block(x, src_mask=blocked)
        return self.head(x)


def train(pipeline: Pipeline, tok: Tokenizer, steps: int) -> list[float]:
    torch.set_num_threads(1)  # a model this small only loses time to more threads
    torch.manual_seed(0)
    model = TinyVLM(tok.get_vocab_size(), tok.token_to_id(IMAGE))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses: list[float] = []
    for step, batch in enumerate(pipeline):
        if step == steps:
            break
        t = batch.data  # a RecordBatch: .data is what TokenRows made
        assert int((t["input_ids"] == model.image_id).sum()) == PATCHES * len(t["pixel_values"])
        logits = model(t)
        summed = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), t["labels"].flatten(), ignore_index=-100, reduction="sum"
        )
        loss = summed / t["num_valid_tokens"].clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f} ({len(t['pixel_values'])} images in {len(t['input_ids'])} rows)")
        losses.append(loss.item())
    return losses


# --- the data: two datasets of drawn images and their captions, written as WebDataset shards -----------------

COLORS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40)}
BACKGROUNDS = {"white": (245, 245, 245), "black": (15, 15, 15)}


def draw(kind: str, rng: np.random.Generator) -> tuple[bytes, str]:
    """A 48×48 PNG and its caption: a shape (``shapes``) or stripes (``stripes``) of one color."""
    color, background = rng.choice(list(COLORS)), rng.choice(list(BACKGROUNDS))
    image = Image.new("RGB", (48, 48), BACKGROUNDS[background])
    pen = ImageDraw.Draw(image)
    if kind == "shapes":
        shape = rng.choice(["circle", "square", "triangle"])
        c, r = 24 + rng.integers(-4, 5, size=2), int(rng.integers(10, 16))
        box = (int(c[0] - r), int(c[1] - r), int(c[0] + r), int(c[1] + r))
        if shape == "circle":
            pen.ellipse(box, fill=COLORS[color])
        elif shape == "square":
            pen.rectangle(box, fill=COLORS[color])
        else:
            pen.polygon([(box[0], box[3]), (box[2], box[3]), (int(c[0]), box[1])], fill=COLORS[color])
        caption = f"a {color} {shape} on a {background} background"
    else:
        vertical = bool(rng.integers(0, 2))
        for k in range(0, 48, 8):
            pen.rectangle((k, 0, k + 3, 47) if vertical else (0, k, 47, k + 3), fill=COLORS[color])
        caption = f"{'vertical' if vertical else 'horizontal'} {color} stripes on a {background} background"
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue(), caption


def write_pairs(root: Path, shards: int = 2, samples: int = 64, seed: int = 0) -> None:
    """``root/{shapes,stripes}/{shard:03d}.tar``; sample ``i`` of shard ``s`` drawn from ``(seed, kind, s, i)``."""
    for k, kind in enumerate(("shapes", "stripes")):
        (root / kind).mkdir(parents=True, exist_ok=True)
        for s in range(shards):
            with tarfile.open(root / kind / f"{s:03d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
                for i in range(samples):
                    png, caption = draw(kind, np.random.default_rng([seed, k, s, i]))
                    for ext, payload in (("png", png), ("txt", caption.encode())):
                        info = tarfile.TarInfo(f"{kind}-{s:03d}-{i:04d}.{ext}")
                        info.size, info.mtime = len(payload), 0
                        tar.addfile(info, io.BytesIO(payload))


def prepare(workdir: Path) -> Path:
    """The data written under ``workdir`` and the CONFIG file copied beside it; returns the copy."""
    write_pairs(workdir / "pairs")
    return Path(shutil.copy(CONFIG, workdir / CONFIG.name))


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="zephon-vlm-"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(workdir / "cache"))
    tok = tokenizer()
    return train(make_pipeline(prepare(workdir), tok), tok, args.steps)


if __name__ == "__main__":
    main()
