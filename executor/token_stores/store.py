"""The one interface every token store reader gives: documents, their exact token counts, range reads.

A store is a sequence of *parts* (a Megatron prefix, a datatrove ``.ds`` file, a litData chunk, an MDS shard,
a Parquet file), each read natively from its own index. :class:`TokenStore` numbers the documents of all
parts in order and turns a document range into the parts' range reads.

Invariant: ``store.read(a, b)`` holds exactly the documents ``a .. b-1`` of the store, their lengths are
``store.token_counts()[a:b]``, and the counts come from the parts' indexes only — :meth:`TokenStore.token_counts`
never reads a token (where a format has no index, its reader says what it reads instead: docs/token-stores.md).

Worked example: a store of two parts holding 3 and 2 documents of 4, 3, 6 and 2, 5 tokens. ``token_counts()``
is ``[4, 3, 6, 2, 5]``; ``read(2, 4)`` asks part 0 for its documents ``2..2`` and part 1 for ``0..0`` and returns
``TokenDocuments(tokens=<8 ids>, offsets=[0, 6, 8])``; ``read(2, 4)[1]`` is the 2 ids of document 3.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from zephon.checks import is_int
from zephon.errors import DatasetError
from zephon.executor.token_stores.files import Blob

__all__ = ["CountedPart", "EndToEndPart", "StorePart", "TokenDocuments", "TokenStore"]

Holds = Literal["tokens", "text"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenDocuments:
    """Documents read from a store: their ids end to end and where each starts.

    ``tokens``: one flat array of the store's dtype (read-only; it may be a view of a memory map).
    ``offsets``: int64, one more than the documents; document ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``.
    ``loss_mask``: one bool per token where the store keeps one (datatrove ``.ds.loss``), else ``None``.
    """

    tokens: np.ndarray
    offsets: np.ndarray
    loss_mask: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(f"document {i} of {len(self)}")
        i %= len(self)
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        tokens, bounds = self.tokens, self.offsets.tolist()
        return (tokens[a:b] for a, b in itertools.pairwise(bounds))

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def to_lists(self) -> list[list[int]]:
        """Each document as a list of ints (for tests and small inspections)."""
        return [self[i].tolist() for i in range(len(self))]


class StorePart(Protocol):
    """One file (or file set) of a store, read natively. Document numbers are the part's own (from 0)."""

    name: str
    #: The ids' dtype as stored (``None`` for text parts).
    dtype: np.dtype | None

    @property
    def num_documents(self) -> int: ...

    def token_counts(self) -> np.ndarray:
        """int64 tokens per document, from the index (text parts raise: they hold no tokens)."""
        ...

    def read(self, start: int, stop: int) -> np.ndarray:
        """The tokens of documents ``start .. stop-1``, end to end."""
        ...

    def read_loss(self, start: int, stop: int) -> np.ndarray | None:
        """The loss mask of documents ``start .. stop-1`` (bool per token), or ``None``."""
        ...

    def read_texts(self, start: int, stop: int) -> list[str]:
        """The texts of documents ``start .. stop-1`` (text parts only)."""
        ...


class EndToEndPart:
    """A part whose documents lie end to end in one file of ids (a Megatron ``.bin``, a datatrove ``.ds``): document
    ``i`` is ids ``doc_starts[i] .. doc_starts[i + 1]`` of ``tokens_file``, so a range of documents is one range
    read. Subclasses set the four attributes from their index; ``read_loss`` is theirs to override."""

    name: str
    dtype: np.dtype
    #: Id offset of each document's first id in ``tokens_file``, and one past the last (int64).
    doc_starts: np.ndarray
    tokens_file: Blob

    @property
    def num_documents(self) -> int:
        return len(self.doc_starts) - 1

    def token_counts(self) -> np.ndarray:
        return np.diff(self.doc_starts)

    def read(self, start: int, stop: int) -> np.ndarray:
        size = self.dtype.itemsize
        lo, hi = int(self.doc_starts[start]), int(self.doc_starts[stop])
        return np.frombuffer(self.tokens_file.read(lo * size, hi * size), dtype=self.dtype)

    def read_loss(self, start: int, stop: int) -> np.ndarray | None:
        return None

    def read_texts(self, start: int, stop: int) -> list[str]:
        raise AssertionError(f"{self.name} holds token ids")  # pragma: no cover

    def local_ids(self) -> np.ndarray | None:
        """Every id of the part as one array over the file's memory map (local files only, else None): documents
        are sliced from it without a read call each (``TokenStore.gather``)."""
        if not getattr(self.tokens_file, "local", False):
            return None
        ids = getattr(self, "_local_ids", None)
        if ids is None:
            end = int(self.doc_starts[-1]) * self.dtype.itemsize
            ids = np.frombuffer(self.tokens_file.read(0, end), dtype=self.dtype)
            self._local_ids = ids
        return ids


