"""Encoders beyond the seed's text tokenization: special-token modes, per-document length limits, chat.

``make_encoder(spec)`` gives the encoder a ``TokenizeSpec`` asks for. The seed's settings (``spec.plain``) get
``zephon.executor.tokenize.Encoder`` itself — same ids, same fingerprint, same speed, so existing plans and
batches stay byte-identical. Otherwise:

* ``TextEncoder`` — ``special_tokens`` (``bos_eos | bos | eos | none | tokenizer_default``) and ``max_tokens``
  with ``long_documents="truncate"`` or ``"split"``. The text is encoded by the ``Encoder`` (fast engines
  included), then each document is re-wrapped in numpy (``reshape``): its body, cut to
  ``max_tokens − specials`` tokens (truncate) or into pieces of that size (split), each piece wrapped with the
  mode's prefix and suffix. A split document stays one plan document (one position, its tokens the sum of its
  pieces'); each piece after the first starts a new segment (``zephon.executor.token_flags.SEGMENT``), so
  position ids restart and labels never cross into it.
* ``ChatEncoder`` — ``tokenize_chat``: the shard reader turns each record into a ``RenderedChat``
  (``zephon.executor.chat``; layout, checks and template on the reader's thread, with the record's location in
  any error), and the encoder sets ``token_flags.LOSS`` on every token that overlaps an assistant span. The ids
  come from the seed ``Encoder``'s verified engine; each token's character offsets are derived from its id's
  bytes (``zephon.executor.engines.offsets``, byte-level tokenizers), checked on the run's first
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
import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import ConfigError, TokenizerError
from zephon.executor.chat import BadRecord, ChatRenderer, RenderedChat, to_messages
from zephon.executor.engines.offsets import ByteOffsets
from zephon.executor.operators import Operator, OperatorChain, Where
from zephon.executor.token_flags import LOSS, SEGMENT
from zephon.executor.tokenize import Encoded, Encoder
from zephon.specs import TokenizeSpec


def _spread(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Indices ``starts[i] + j`` for ``j < sizes[i]``, concatenated over ``i``."""
    return np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()), dtype=np.int64)


