"""Tokenizing documents: a Hugging Face tokenizer, EOS after every document, BOS by the tokenizer's convention.

``tokenizer_id`` is a Hub id (``"gpt2"``, loaded through transformers and its cache), a local directory
(``tokenizer.json`` plus ``tokenizer_config.json``), or a path to a ``tokenizer.json`` file. Text is encoded
without the tokenizer's own special tokens; then each document gets

* ``bos``: with ``add_bos=None`` (default) the tokens that the tokenizer itself puts before a text when asked
  for special tokens (Llama-style tokenizers prepend ``<s>``; GPT-2 adds nothing); ``True`` forces the BOS
  token, ``False`` never adds one;
* the document's tokens;
* ``eos``: always one EOS token (``eos_token`` overrides the tokenizer's), so document boundaries survive
  packing.

Example with GPT-2: "Hello world" → [15496, 995, 50256].
Encoding uses ``tokenizers``' batch encoder, which runs on all cores (``RAYON_NUM_THREADS`` bounds it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from zephon.errors import ConfigError, TokenizerError

_EOS_GUESSES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizeSpec:
    """Settings of ``Pipeline.tokenize``.

    Attributes:
        tokenizer_id: Hub id, local directory, or tokenizer.json path.
        field: the text column (Parquet) or key (JSONL).
        add_bos: None follows the tokenizer's convention; True/False force it.
        eos_token: EOS token string; None uses the tokenizer's.
    """

    tokenizer_id: str
    field: str = "text"
    add_bos: bool | None = None
    eos_token: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tokenizer_id, str) or not self.tokenizer_id:
            raise ConfigError(f"tokenizer_id must be a non-empty string, got {self.tokenizer_id!r}")
        if not isinstance(self.field, str) or not self.field:
            raise ConfigError(f"field must be a non-empty column name, got {self.field!r}")


def _special_tokens_from_config(directory: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = directory / name
        if file.is_file():
            data = json.loads(file.read_text(encoding="utf-8"))
            for key in ("eos_token", "bos_token", "pad_token"):
                value = data.get(key)
                if isinstance(value, dict):
                    value = value.get("content")
                if isinstance(value, str) and key not in out:
                    out[key] = value
    return out


def _load(tokenizer_id: str) -> tuple[Tokenizer, dict[str, str]]:
    path = Path(tokenizer_id).expanduser()
    if path.is_file():
        return Tokenizer.from_file(str(path)), _special_tokens_from_config(path.parent)
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(
                f"tokenizer directory must contain tokenizer.json, got none in {path} — save the tokenizer "
                "with save_pretrained() (a fast tokenizer)"
            )
        return Tokenizer.from_file(str(file)), _special_tokens_from_config(path)
    hub_files = _hub_tokenizer_files(tokenizer_id)
    if hub_files is not None:
        return Tokenizer.from_file(str(hub_files / "tokenizer.json")), _special_tokens_from_config(hub_files)
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(tokenizer_id)
    except Exception as exc:  # transformers raises many types: OSError, ValueError, HTTP errors
        raise TokenizerError(
            f"tokenizer {tokenizer_id!r} could not be loaded ({type(exc).__name__}: {str(exc).splitlines()[0]}) "
            "— pass a local directory or tokenizer.json path, or make the Hub reachable (HF_TOKEN for gated models)"
        ) from exc
    if not getattr(hf, "is_fast", False):
        raise TokenizerError(f"tokenizer {tokenizer_id!r} must have a fast (Rust) version, got a slow one")
    specials = {k: v for k in ("eos_token", "bos_token", "pad_token") if isinstance(v := getattr(hf, k, None), str)}
    return hf.backend_tokenizer, specials


def _hub_tokenizer_files(tokenizer_id: str) -> Path | None:
    """Download a Hub model's ``tokenizer.json`` (and its configs) through the Hugging Face cache.

    A Hub tokenizer is read from the same files a local directory holds, so the same tokenizer gets the
    same fingerprint wherever it was loaded from. Returns None when the repo has no ``tokenizer.json``
    (then transformers converts it) or cannot be reached (transformers reports why).
    """
    try:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(tokenizer_id, "tokenizer.json"))
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            with contextlib.suppress(Exception):  # optional files: absent is fine
                hf_hub_download(tokenizer_id, name)
    except Exception:
        return None
    return path.parent


class Encoder:
    """Encodes batches of texts into per-document token arrays with BOS/EOS applied."""

    def __init__(self, spec: TokenizeSpec) -> None:
        self.spec = spec
        tokenizer, specials = _load(spec.tokenizer_id)
        self.tokenizer = tokenizer
        eos = spec.eos_token or specials.get("eos_token")
        if eos is None:
            eos = next((t for t in _EOS_GUESSES if tokenizer.token_to_id(t) is not None), None)
        eos_id = tokenizer.token_to_id(eos) if eos is not None else None
        if eos_id is None:
            raise TokenizerError(
                f"tokenizer {spec.tokenizer_id!r} must have an EOS token, got {eos!r} — pass "
                "tokenize(eos_token=...) with a token in its vocabulary"
            )
        self.eos_id: int = eos_id
        bos = specials.get("bos_token")
        self.bos_id: int | None = tokenizer.token_to_id(bos) if bos else None
        pad = specials.get("pad_token")
        self.pad_id: int = (tokenizer.token_to_id(pad) if pad else None) or self.eos_id
        self.prefix: list[int] = self._bos_prefix(spec.add_bos)
        self.fingerprint = hashlib.sha256(
            (tokenizer.to_str() + json.dumps([self.prefix, self.eos_id])).encode()
        ).hexdigest()

    def _bos_prefix(self, add_bos: bool | None) -> list[int]:
        if add_bos is False:
            return []
        if add_bos is True:
            if self.bos_id is None:
                raise TokenizerError(
                    f"tokenizer {self.spec.tokenizer_id!r} must define a BOS token for add_bos=True, got none "
                    "— use add_bos=None or False"
                )
            return [self.bos_id]
        probe = "zephon"
        with_special = self.tokenizer.encode(probe, add_special_tokens=True).ids
        plain = self.tokenizer.encode(probe, add_special_tokens=False).ids
        for cut in range(len(with_special) - len(plain) + 1):
            if with_special[cut : cut + len(plain)] == plain:
                return with_special[:cut]
        return []

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids (int64) of each text, with the BOS prefix and one EOS."""
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        prefix = self.prefix
        eos = [self.eos_id]
        return [np.array(prefix + e.ids + eos, dtype=np.int64) for e in encodings]
