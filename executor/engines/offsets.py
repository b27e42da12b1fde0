"""Character offsets of token ids without ``tokenizers``: for byte-level tokenizers, from each id's bytes.

Chat data needs each token's character span in the rendered conversation (the loss mask covers the tokens
overlapping an assistant turn). ``tokenizers`` gives offsets, the fast engines give only ids. For a
byte-level tokenizer (a ``ByteLevel`` pre-tokenizer, every vocabulary token written in the GPT-2 byte
alphabet) every id stands for a fixed byte string, and a text's ids spell its UTF-8 bytes in order — so the
offsets follow from the ids alone:

1. ``ByteOffsets.of(tokenizer)``: the byte string of every id (vocabulary tokens decoded from the byte
   alphabet; added tokens are their content's UTF-8), or the reason it cannot be done (not byte-level, a
   prefix space added by the pre-tokenizer, a token outside the alphabet);
2. ``char_offsets(texts, ids)``: cumulative byte lengths of each text's ids are byte offsets into the text;
   where they do not spell the text's bytes exactly (a normalizer changed it), that text gets None and the
   caller asks ``tokenizers``; the ``trim_offsets`` of a ``ByteLevel``/``RobertaProcessing`` post-processor is
   applied as ``tokenizers`` applies it (leading/trailing spaces of the token moved out of its span); byte
   offsets become character offsets as ``tokenizers`` converts them: a start inside a multi-byte character
   is that character's start, an end inside one its end.

Invariant: for every text that is not None, the offsets equal ``Tokenizer.encode_batch(texts,
add_special_tokens=False)[i].offsets``. ``zephon.executor.encode.encoders.ChatEncoder`` checks this on the first
conversations of every run (ids and loss masks against the ``tokenizers`` path) and keeps ``tokenizers``,
with the reason, where it does not hold.

Example ("héllo", ids for "h", "é"'s first byte, "é"'s second byte + "llo"): byte offsets (0,1) (1,2) (2,6)
→ character offsets (0,1) (1,2) (1,5): a token that starts inside "é" starts where "é" starts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer


def _byte_alphabet() -> dict[str, int]:
    """The GPT-2 byte alphabet, character → byte: printable bytes stand for themselves, the others for
    ``chr(256 + k)`` in order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in keep}
    k = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + k)
            k += 1
    return {c: b for b, c in chars.items()}


def _byte_translation() -> dict[int, str]:
    """A ``str.translate`` table that writes a byte-level token as its bytes, one latin-1 character each: every
    alphabet character becomes its byte's character, every other character below 256 one that latin-1 cannot
    encode (U+FFFF), and characters above 255 stay as they are — so ``encode("latin-1")`` gives the bytes or
    fails on exactly the tokens with a character outside the alphabet."""
    table = {code: "\uffff" for code in range(256)}
    table.update({ord(c): chr(b) for c, b in _byte_alphabet().items()})
    return table


def _state(component: object) -> object:
    """A tokenizer component's tokenizer.json node (its own JSON state: not the whole file, a vocabulary of 128k
    tokens parsed in 0.3-0.6 s), None where there is none."""
    return None if component is None else json.loads(component.__getstate__())


