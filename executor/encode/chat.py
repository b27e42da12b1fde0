"""``ChatEncoder``: rendered conversations to token ids with ``token_flags.LOSS`` on assistant tokens (the
algorithm is described in ``zephon.executor.encode.encoders``); ``load_chat_template`` reads a tokenizer's own
template."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import TokenizerError
from zephon.executor.encode.chat_render import BadRecord, ChatRenderer, RenderedChat, to_messages
from zephon.executor.encode.flags import FLAGGED, ID, tag
from zephon.executor.encode.parts import PLAIN_SETTINGS, OnBaseEncoder, RecordConverter, reshape, settings_digest
from zephon.executor.encode.surrogates import UnencodableText
from zephon.executor.encode.text import Encoded, Encoder
from zephon.executor.engines.offsets import ByteOffsets
from zephon.specs import TokenizeSpec


class ChatRecord:
    """A chat record to a ``RenderedChat`` (layout, checks, template), or ``BadRecord``."""

    def __init__(self, spec: TokenizeSpec, renderer: ChatRenderer) -> None:
        assert spec.chat is not None
        self.chat, self.field, self.renderer = spec.chat, spec.field, renderer

    def __call__(self, record: dict[str, Any]) -> RenderedChat:
        return self.renderer.render(to_messages(record, self.chat, self.field))


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


def _mask(ids: np.ndarray, offsets: np.ndarray, spans: tuple[tuple[int, int], ...]) -> np.ndarray:
    """``ids`` as ``FLAGGED`` records, ``LOSS`` set on those whose (start, end) character offsets overlap a span (an
    empty token: lies in it)."""
    if not spans or not len(ids):
        return tag(ids)
    s, e = offsets[:, :1], offsets[:, 1:]
    a = np.array([x for x, _ in spans])[None, :]
    b = np.array([y for _, y in spans])[None, :]
    inside = ((s < b) & (e > a)) | ((s == e) & (s >= a) & (s < b))
    return tag(ids, loss=inside.any(axis=1))


class ChatEncoder(OnBaseEncoder):
    """Rendered conversations to token ids with ``LOSS`` on the assistant tokens (see the module docstring)."""

    flags = True
    masks_loss = True  # LOSS on the tokens of the roles that train

    def __init__(self, spec: TokenizeSpec, *, threads: int | None = None) -> None:
        assert spec.chat is not None
        self.spec = spec
        self.base = Encoder(dataclasses.replace(spec, add_bos=False, **PLAIN_SETTINGS), threads=threads)
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
        self.fingerprint = settings_digest(
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
            return Encoded(np.empty(0, dtype=FLAGGED), np.empty(0, dtype=np.int64))
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
        plain = [ids.astype(ID) for ids in got.split()]
        offsets = self._table.char_offsets(texts, got.ids, got.sizes)
        redo = [i for i, (chat, o) in enumerate(zip(chats, offsets, strict=True)) if o is None and chat.spans]
        parts = [
            _mask(ids, o, chat.spans) if o is not None else tag(ids)
            for chat, ids, o in zip(chats, plain, offsets, strict=True)
        ]
        if redo:  # the ids do not spell these texts byte for byte (a normalizer changed them): tokenizers
            self.tokenizer_offsets += len(redo)
            for i, ids in zip(redo, self._with_tokenizers([chats[i] for i in redo]), strict=True):
                parts[i] = ids
        return parts

    def _with_tokenizers(self, chats: list[RenderedChat]) -> list[np.ndarray]:
        """Each conversation's masked ids, ids and offsets from ``tokenizers`` (a Python step per conversation:
        chat data is small next to pretraining text)."""
        texts = [c.text for c in chats]
        try:
            encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        except Exception:  # a lone surrogate is named, as on the engine's path (encode.surrogates)
            UnencodableText.raise_found(texts)
            raise
        parts = []
        for chat, enc in zip(chats, encodings, strict=True):
            ids = np.asarray(enc.ids, dtype=ID)
            parts.append(_mask(ids, np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2), chat.spans))
        return parts

    def encode(self, chats: list[RenderedChat]) -> list[np.ndarray]:
        return self.encode_flat(chats).split()
