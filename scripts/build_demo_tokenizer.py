"""Build the embedded demo tokenizer (``zephon/assets/tokenizer``) from the demo corpus.

A GPT-2 style byte-level BPE with a 4096-token vocabulary, trained with the ``tokenizers`` library on
the documents of the demo dataset (seed 0 of ``demo_grammar.generate_demo_documents``: the texts that
``zephon/assets/demo/corpus.jsonl.zst`` ships). The only special token is ``<|endoftext|>`` at id 0, used as
eos, bos and unk; nothing is added on encode.
Training is deterministic, so rerunning this script reproduces the committed files byte for byte::

    python scripts/build_demo_tokenizer.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path

from demo_grammar import generate_demo_documents
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from zephon.demo import DEMO_KINDS, DEMO_SHARDS

VOCAB_SIZE = 4096
EOS = "<|endoftext|>"
SEED = 0
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "zephon" / "assets" / "tokenizer"


def training_corpus(seed: int = SEED) -> Iterator[str]:
    """Every document of the demo dataset for ``seed``, kind by kind."""
    for kind in DEMO_KINDS:
        shards, per_shard = DEMO_SHARDS[kind]
        yield from generate_demo_documents(kind, shards * per_shard, seed)


def build_tokenizer(seed: int = SEED) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_corpus(seed), trainer=trainer)
    return tokenizer


def tokenizer_config() -> dict[str, object]:
    """``tokenizer_config.json`` for transformers, GPT-2 style (no BOS/EOS added on encode)."""
    special = {
        "content": EOS,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {"0": special},
        "bos_token": EOS,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "errors": "replace",
        "model_max_length": 1000000000000000019884624838656,
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": EOS,
    }


def special_tokens_map() -> dict[str, str]:
    return {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS}


def _write_json(path: Path, obj: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tokenizer()
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"trained vocabulary has {tokenizer.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    if tokenizer.token_to_id(EOS) != 0:
        raise SystemExit(f"{EOS} must have id 0, got {tokenizer.token_to_id(EOS)}")

    tmp = out / "tokenizer.json.tmp"
    tokenizer.save(str(tmp), pretty=False)
    os.replace(tmp, out / "tokenizer.json")
    _write_json(out / "tokenizer_config.json", tokenizer_config())
    _write_json(out / "special_tokens_map.json", special_tokens_map())
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        print(f"{out / name}: {(out / name).stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