def _components(node: object, kind: str) -> list[dict]:
    """Every component of type ``kind`` in a tokenizer.json node (``Sequence`` nodes looked into)."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == kind:
        return [node]
    inner = node.get("pretokenizers") or node.get("processors") or node.get("normalizers") or []
    return [c for n in inner for c in _components(n, kind)]


def _edge_spaces(token: str) -> tuple[int, int]:
    """Leading and trailing spaces of an added token's text as ``tokenizers``' offset trimming counts them
    (whitespace characters; a vocabulary token's are its space bytes, ``ByteOffsets.of``)."""
    lead = 0
    while lead < len(token) and token[lead].isspace():
        lead += 1
    trail = 0
    while trail < len(token) and token[len(token) - 1 - trail].isspace():
        trail += 1
    return lead, trail


@dataclass(frozen=True, slots=True)
class ByteOffsets:
    """The byte string of every id (``blob[start[i]:start[i] + length[i]]``), and the post-processor's offset
    trimming (``lead``/``trail``: spaces moved out of each id's span; ``prefix_space``: its add_prefix_space)."""

    blob: np.ndarray
    start: np.ndarray
    length: np.ndarray
    trim: bool
    lead: np.ndarray
    trail: np.ndarray
    prefix_space: bool

    @staticmethod
    def of(tokenizer: Tokenizer) -> ByteOffsets | str:
        """The table for ``tokenizer``, or why its offsets cannot be derived from ids."""
        config = {"pre_tokenizer": _state(tokenizer.pre_tokenizer), "post_processor": _state(tokenizer.post_processor)}
        levels = _components(config.get("pre_tokenizer"), "ByteLevel")
        if not levels:
            return "not a byte-level tokenizer (no ByteLevel pre-tokenizer)"
        if any(p.get("add_prefix_space") for p in levels):
            return "its ByteLevel pre-tokenizer adds a prefix space, which is in no text"
        to_bytes = _byte_translation()
        added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        size = max(vocab.values(), default=-1) + 1
        pieces: list[bytes] = [b""] * size
        lead, trail = [0] * size, [0] * size
        for token, i in vocab.items():  # ~1 µs a token (a vocabulary of 128k: 0.15 s; per character, 0.7 s)
            if i in added:
                pieces[i] = added[i].encode("utf-8")
                lead[i], trail[i] = _edge_spaces(added[i])
                continue
            try:
                piece = pieces[i] = token.translate(to_bytes).encode("latin-1")
            except UnicodeEncodeError:
                return f"token {i} ({token!r}) is not written in the byte-level alphabet"
            # Trimming counts "Ġ" and whitespace characters at a vocabulary token's edges; the only such character
            # in the byte alphabet is "Ġ", the space byte: a token's edge spaces are its bytes'.
            lead[i], trail[i] = len(piece) - len(piece.lstrip(b" ")), len(piece) - len(piece.rstrip(b" "))
        length = np.fromiter(map(len, pieces), np.int64, size)
        start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
        blob = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        trims = [
            p
            for kind in ("ByteLevel", "RobertaProcessing")
            for p in _components(config.get("post_processor"), kind)
            if p.get("trim_offsets", kind == "RobertaProcessing")
        ]
        prefix = any(p.get("add_prefix_space", p["type"] == "RobertaProcessing") for p in trims)
        lead_spaces, trail_spaces = np.array(lead, dtype=np.int64), np.array(trail, dtype=np.int64)
        return ByteOffsets(blob, start, length, bool(trims), lead_spaces, trail_spaces, prefix)

    def char_offsets(self, texts: Sequence[str], ids: np.ndarray, sizes: np.ndarray) -> list[np.ndarray | None]:
        """Each text's (n, 2) character offsets of its ids (``ids`` holds every text's ids, ``sizes`` how many
        each has), None for a text its ids do not spell byte for byte (or that is not valid UTF-8)."""
        out: list[np.ndarray | None] = []
        ends = np.cumsum(sizes)
        for text, a, b in zip(texts, (ends - sizes).tolist(), ends.tolist(), strict=True):
            out.append(self._one(text, ids[a:b]))
        return out

    def _one(self, text: str, ids: np.ndarray) -> np.ndarray | None:
        try:
            data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        except UnicodeEncodeError:
            return None
        ids = ids.astype(np.int64, copy=False)
        if len(ids) and (ids.min() < 0 or ids.max() >= len(self.length)):
            return None
        lengths = self.length[ids]
        byte_end = np.cumsum(lengths)
        total = int(byte_end[-1]) if len(ids) else 0
        if total != len(data):
            return None
        byte_start = byte_end - lengths
        gather = np.repeat(self.start[ids] - byte_start, lengths) + np.arange(total, dtype=np.int64)
        if not np.array_equal(self.blob[gather], data):
            return None
        s, e = byte_start, byte_end
        if self.trim:
            lead, trail = self.lead[ids].copy(), self.trail[ids]
            if self.prefix_space and len(ids):
                first = (np.arange(len(ids)) == 0) | (s == 0)
                lead[first & (lead == 1)] = 0
            s = np.where(lead > 0, np.minimum(s + lead, e), s)
            e = np.where((trail > 0) & (e >= trail), np.maximum(e - trail, s), e)
        starts = np.cumsum((data & 0xC0) != 0x80)  # characters begun up to and including each byte
        chars = np.concatenate([[0], starts])
        # start: the character holding byte s (floor); end: just past the character holding byte e - 1 (ceil)
        cs = np.where(s < total, chars[np.minimum(s + 1, total)] - 1, chars[total])
        ce = chars[e]
        return np.stack([cs, np.maximum(ce, cs)], axis=1)
