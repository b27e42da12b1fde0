"""What the encoders beyond the plain one share (``zephon.executor.encode.encoders``): ``reshape`` (a document's body
cut or split and re-wrapped with special tokens), the fingerprint digest, ``OnBaseEncoder`` (what a wrapping encoder
takes from its seed ``Encoder``), and the record conversion the shard reader runs (``TextField``,
``RecordConverter``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from zephon.executor.encode.chat_render import BadRecord
from zephon.executor.encode.flags import FLAGGED, ID, SEGMENT
from zephon.executor.encode.text import Encoded, Encoder
from zephon.executor.engines.spot_check import SpotCheck
from zephon.executor.operators import Operator, OperatorChain, Where


def _spread(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Indices ``starts[i] + j`` for ``j < sizes[i]``, concatenated over ``i``."""
    return np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()), dtype=np.int64)


def reshape(
    ids: np.ndarray, sizes: np.ndarray, prefix: list[int], suffix: list[int], cap: int | None, split: bool
) -> Encoded:
    """Documents' bodies (``ids``, ``sizes``) cut to ``cap`` tokens or split into pieces of ``cap`` (``split``),
    each piece wrapped in ``prefix`` and ``suffix``; pieces after a document's first carry ``SEGMENT``. The ids
    come out ``FLAGGED`` when they came in so (chat) or pieces may carry ``SEGMENT``, else plain int32."""
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
    flagged = ids.dtype == FLAGGED or (cap is not None and split)
    out = np.zeros(int(out_len.sum()), dtype=FLAGGED) if flagged else np.empty(int(out_len.sum()), dtype=ID)
    body = out["id"] if flagged and ids.dtype != FLAGGED else out  # plain ids into the records' id field
    body[_spread(out_starts + p, length)] = ids[_spread(src, length)]
    plain_ids = out["id"] if flagged else out
    for k, token in enumerate(prefix):
        plain_ids[out_starts + k] = token
    for k, token in enumerate(suffix):
        plain_ids[out_starts + p + length + k] = token
    if flagged:
        later = out_starts[(index > 0) & (out_len > 0)]
        out["flags"][later] |= SEGMENT
    cut = np.maximum(sizes - cap, 0) if cap is not None and not split else None  # truncated: tokens cut
    return Encoded(
        out,
        np.bincount(owner, weights=out_len, minlength=docs).astype(np.int64),
        cut if cut is not None and cut.any() else None,
    )


def text_bodies(encoded: Encoded, head: int, tail: int) -> tuple[np.ndarray, np.ndarray]:
    """Each document less its first ``head`` and last ``tail`` tokens."""
    ends = np.cumsum(encoded.sizes)
    starts = ends - encoded.sizes
    keep = np.ones(len(encoded.ids), dtype=bool)
    for k in range(head):
        keep[starts + k] = False
    for k in range(1, tail + 1):
        keep[ends - k] = False
    return encoded.ids[keep], encoded.sizes - head - tail


def settings_digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


class OnBaseEncoder:
    """What a wrapping encoder takes from its seed ``Encoder`` (``base``): threads, the engine, lengths."""

    base: Encoder

    def close(self) -> None:
        """Stop the plain encoder's thread pool (the end of a run)."""
        self.base.close()

    @property
    def spot_check(self) -> SpotCheck:
        """The plain encoder's spot check (what it compared so far)."""
        return self.base.spot_check

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


#: The settings the plain ``Encoder`` must not see (it would not know them).
PLAIN_SETTINGS: dict[str, Any] = {
    "special_tokens": None,
    "max_tokens": None,
    "long_documents": "truncate",
    "chat": None,
}


class TextField:
    """A record's text field (after user operators), or ``BadRecord``."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __call__(self, record: dict[str, Any]) -> str:
        value = record.get(self.field)
        if isinstance(value, str):
            return value
        if self.field not in record:
            raise BadRecord(
                "missing_field",
                f"field {self.field!r} must be in the record, got keys {sorted(record)} — fix the record",
            )
        reason = "null_text" if value is None else "not_text"
        raise BadRecord(reason, f"field {self.field!r} must be a string, got {type(value).__name__} — fix the record")


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
                documents.report(w.ref, w.row, exc.reason, f"{w}: {exc.expected}")  # it names its own fix
                out.append(None)
        return out