class CountedPart:
    """A part that counted its documents' ids when opened (``counts``: Parquet/JSONL columns, MDS samples)."""

    counts: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.counts)

    def token_counts(self) -> np.ndarray:
        return self.counts


class TokenStore:
    """A token store opened by :func:`~zephon.executor.token_stores.open_token_store` (see the module)."""

    def __init__(
        self,
        *,
        format: str,
        path: str,
        holds: Holds,
        dtype: np.dtype | None,
        parts: Sequence[StorePart],
        tokenizer: str | None = None,
        vocab_size: int | None = None,
        eos_token_id: int | None = None,
        pins: dict[str, str] | None = None,
    ) -> None:
        if not parts:
            raise DatasetError(f"token store {path!r} must hold at least one {format} file, got none — fix the path")
        #: The format's name (``megatron``, ``olmo``, ``datatrove``, ``litdata``, ``mds``, ``parquet``, ``jsonl``).
        self.format = format
        self.path = path
        #: ``"tokens"`` (ids, counted from the index) or ``"text"`` (raw text items, tokenized downstream).
        self.holds: Holds = holds
        #: The ids' dtype as stored (``None`` for text).
        self.dtype = dtype
        #: The tokenizer the store says its ids were made with (datatrove's ``.ds.metadata``), else ``None``.
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        #: Each remote file's pin by its name (``StoreFiles.pins``): a remote part's fingerprint holds its file's.
        self.pins = dict(pins or {})
        self.parts: tuple[StorePart, ...] = tuple(parts)
        #: Whether any part keeps a loss mask (datatrove ``.ds.loss``): its tokens do not all train.
        self.has_loss = any(getattr(p, "has_loss", False) for p in self.parts)
        sizes = np.fromiter((p.num_documents for p in self.parts), dtype=np.int64, count=len(self.parts))
        #: The store's number of the first document of each part, and one past the last.
        self.part_starts = np.concatenate([[0], np.cumsum(sizes)])
        self._counts: np.ndarray | None = None

    def __repr__(self) -> str:
        return (
            f"TokenStore(format={self.format!r}, path={self.path!r}, holds={self.holds!r}, "
            f"documents={self.num_documents}, parts={len(self.parts)}, dtype={self.dtype})"
        )

    @property
    def num_documents(self) -> int:
        return int(self.part_starts[-1])

    def token_counts(self) -> np.ndarray:
        """int64 tokens of every document, from the indexes only (computed once)."""
        if self.holds != "tokens":
            raise DatasetError(
                f"token store {self.path!r} holds text, got a request for token counts — text is counted by "
                "tokenizing it (the count pass)"
            )
        if self._counts is None:
            counts = [np.asarray(p.token_counts(), dtype=np.int64) for p in self.parts]
            self._counts = np.concatenate(counts) if counts else np.zeros(0, np.int64)
            self._counts.setflags(write=False)
        return self._counts

    @property
    def num_tokens(self) -> int:
        return int(self.token_counts().sum())

    def _pieces(self, start: int, stop: int) -> list[tuple[StorePart, int, int]]:
        if not (is_int(start) and is_int(stop) and 0 <= start <= stop <= self.num_documents):
            raise DatasetError(
                f"document range of token store {self.path!r} must lie within 0..{self.num_documents}, got "
                f"{start!r}..{stop!r} — ask for documents the store holds"
            )
        first = int(np.searchsorted(self.part_starts, start, side="right")) - 1
        out = []
        i = max(first, 0)
        while i < len(self.parts) and self.part_starts[i] < stop:
            lo, hi = max(start, int(self.part_starts[i])), min(stop, int(self.part_starts[i + 1]))
            if hi > lo:
                base = int(self.part_starts[i])
                out.append((self.parts[i], lo - base, hi - base))
            i += 1
        return out

    def read(self, start: int, stop: int) -> TokenDocuments:
        """Documents ``start .. stop-1``: one range read per part they lie in (see the module)."""
        if self.holds != "tokens":
            raise DatasetError(
                f"token store {self.path!r} holds text, got a request for token ids — read it with read_texts"
            )
        pieces = self._pieces(start, stop)
        counts = self.token_counts()[start:stop]
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        arrays, masks = [], []
        at = start
        for part, lo, hi in pieces:
            tokens = part.read(lo, hi)
            want = int(offsets[at - start + hi - lo] - offsets[at - start])
            if len(tokens) != want:
                raise DatasetError(
                    f"{part.name} must hold {want} tokens in documents {lo}..{hi - 1} as its index says, got "
                    f"{len(tokens)} — the file is damaged; write the store again"
                )
            self._check_ids(part, tokens, offsets[at - start : at - start + hi - lo + 1] - offsets[at - start], lo)
            arrays.append(tokens)
            masks.append(part.read_loss(lo, hi))
            at += hi - lo
        if not arrays:
            flat = np.zeros(0, dtype=self.dtype)
        elif len(arrays) == 1:
            flat = arrays[0]
        else:
            flat = np.concatenate(arrays)
        loss = None
        if masks and any(m is not None for m in masks):  # a part without a mask: every token trains
            got = [m if m is not None else np.ones(len(a), dtype=bool) for m, a in zip(masks, arrays, strict=True)]
            loss = got[0] if len(got) == 1 else np.concatenate(got)
        return TokenDocuments(tokens=flat, offsets=offsets, loss_mask=loss)

    def gather(self, docs: np.ndarray) -> TokenDocuments:
        """Documents ``docs`` (store numbers in any order, repeats allowed) end to end in that order.

        Parts on local disk whose documents lie end to end (Megatron, datatrove) are sliced from their memory
        maps: one slice a document, all concatenated in one copy — the per-document work is a slice, as in a
        bare ``np.memmap`` copy (benchmarks/bench_token_stores.py). Other parts are read a run of consecutive
        documents at a time (one range read per run, ``read``), then put in order.
        Example: ``gather([4, 1, 2])`` of a local Megatron store → ids of 4, 1, 2; offsets ``[0, n4, n4+n1, ...]``.
        """
        if self.holds != "tokens":
            raise DatasetError(
                f"token store {self.path!r} holds text, got a request for token ids — read it with read_texts"
            )
        docs = np.asarray(docs, dtype=np.int64)
        if len(docs) and (docs.min() < 0 or docs.max() >= self.num_documents):
            bad = int(docs[(docs < 0) | (docs >= self.num_documents)][0])
            raise DatasetError(
                f"document of token store {self.path!r} must lie within 0..{self.num_documents - 1}, got {bad} — "
                "ask for documents the store holds"
            )
        counts = self.token_counts()[docs]
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        part_of = np.searchsorted(self.part_starts, docs, side="right") - 1
        views = [getattr(p, "local_ids", lambda: None)() for p in self.parts]
        used = np.unique(part_of).tolist()
        if all(views[j] is not None for j in used):
            for j in used:  # a file truncated on disk since it was mapped: refused, not a SIGBUS
                self.parts[j].tokens_file.check_size()  # type: ignore[attr-defined]
            within = docs - self.part_starts[part_of]
            # one slice per document: the bare copy's own loop (a vectorized gather by index costs more per id)
            bounds = [p.doc_starts for p in self.parts]  # type: ignore[attr-defined]
            pairs = zip(part_of.tolist(), within.tolist(), strict=True)
            slices = [views[j][bounds[j][d] : bounds[j][d + 1]] for j, d in pairs]  # type: ignore[index]
            tokens = np.concatenate(slices) if slices else np.zeros(0, dtype=self.dtype)
        else:
            tokens = self._gather_by_runs(docs)
        loss = self._gather_loss(docs, part_of, counts) if self.has_loss else None
        out = TokenDocuments(tokens=tokens, offsets=offsets, loss_mask=loss)
        self._check_gathered(out, docs, part_of)
        return out

    def _gather_loss(self, docs: np.ndarray, part_of: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The loss mask of ``gather(docs)`` (``part_of``: each document's part, ``counts``: its tokens, as ``gather``
        found them): one ``read_loss`` per run of consecutive documents of a part (a part without a mask: every
        token trains)."""
        breaks = np.flatnonzero((np.diff(docs) != 1) | (np.diff(part_of) != 0)) + 1
        masks = []
        for run in np.split(np.arange(len(docs)), breaks) if len(docs) else []:
            j, base = int(part_of[run[0]]), int(self.part_starts[part_of[run[0]]])
            lo, hi = int(docs[run[0]]) - base, int(docs[run[-1]]) + 1 - base
            got = self.parts[j].read_loss(lo, hi)
            masks.append(got if got is not None else np.ones(int(counts[run].sum()), dtype=bool))
        return np.concatenate(masks) if masks else np.zeros(0, dtype=bool)

    def _gather_by_runs(self, docs: np.ndarray) -> np.ndarray:
        """``gather``'s ids for parts read by range: one ``read`` per run of consecutive wanted documents."""
        wanted = np.unique(docs)
        breaks = np.flatnonzero(np.diff(wanted) != 1) + 1
        got: dict[int, np.ndarray] = {}
        for run in np.split(wanted, breaks) if len(wanted) else []:
            lo, hi = int(run[0]), int(run[-1]) + 1
            for i, ids in enumerate(self.read(lo, hi)):
                got[lo + i] = ids
        return np.concatenate([got[d] for d in docs.tolist()]) if len(docs) else np.zeros(0, dtype=self.dtype)

    def _check_gathered(self, out: TokenDocuments, docs: np.ndarray, part_of: np.ndarray) -> None:
        """``_check_ids`` for gathered documents: the first bad id named by its part's file and document."""
        if self.vocab_size is None or out.tokens.size == 0:
            return
        tokens = out.tokens
        if int(tokens.max()) < self.vocab_size and not (tokens.dtype.kind == "i" and int(tokens.min()) < 0):
            return
        i = int(np.searchsorted(out.offsets, int(np.argmax((tokens >= self.vocab_size) | (tokens < 0))), "right")) - 1
        j = int(part_of[i])
        part, base = self.parts[j], int(self.part_starts[j])
        self._check_ids(part, out[i], np.array([0, len(out[i])]), int(docs[i]) - base)

    def read_texts(self, start: int, stop: int) -> list[str]:
        """The texts of documents ``start .. stop-1`` (text stores)."""
        if self.holds != "text":
            raise DatasetError(
                f"token store {self.path!r} holds token ids, got a request for texts — read it with read"
            )
        out: list[str] = []
        for part, lo, hi in self._pieces(start, stop):
            out.extend(part.read_texts(lo, hi))
        return out

    def _check_ids(self, part: StorePart, tokens: np.ndarray, offsets: np.ndarray, first: int) -> None:
        """With ``vocab_size`` set, refuse ids the tokenizer cannot have made: ≥ ``vocab_size``, or negative (one
        pass over the ids read; without ``vocab_size`` reads are plain copies)."""
        if self.vocab_size is None or tokens.size == 0:
            return
        bad: np.ndarray | None = None
        if int(tokens.max()) >= self.vocab_size:
            bad = tokens >= self.vocab_size
            rule = f"< the tokenizer's vocabulary of {self.vocab_size}"
            fix = "the store was made with another tokenizer; pass the tokenizer (or vocab_size) it was made with"
        elif tokens.dtype.kind == "i" and int(tokens.min()) < 0:
            bad = tokens < 0
            rule, fix = "≥ 0", "the file is damaged or not token ids; write the store again"
        if bad is None:
            return
        at = int(np.argmax(bad))
        doc = first + int(np.searchsorted(offsets, at, side="right")) - 1
        raise DatasetError(
            f"token ids of {part.name} must be {rule}, got {int(tokens[at])} in document {doc} (token "
            f"{at - int(offsets[doc - first])}) — {fix}"
        )
