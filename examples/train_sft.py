"""Supervised fine-tuning on alpaca-style data: chat template, loss on the answers only, packed rows.

    python examples/train_sft.py --tokenizer Qwen/Qwen2.5-0.5B-Instruct            # the documented API's alpaca dataset
    python examples/train_sft.py --data DIR --tokenizer TOKENIZER_DIR --steps 20    # a local copy

``--data`` defaults to ``hf://yahma/alpaca-cleaned@~parquet/train`` (instruction / input / output columns;
downloaded into the shard cache under ``--workdir``). ``--tokenizer`` must have a chat template (or pass
``--chat-template FILE``). Each record becomes a user turn (instruction, a blank line, input) and an assistant
turn (output); the loss covers the assistant's tokens and its end-of-turn token only, also when several
conversations are packed into one row. The loss of each step is normalized by ``num_valid_tokens``, the tokens
that count (summed over ranks and microbatches in a real job). A tiny embedding + linear model stands in for
an LLM; the script prints each step's loss and the share of label positions that train.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from zephon import Pipeline
from zephon.io import CacheOptions, Dataset, StoreOptions
from zephon.work import MixtureSpec, StaticMixtureWorkSource

ALPACA = "hf://yahma/alpaca-cleaned@~parquet/train"


def make_pipeline(data: str, tokenizer: str, workdir: Path, *, chat_template: str | None, max_length: int) -> Pipeline:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("alpaca", data)], mixture=MixtureSpec({"alpaca": 1.0}), seed=0
    )
    cache = StoreOptions(cache=CacheOptions(enabled=True, root=str(workdir / "shards")))
    return (
        Pipeline(source)
        .options(io_options=cache)
        .tokenize_chat(tokenizer_id=tokenizer, layout="alpaca", chat_template=chat_template)
        .pack_flat(max_length=max_length)
        .batch(microbatch_size=4)
    )


def train(pipeline: Pipeline, steps: int, vocab: int) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 64), torch.nn.Linear(64, vocab))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for step, batch in enumerate(pipeline):
        if step == steps:
            break
        t = batch.to_training(return_labels=True, return_num_valid_tokens=True, return_position_ids=True)
        logits = model(t["input_ids"])
        summed = torch.nn.functional.cross_entropy(
            logits.reshape(-1, vocab), t["labels"].reshape(-1), ignore_index=-100, reduction="sum"
        )
        loss = summed / t["num_valid_tokens"].clamp(min=1)  # under DDP: all-reduce num_valid_tokens first
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        share = int(t["num_valid_tokens"]) / t["labels"].numel()
        print(f"step {step}: loss {loss.item():.4f}, training on {share:.0%} of label positions")
        losses.append(loss.item())
    return losses


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=ALPACA)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--chat-template", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--max-length", type=int, default=257)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="zephon-sft-"))
    template = args.chat_template.read_text(encoding="utf-8") if args.chat_template else None
    pipeline = make_pipeline(args.data, args.tokenizer, workdir, chat_template=template, max_length=args.max_length)
    from zephon.executor.encode.encoders import make_encoder

    vocab = make_encoder(pipeline.executor_spec().tokenize).tokenizer.get_vocab_size()
    return train(pipeline, args.steps, vocab)


if __name__ == "__main__":
    main()
