"""Encoders beyond the documented API's text tokenization: special-token modes, per-document length limits, chat.

``make_encoder(spec)`` gives the encoder a ``TokenizeSpec`` asks for. The documented API's settings (``spec.plain``) get
``zephon.executor.encode.text.Encoder`` itself — same ids, same fingerprint, same speed, so existing plans and
batches stay byte-identical. Otherwise:

* ``TextEncoder`` — ``special_tokens`` (``bos_eos | bos | eos | none | tokenizer_default``) and ``max_tokens``
  with ``long_documents="truncate"`` or ``"split"``. The text is encoded by the ``Encoder`` (fast engines
  included), then each document is re-wrapped in numpy (``reshape``): its body, cut to
  ``max_tokens − specials`` tokens (truncate) or into pieces of that size (split), each piece wrapped with the
  mode's prefix and suffix. A split document stays one plan document (one position, its tokens the sum of its
  pieces'); each piece after the first starts a new segment (``zephon.executor.encode.flags.SEGMENT``), so
  position ids restart and labels never cross into it.
* ``ChatEncoder`` — ``tokenize_chat``: the shard reader turns each record into a ``RenderedChat``
  (``zephon.executor.encode.chat_render``; layout, checks and template on the reader's thread, with the record's
  location in any error), and the encoder sets ``token_flags.LOSS`` on every token that overlaps an assistant
  span. The ids come from the plain ``Encoder``'s verified engine; each token's character offsets are derived
  from its id's bytes (``zephon.executor.engines.offsets``, byte-level tokenizers), checked on the run's first
  ``CHAT_SAMPLE`` conversations against ``tokenizers``' own offsets (ids and masks equal). A tokenizer whose
  offsets cannot be derived, or that fails the check, keeps ``tokenizers``' offsets for the run (``refused``
  names ``"<engine> for chat"`` and why); a conversation whose ids do not spell its bytes (a normalizer
  changed the text) gets ``tokenizers``' offsets alone (``tokenizer_offsets`` counts them).

Worked example of ``reshape`` (prefix [B], suffix [E], max_tokens 4, split): body [a b c d e] → pieces [a b],
[c d], [e] → [B a b E] [B c d E] [B e E], one document of 11 tokens with segment starts at its tokens 4 and 8.

Every encoder has ``fingerprint`` (what its ids depend on: the tokenizer and these settings, never the
engine), ``pad_id``, ``encode_flat`` / ``encode``, ``converter`` (what the shard reader must hand it: None for
plain texts) and ``flags`` (whether ids carry ``token_flags`` bits, which ``Batch`` then clears).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon.errors import ConfigError, TokenizerError
from zephon.executor.encode.chat import ChatEncoder, load_chat_template
from zephon.executor.encode.flags import tag
from zephon.executor.encode.parts import (
    PLAIN_SETTINGS,
    OnBaseEncoder,
    RecordConverter,
    TextField,
    reshape,
    settings_digest,
    text_bodies,
)
from zephon.executor.encode.text import Encoded, Encoder
from zephon.executor.operators import Operator
from zephon.specs import TokenizeSpec

__all__ = [
    "AnyEncoder",
    "ChatEncoder",
    "RecordConverter",
    "StoreLoss",
    "TextEncoder",
    "WithOperators",
    "carries_flags",
    "converter_of",
    "for_stores",
    "load_chat_template",
    "make_encoder",
    "masks_loss",
    "operators_of",
    "reshape",
]


class TextEncoder(OnBaseEncoder):
    """Text with a ``special_tokens`` mode and/or a ``max_tokens`` limit (see the module docstring)."""

    flags: bool
    converter = None

    def __init__(self, spec: TokenizeSpec, *, threads: int | None = None) -> None:
        self.spec = spec
        mode = spec.special_tokens
        # The body comes from the plain Encoder without BOS; its one EOS is dropped again when the mode has none.
        self.base = Encoder(
            dataclasses.replace(spec, add_bos=False if mode else spec.add_bos, **PLAIN_SETTINGS), threads=threads
        )
        b = self.base
        self.eos_id, self.bos_id, self.pad_id, self.tokenizer = b.eos_id, b.bos_id, b.pad_id, b.tokenizer
        if mode is None:
            self.prefix, self.suffix = list(b.prefix), [b.eos_id]
        elif mode == "tokenizer_default":
            self.prefix, self.suffix = _post_processor_tokens(b)
        else:
            needs_bos = mode in ("bos_eos", "bos")
            if needs_bos and b.bos_id is None:
                raise TokenizerError(
                    f"tokenizer {spec.tokenizer_id!r} must define a BOS token for special_tokens={mode!r}, got "
                    "none — use special_tokens='eos' or 'none'"
                )
            self.prefix = [b.bos_id] if needs_bos and b.bos_id is not None else []
            self.suffix = [b.eos_id] if mode in ("bos_eos", "eos") else []
        self.cap: int | None = None
        if spec.max_tokens is not None:
            self.cap = spec.max_tokens - len(self.prefix) - len(self.suffix)
            if self.cap < 1:
                raise ConfigError(
                    f"max_tokens must leave room for text after {len(self.prefix) + len(self.suffix)} special "
                    f"tokens, got {spec.max_tokens} — raise it"
                )
        self.split = spec.long_documents == "split"
        self.flags = self.cap is not None and self.split
        self.fingerprint = settings_digest(
            b.fingerprint, "text", mode, self.prefix, self.suffix, spec.max_tokens, spec.long_documents
        )

    def encode_flat(self, texts: list[Any], order: np.ndarray | None = None, *, split: bool = True) -> Encoded:
        encoded = self.base.encode_flat(texts, order, split=split)
        ids, sizes = text_bodies(encoded, len(self.base.prefix), 1)
        return reshape(ids, sizes, self.prefix, self.suffix, self.cap, self.split)

    def encode(self, texts: list[Any]) -> list[np.ndarray]:
        return self.encode_flat(texts).split()


def _post_processor_tokens(encoder: Encoder) -> tuple[list[int], list[int]]:
    """The tokens the tokenizer's own post-processor puts before and after a text."""
    probe = "zephon"
    full = encoder.tokenizer.encode(probe, add_special_tokens=True).ids
    plain = encoder.tokenizer.encode(probe, add_special_tokens=False).ids
    for cut in range(len(full) - len(plain) + 1):
        if full[cut : cut + len(plain)] == plain:
            return full[:cut], full[cut + len(plain) :]
    return [], []