def reshape(
    ids: np.ndarray, sizes: np.ndarray, prefix: list[int], suffix: list[int], cap: int | None, split: bool
) -> Encoded:
    """Documents' bodies (``ids``, ``sizes``) cut to ``cap`` tokens or split into pieces of ``cap`` (``split``),
    each piece wrapped in ``prefix`` and ``suffix``; pieces after a document's first carry ``SEGMENT``."""
    sizes = sizes.astype(np.int64)
    docs = len(sizes)
    body_starts = np.cumsum(sizes) - sizes
    if cap is None:
        counts = np.ones(docs, dtype=np.int64)
    elif split:
        counts = np.maximum(1, -(-sizes // cap))
    else:
        counts = np.ones(docs, dtype=np.int64)
    owner = np.repeat(np.arange(docs, dtype=np.int64), counts)
    index = np.arange(len(owner), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    step = cap if cap is not None else 0
    src = body_starts[owner] + index * step
    length = sizes[owner] - index * step
    if cap is not None:
        length = np.minimum(length, cap)
    p, q = len(prefix), len(suffix)
    out_len = length + p + q
    out_starts = np.cumsum(out_len) - out_len
    out = np.empty(int(out_len.sum()), dtype=np.int64)
    out[_spread(out_starts + p, length)] = ids[_spread(src, length)]
    for k, token in enumerate(prefix):
        out[out_starts + k] = token
    for k, token in enumerate(suffix):
        out[out_starts + p + length + k] = token
    later = out_starts[(index > 0) & (out_len > 0)]
    out[later] |= SEGMENT
    return Encoded(out, np.bincount(owner, weights=out_len, minlength=docs).astype(np.int64))


def _bodies(encoded: Encoded, head: int, tail: int) -> tuple[np.ndarray, np.ndarray]:
    """Each document less its first ``head`` and last ``tail`` tokens."""
    ends = np.cumsum(encoded.sizes)
    starts = ends - encoded.sizes
    keep = np.ones(len(encoded.ids), dtype=bool)
    for k in range(head):
        keep[starts + k] = False
    for k in range(1, tail + 1):
        keep[ends - k] = False
    return encoded.ids[keep], encoded.sizes - head - tail


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


class _OnBase:
    """What a wrapping encoder takes from its seed ``Encoder`` (``base``): threads, the engine, lengths."""

    base: Encoder

    @property
    def threads(self) -> int:
        return self.base.threads

    @property
    def releases_gil(self) -> bool:
        return self.base.releases_gil

    @property
    def engine(self) -> str:
        return self.base.engine

    @property
    def refused(self) -> dict[str, str]:
        return self.base.refused

    @property
    def settled(self) -> bool:
        return self.base.settled

    @property
    def engine_note(self) -> str:
        return self.base.engine_note

    def encode_flat(self, texts: list[Any], order: np.ndarray | None = None, *, split: bool = True) -> Encoded:
        raise NotImplementedError

    def lengths(self, texts: list[Any], *, split: bool = True) -> np.ndarray:
        """Tokens of each document, as ``encode_flat`` makes them (the count pass, calibration)."""
        return self.encode_flat(texts, split=split).sizes


class TextEncoder(_OnBase):
    """Text with a ``special_tokens`` mode and/or a ``max_tokens`` limit (see the module docstring)."""

    flags: bool
    converter = None

    def __init__(self, spec: TokenizeSpec, *, threads: int | None = None) -> None:
        self.spec = spec
        mode = spec.special_tokens
        # The body comes from the seed Encoder without BOS; its one EOS is dropped again when the mode has none.
        self.base = Encoder(
            dataclasses.replace(spec, add_bos=False if mode else spec.add_bos, **_PLAIN), threads=threads
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
        self.fingerprint = _digest(
            b.fingerprint, "text", mode, self.prefix, self.suffix, spec.max_tokens, spec.long_documents
        )

    def encode_flat(self, texts: list[Any], order: np.ndarray | None = None, *, split: bool = True) -> Encoded:
        encoded = self.base.encode_flat(texts, order, split=split)
        ids, sizes = _bodies(encoded, len(self.base.prefix), 1)
        return reshape(ids, sizes, self.prefix, self.suffix, self.cap, self.split)

    def encode(self, texts: list[Any]) -> list[np.ndarray]:
        return self.encode_flat(texts).split()


#: The settings the seed ``Encoder`` must not see (it would not know them).
_PLAIN: dict[str, Any] = {"special_tokens": None, "max_tokens": None, "long_documents": "truncate", "chat": None}


def _post_processor_tokens(encoder: Encoder) -> tuple[list[int], list[int]]:
    """The tokens the tokenizer's own post-processor puts before and after a text."""
    probe = "zephon"
    full = encoder.tokenizer.encode(probe, add_special_tokens=True).ids
    plain = encoder.tokenizer.encode(probe, add_special_tokens=False).ids
    for cut in range(len(full) - len(plain) + 1):
        if full[cut : cut + len(plain)] == plain:
            return full[:cut], full[cut + len(plain) :]
    return [], []


class ChatRecord:
    """A chat record to a ``RenderedChat`` (layout, checks, template), or ``BadRecord``."""

    def __init__(self, spec: TokenizeSpec, renderer: ChatRenderer) -> None:
        assert spec.chat is not None
        self.chat, self.field, self.renderer = spec.chat, spec.field, renderer

    def __call__(self, record: dict[str, Any]) -> RenderedChat:
        return self.renderer.render(to_messages(record, self.chat, self.field))


class TextField:
    """A record's text field (after user operators), or ``BadRecord``."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __call__(self, record: dict[str, Any]) -> str:
        value = record.get(self.field)
        if isinstance(value, str):
            return value
        if self.field not in record:
            raise BadRecord("missing_field", f"field {self.field!r} must be in the record, got keys {sorted(record)}")
        reason = "null_text" if value is None else "not_text"
        raise BadRecord(reason, f"field {self.field!r} must be a string, got {type(value).__name__}")


class RecordConverter:
    """What the shard reader does with whole records (chat, or user operators): ``columns`` to read from Parquet
    (None: all), ``required`` of them must exist; ``convert_all`` runs the operators (``zephon.executor.operators``)
    and then ``final`` on each record (``ChatRecord`` or ``TextField``), reporting problems with their location."""

    def __init__(
        self,
        *,
        columns: tuple[str, ...] | None,
        required: tuple[str, ...],
        final: Callable[[dict[str, Any]], Any],
        operators: tuple[Operator, ...] = (),
    ) -> None:
        self.columns, self.required, self.final, self.operators = columns, required, final, operators
        self.chain = OperatorChain(operators) if operators else None

    def convert_all(self, where: list[Where], records: list[Any], documents: Any) -> list[Any]:
        """The records converted; None where one was skipped, dropped or failed (``documents``: the reader's
        ``BadDocuments``, which raises or counts)."""
        values = records
        if self.chain is not None:
            values = self.chain.run(
                records,
                where,
                report=lambda w, reason, message: documents.report(w.ref, w.row, reason, message),
                drop=lambda w: documents.drop(w.ref, w.row),
            )
        out: list[Any] = []
        for w, value in zip(where, values, strict=True):
            if value is None:
                out.append(None)
                continue
            try:
                out.append(self.final(value))
            except BadRecord as exc:
                documents.report(w.ref, w.row, exc.reason, f"{w}: {exc.expected} — fix the record")
                out.append(None)
        return out


def load_chat_template(tokenizer_id: str) -> str | None:
    """The tokenizer's own chat template: ``chat_template.jinja``, else ``chat_template`` in
    tokenizer_config.json (a string, or a list of named templates: ``default``), beside a local tokenizer or in the
    Hugging Face cache for a Hub id."""
    path = Path(tokenizer_id).expanduser()
    folder = path.parent if path.is_file() else path if path.is_dir() else None
    files: dict[str, Path | None] = {}
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        if folder is not None:
            files[name] = folder / name if (folder / name).is_file() else None
        else:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(tokenizer_id, name)
            files[name] = Path(found) if isinstance(found, str) else None
    jinja = files["chat_template.jinja"]
    if jinja is not None:
        return jinja.read_text(encoding="utf-8")
    config = files["tokenizer_config.json"]
    if config is None:
        return None
    value = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) and value else None


#: Conversations of the first batch on which derived offsets are checked against ``tokenizers``' offsets.
CHAT_SAMPLE = 64


def _mask(ids: np.ndarray, offsets: np.ndarray, spans: tuple[tuple[int, int], ...]) -> None:
    """Set ``LOSS`` on the ids whose (start, end) character offsets overlap a span (an empty token: lies in it)."""
    s, e = offsets[:, :1], offsets[:, 1:]
    a = np.array([x for x, _ in spans])[None, :]
    b = np.array([y for _, y in spans])[None, :]
    inside = ((s < b) & (e > a)) | ((s == e) & (s >= a) & (s < b))
    ids[inside.any(axis=1)] |= LOSS


class ChatEncoder(_OnBase):
    """Rendered conversations to token ids with ``LOSS`` on the assistant tokens (see the module docstring)."""

    flags = True

    def __init__(self, spec: TokenizeSpec, *, threads: int | None = None) -> None:
        assert spec.chat is not None
        self.spec = spec
        self.base = Encoder(dataclasses.replace(spec, add_bos=False, **_PLAIN), threads=threads)
        b = self.base
        self.eos_id, self.bos_id, self.pad_id, self.tokenizer = b.eos_id, b.bos_id, b.pad_id, b.tokenizer
        template = spec.chat.chat_template or load_chat_template(spec.tokenizer_id)
        if template is None:
            raise TokenizerError(
                f"tokenizer {spec.tokenizer_id!r} must have a chat template for tokenize_chat, got none — pass "
                "tokenize_chat(chat_template=...)"
            )
        specials = {"eos_token": b.tokenizer.id_to_token(b.eos_id) or ""}
        if b.bos_id is not None:
            specials["bos_token"] = b.tokenizer.id_to_token(b.bos_id) or ""
        try:
            renderer = ChatRenderer(template, spec.chat, specials)
        except BadRecord as exc:
            raise TokenizerError(f"{exc.expected} — fix the template") from exc
        self.final = ChatRecord(spec, renderer)
        alpaca = spec.chat.layout == "alpaca"
        self.converter = RecordConverter(
            columns=("instruction", "input", "output") if alpaca else (spec.field,),
            required=("instruction", "output") if alpaca else (spec.field,),
            final=self.final,
        )
        self.cap = spec.max_tokens
        self.split = spec.long_documents == "split"
        chat = spec.chat
        self.fingerprint = _digest(
            b.fingerprint, "chat", chat.layout, template, chat.loss_on, spec.max_tokens, spec.long_documents
        )
        self._table: ByteOffsets | None = None
        #: why offsets come from ``tokenizers`` (None: derived from the engine's ids, checked)
        self._offsets_refused: str | None = None
        self._chat_settled = False
        self._chat_lock = threading.Lock()
        #: conversations whose offsets came from ``tokenizers`` because their ids did not spell their bytes
        self.tokenizer_offsets = 0

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_chat_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._chat_lock = threading.Lock()

    @property
    def engine(self) -> str:
        return self.base.engine if self._offsets_refused is None else "tokenizers"

    @property
    def refused(self) -> dict[str, str]:
        refused = self.base.refused
        if self._offsets_refused is not None:
            refused[f"{self.base.engine} for chat"] = self._offsets_refused
        return refused

    @property
    def settled(self) -> bool:
        return self._chat_settled and self.base.settled

    @property
    def engine_note(self) -> str:
        return "; ".join(f"{name}: {reason}" for name, reason in self.refused.items())

    def encode_flat(self, chats: list[RenderedChat], order: np.ndarray | None = None, *, split: bool = True) -> Encoded:
        """Token ids of the conversations, ``LOSS`` set on tokens overlapping an assistant span: ids from the
        engine, offsets from the ids (``ByteOffsets``), once checked on the run's first conversations against
        the ``tokenizers`` path; else (or for a conversation whose ids do not spell its bytes) ``tokenizers``'
        own offsets."""
        if order is not None:
            chats = [chats[i] for i in order.tolist()]
        if not chats:
            return Encoded(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
        if not self._chat_settled:
            self._settle(chats)
        refused = self._offsets_refused is not None
        parts = self._with_tokenizers(chats) if refused else self._with_engine(chats, split)
        sizes = np.fromiter(map(len, parts), np.int64, len(parts))
        ids = np.concatenate(parts)
        if self.cap is None:
            return Encoded(ids, sizes)
        return reshape(ids, sizes, [], [], self.cap, self.split)

    def _settle(self, chats: list[RenderedChat]) -> None:
        """Check the derived offsets on the first conversations (once; other threads wait): ids and masks must
        equal the ``tokenizers`` path's, else that path is used for the run, with the reason."""
        with self._chat_lock:
            if self._chat_settled:
                return
            table = ByteOffsets.of(self.tokenizer)
            if isinstance(table, str):
                self._offsets_refused = f"character offsets cannot be derived from ids: {table}"
            else:
                self._table = table
                sample = chats[:CHAT_SAMPLE]
                try:
                    got = self._with_engine(sample, True)
                except Exception:  # a batch tokenizers refuses too (a lone surrogate): it raises as there,
                    return  # and the check runs on the next batch
                want = self._with_tokenizers(sample)
                for i, (g, w) in enumerate(zip(got, want, strict=True)):
                    if not np.array_equal(g, w):
                        self._offsets_refused = (
                            f"ids or loss mask differ from tokenizers' offsets on conversation {i} of the first batch"
                        )
                        break
            self._chat_settled = True

    def _with_engine(self, chats: list[RenderedChat], split: bool) -> list[np.ndarray]:
        """Each conversation's masked ids: the engine's ids, offsets derived from them."""
        assert self._table is not None
        texts = [c.text for c in chats]
        got = self.base.ids(texts, split=split)
        parts = [ids.astype(np.int64) for ids in got.split()]
        offsets = self._table.char_offsets(texts, got.ids, got.sizes)
        redo = [i for i, (chat, o) in enumerate(zip(chats, offsets, strict=True)) if o is None and chat.spans]
        for chat, ids, o in zip(chats, parts, offsets, strict=True):
            if o is not None and chat.spans and len(ids):
                _mask(ids, o, chat.spans)
        if redo:  # the ids do not spell these texts byte for byte (a normalizer changed them): tokenizers
            self.tokenizer_offsets += len(redo)
            for i, ids in zip(redo, self._with_tokenizers([chats[i] for i in redo]), strict=True):
                parts[i] = ids
        return parts

    def _with_tokenizers(self, chats: list[RenderedChat]) -> list[np.ndarray]:
        """Each conversation's masked ids, ids and offsets from ``tokenizers`` (a Python step per conversation:
        chat data is small next to pretraining text)."""
        encodings = self.tokenizer.encode_batch([c.text for c in chats], add_special_tokens=False)
        parts = []
        for chat, enc in zip(chats, encodings, strict=True):
            ids = np.asarray(enc.ids, dtype=np.int64)
            if chat.spans and len(ids):
                _mask(ids, np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2), chat.spans)
            parts.append(ids)
        return parts

    def encode(self, chats: list[RenderedChat]) -> list[np.ndarray]:
        return self.encode_flat(chats).split()


class WithOperators:
    """An encoder behind user operators: the reader hands it records run through ``operators`` and then the
    inner encoder's own conversion (its text field, or the chat template); everything else is the inner
    encoder's. Its fingerprint covers the operators'."""

    def __init__(self, inner: Encoder | TextEncoder | ChatEncoder, operators: tuple[Operator, ...]) -> None:
        self.inner = inner
        self.operators = operators
        final = inner.final if isinstance(inner, ChatEncoder) else TextField(inner.spec.field)
        self.converter = RecordConverter(columns=None, required=(), final=final, operators=operators)
        self.flags = carries_flags(inner)
        self.fingerprint = _digest(inner.fingerprint, "operators", [op.fingerprint for op in operators])

    def __getattr__(self, name: str) -> Any:  # spec, pad_id, eos_id, prefix, tokenizer, engine, encode_flat, ...
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


AnyEncoder = Encoder | TextEncoder | ChatEncoder | WithOperators


def make_encoder(spec: TokenizeSpec, operators: tuple[Operator, ...] = (), *, threads: int | None = None) -> AnyEncoder:
    """The encoder ``spec`` asks for, behind ``operators`` when there are any: the seed ``Encoder`` for
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
    """Whether ``encoder``'s ids carry ``token_flags`` bits (the seed ``Encoder``'s never do)."""
    return bool(getattr(encoder, "flags", False))