class WithOperators:
    """An encoder behind user operators: the reader hands it records run through ``operators`` and then the
    inner encoder's own conversion (its text field, or the chat template); everything else is the inner
    encoder's. Its fingerprint covers the operators'."""

    def __init__(self, inner: Encoder | TextEncoder | ChatEncoder, operators: tuple[Operator, ...]) -> None:
        self.inner = inner
        self.operators = operators
        final = inner.final if isinstance(inner, ChatEncoder) else TextField(inner.spec.field)
        self.converter = RecordConverter(columns=None, required=(), final=final, operators=operators)
        self.flags, self.masks_loss = carries_flags(inner), masks_loss(inner)
        self.fingerprint = settings_digest(inner.fingerprint, "operators", [op.fingerprint for op in operators])

    def __getattr__(self, name: str) -> Any:  # spec, pad_id, eos_id, prefix, tokenizer, engine, encode_flat, ...
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


class StoreLoss:
    """An encoder whose ids carry a loss mask because a token store of the plan keeps one (datatrove
    ``.ds.loss``): the store's documents come flagged with it (``slices.LossFlagged``), and the texts this
    encoder makes train on every token (``LOSS`` on each), so batches carry ``loss_mask`` and labels of the tokens
    the store marks as not training are -100. Everything else — ids, fingerprint — is the inner encoder's."""

    flags = True
    masks_loss = True

    def __init__(self, inner: Encoder | TextEncoder | ChatEncoder | WithOperators) -> None:
        self.inner = inner

    def encode_flat(self, texts: list[Any], *args: Any, **kwargs: Any) -> Encoded:
        encoded = self.inner.encode_flat(texts, *args, **kwargs)
        ids = tag(encoded.ids, loss=np.ones(len(encoded.ids), dtype=bool))  # segment bits (split) kept
        return Encoded(ids, encoded.sizes, encoded.cut)

    def __getattr__(self, name: str) -> Any:  # spec, pad_id, fingerprint, tokenizer, engine, encode, ...
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


AnyEncoder = Encoder | TextEncoder | ChatEncoder | WithOperators | StoreLoss


def for_stores(encoder: AnyEncoder, datasets: Sequence[Any]) -> AnyEncoder:
    """``encoder`` behind ``StoreLoss`` when a dataset of the plan (plan.json ``datasets``) is a token store that
    keeps a loss mask and ``encoder`` masks no loss of its own (chat does: its ids already carry one)."""
    stores = (getattr(d, "token_store", None) or {} for d in datasets)
    if masks_loss(encoder) or not any(spec.get("loss_mask") for spec in stores):
        return encoder
    return StoreLoss(encoder)


def make_encoder(spec: TokenizeSpec, operators: tuple[Operator, ...] = (), *, threads: int | None = None) -> AnyEncoder:
    """The encoder ``spec`` asks for, behind ``operators`` when there are any: the plain ``Encoder`` for
    ``spec.plain`` settings without operators (unchanged ids, fingerprint and speed). ``threads``:
    ``tokenizer_threads`` of the engine underneath (never changes the ids)."""
    if spec.chat is not None:
        inner: Encoder | TextEncoder | ChatEncoder = ChatEncoder(spec, threads=threads)
    elif spec.plain:
        inner = Encoder(spec, threads=threads)
    else:
        inner = TextEncoder(spec, threads=threads)
    return WithOperators(inner, operators) if operators else inner


def operators_of(encoder: object) -> tuple[Operator, ...]:
    """The user operators in front of ``encoder`` (none for a bare encoder)."""
    return getattr(encoder, "operators", ())


def converter_of(encoder: object) -> RecordConverter | None:
    """What the shard reader must turn each record into for ``encoder`` (None: the text field's strings)."""
    return getattr(encoder, "converter", None)


def carries_flags(encoder: object) -> bool:
    """Whether ``encoder``'s ids carry ``token_flags`` bits (the plain ``Encoder``'s never do)."""
    return bool(getattr(encoder, "flags", False))


def masks_loss(encoder: object) -> bool:
    """Whether ``encoder`` sets ``LOSS`` on the tokens that train (chat: a loss mask); an encoder whose ids carry
    flags for segments only (``long_documents="split"``) trains on every token."""
    return bool(getattr(encoder, "masks_loss", False))
