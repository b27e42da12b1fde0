"""The order in which one dataset's documents are read in one epoch (pass), and across epochs.

Invariant: every epoch of a dataset is a permutation of all its (shard, row) pairs, derived only from
``(seed, dataset_index, epoch)`` through NumPy's version-stable SeedSequence and PCG64 raw bits; epochs
differ from each other and from other datasets' orders.

Algorithm (bounded memory, mostly sequential reads): shuffle the shard order, cut it into windows of
``window_shards`` consecutive shards, and shuffle the rows inside each window. The executor therefore needs
about one window of shards per dataset at a time, and reads each shard once per epoch.

Worked example: shards A (3 rows), B (2 rows), C (2 rows), window 2. The shard permutation might be C, A, B;
windows are [C, A] and [B]; the first window's 5 rows C0 C1 A0 A1 A2 might be shuffled into
A2 C0 A0 C1 A1, the second into B1 B0: the epoch reads A2 C0 A0 C1 A1 B1 B0.

Selections (``zephon.planner.selection.evaluate``): a dataset read through a selection orders only its selected rows.
Unordered, the rule above runs over the selected rows of each shard (a shard's "rows" are its selected rows,
mapped back to row numbers when read); ordered (``order_by``), the epoch reads the documents in key order,
cut into windows of ``window`` consecutive documents shuffled from the same ``(seed, dataset_index, epoch)``
stream. Example: selected order a1 b0 a2 b1, window 2, one epoch might read b0 a1 | a2 b1.

The planner never holds an epoch whole: ``Reader`` produces a dataset's documents a window at a time
(``epoch_windows`` draws the bits in the same order as ``epoch_order``), so memory stays at a few windows
per dataset however large the dataset is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from zephon.planner.selection.evaluate import SelectedRows


class Window(NamedTuple):
    """One shuffle window of an epoch: which shards it reads, and in what order it reads their rows."""

    #: The window's shard indexes (into the dataset's shards, not global ids), in window order.
    shards: np.ndarray
    #: Permutation of the window's rows (rows numbered shard after shard, in ``shards`` order); None without
    #: shuffling (rows are read in that order).
    perm: np.ndarray | None


class WindowRows(NamedTuple):
    """A window's documents in reading order, one entry per document."""

    #: The shard index (into the dataset's shards; int32) of each document.
    shard: np.ndarray
    #: Its row within that shard (int32).
    row: np.ndarray


class EpochOrder(NamedTuple):
    """One epoch of one dataset in reading order, one entry per document."""

    #: Global shard id (int32) of each document.
    shard_id: np.ndarray
    #: Its row within that shard (int32).
    row: np.ndarray


class Documents(NamedTuple):
    """A run of one dataset's documents in reading order, one array per column (``Reader.take``)."""

    #: Global shard id (int32) of each document.
    shard_id: np.ndarray
    #: Its row within that shard (int32).
    row: np.ndarray
    #: The epoch (pass, from 0) that reads it (int32).
    epoch: np.ndarray
    #: Its tokens (int64); None when the plan has no token counts.
    tokens: np.ndarray | None

    def slice(self, start: int, stop: int) -> Documents:
        """Documents ``[start, stop)`` of the run (views)."""
        return Documents._make(None if c is None else c[start:stop] for c in self)

    @staticmethod
    def concat(runs: Sequence[Documents]) -> Documents:
        """``runs`` one after another, copied (at least one run; all with tokens or all without)."""
        return Documents._make(None if c[0] is None else np.concatenate(c) for c in zip(*runs, strict=True))

    @staticmethod
    def empty(tokens: bool) -> Documents:
        """No documents; with an (empty) tokens column when ``tokens``."""
        return Documents(
            shard_id=np.empty(0, np.int32),
            row=np.empty(0, np.int32),
            epoch=np.empty(0, np.int32),
            tokens=np.empty(0, np.int64) if tokens else None,
        )


def permutation(bits: np.random.PCG64, n: int) -> np.ndarray:
    """A permutation of ``range(n)`` from the raw 64-bit stream (stable argsort of ``n`` draws).

    NumPy guarantees that SeedSequence and PCG64 raw streams never change across versions; the convenience
    methods of ``Generator`` (``permutation``, ``shuffle``) carry no such promise, so plans avoid them.
    """
    return stable_argsort(bits.random_raw(n))


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of uint64 ``keys``, about 1.6× faster.

    Each key's low ``b`` bits (``2^b ≥ n``) are replaced by its index and the packed values are sorted
    (a plain sort, not an argsort); the index comes back from the low bits. Packed order is (high bits,
    index), which is the stable order except among keys whose high bits tie — rare for random draws
    (about n²/2^(65-b)) — and those runs are re-sorted by their whole keys.
    """
    n = len(keys)
    if n < 2:
        return np.arange(n, dtype=np.intp)
    low = np.uint64((1 << (n - 1).bit_length()) - 1)
    packed = keys & ~low
    packed |= np.arange(n, dtype=np.uint64)
    packed.sort()
    order = (packed & low).astype(np.intp)
    packed &= ~low
    ties = np.flatnonzero(packed[1:] == packed[:-1])
    if len(ties):
        # Runs of equal high bits: [start, end] in sorted positions, already in index order.
        breaks = np.flatnonzero(np.diff(ties) > 1)
        starts = np.concatenate(([ties[0]], ties[breaks + 1]))
        ends = np.concatenate((ties[breaks], [ties[-1]])) + 2
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            run = order[s:e]
            order[s:e] = run[np.argsort(keys[run], kind="stable")]
    return order


def epoch_windows(
    shard_rows: np.ndarray,
    *,
    seed: int,
    dataset_index: int,
    epoch: int,
    shuffle: bool,
    window_shards: int,
) -> Iterator[Window]:
    """Yield each window of one epoch, in reading order (``shards`` index ``shard_rows``)."""
    bits = np.random.PCG64(np.random.SeedSequence([seed, dataset_index, epoch]))
    order = permutation(bits, len(shard_rows)) if shuffle else np.arange(len(shard_rows))
    for start in range(0, len(order), window_shards):
        window = order[start : start + window_shards]
        yield Window(window, permutation(bits, int(shard_rows[window].sum())) if shuffle else None)


def ordered_windows(
    documents: int, *, seed: int, dataset_index: int, epoch: int, shuffle: bool, window: int
) -> Iterator[Window]:
    """An ordered selection's epoch: runs of ``window`` consecutive positions in key order (``Window.shards``
    holds the positions), each shuffled from the ``(seed, dataset_index, epoch)`` stream when ``shuffle``."""
    bits = np.random.PCG64(np.random.SeedSequence([seed, dataset_index, epoch]))
    for start in range(0, documents, window):
        positions = np.arange(start, min(documents, start + window), dtype=np.int64)
        yield Window(positions, permutation(bits, len(positions)) if shuffle and window > 1 else None)


def window_rows(window: Window, shard_rows: np.ndarray) -> WindowRows:
    """The documents of ``window`` in reading order: its rows, shard after shard, taken in ``perm`` order."""
    shards, perm = window
    counts = shard_rows[shards]
    total = int(counts.sum())
    kind = np.int32 if total <= np.iinfo(np.int32).max else np.int64
    local = np.repeat(shards.astype(np.int32), counts)
    # Row index within its shard: position minus the start of that shard's run.
    rows = np.arange(total, dtype=kind) - np.repeat((np.cumsum(counts) - counts).astype(kind), counts)
    if perm is not None:
        local, rows = local[perm], rows[perm]
    return WindowRows(shard=local, row=rows.astype(np.int32, copy=False))


def epoch_order(
    shard_ids: np.ndarray,
    shard_rows: np.ndarray,
    *,
    seed: int,
    dataset_index: int,
    epoch: int,
    shuffle: bool,
    window_shards: int,
) -> EpochOrder:
    """One epoch of one dataset, in reading order."""
    ids = np.asarray(shard_ids, dtype=np.int32)
    shard_parts: list[np.ndarray] = []
    row_parts: list[np.ndarray] = []
    for window in epoch_windows(
        shard_rows, seed=seed, dataset_index=dataset_index, epoch=epoch, shuffle=shuffle, window_shards=window_shards
    ):
        rows = window_rows(window, shard_rows)
        shard_parts.append(ids[rows.shard])
        row_parts.append(rows.row)
    if not shard_parts:
        return EpochOrder(shard_id=np.empty(0, np.int32), row=np.empty(0, np.int32))
    return EpochOrder(shard_id=np.concatenate(shard_parts), row=np.concatenate(row_parts))


class Reader:
    """One dataset's documents in reading order, epoch after epoch, produced a window at a time.

    ``take(k)`` returns the next ``k`` documents as ``Documents`` (``tokens`` None when the plan has no token
    counts); with ``max_epochs`` set it returns fewer once those epochs are read.
    """

    def __init__(
        self,
        *,
        shard_ids: np.ndarray,
        shard_rows: np.ndarray,
        tokens: Sequence[np.ndarray] | None,
        seed: int,
        dataset_index: int,
        shuffle: bool,
        window_shards: int,
        max_epochs: int | None = None,
        selection: SelectedRows | None = None,
    ) -> None:
        self._ids = np.asarray(shard_ids, dtype=np.int32)
        self._rows = np.asarray(shard_rows, dtype=np.int64)
        self._selection = selection
        if selection is not None:  # each shard's "rows" are its selected rows
            self._rows = selection.per_shard(len(self._ids))
        self._tokens = tokens
        #: Every shard's token counts, kept once one window has read them all (``_window_tokens``).
        self._whole: list[np.ndarray] | None = None
        self._seed, self._index = seed, dataset_index
        self._shuffle, self._window = shuffle, window_shards
        self._max_epochs = max_epochs
        self.epoch = -1  # epoch of the window generated last
        self._windows: Iterator[Window] = iter(())
        self._parts: list[Documents] = []
        self._head = 0  # documents of _parts[0] already taken
        self.buffered = 0  # documents generated and not yet taken
        self.exhausted = False

    def _shard_tokens(self, j: int) -> np.ndarray:
        """Shard ``j``'s token counts, of its selected rows only when the dataset has a selection (unordered)."""
        assert self._tokens is not None
        counts = self._tokens[j]
        if self._selection is not None:
            counts = counts[self._selection.shard_rows(j)]
        return counts

    def _window_tokens(self, shards: list[int]) -> list[np.ndarray]:
        """The token counts of a window's shards. A window of every shard (a dataset of at most
        ``window_shards`` shards: each epoch is that one window) keeps its arrays, which its concatenation
        already matched in size: a small dataset read for many epochs (a token mixture reads 2^18 documents
        ahead, ``token_mix.FILL``: ~13,800 epochs of 19 documents) loads its shards once, not once an epoch."""
        if len(shards) != len(self._rows):
            return [self._shard_tokens(j) for j in shards]
        if self._whole is None:
            self._whole = [self._shard_tokens(j) for j in range(len(self._rows))]
        return [self._whole[j] for j in shards]

    def _window_documents(self, window: Window) -> tuple[WindowRows, np.ndarray | None]:
        """The documents of one window (rows mapped through an unordered selection) and their tokens."""
        if self._selection is not None and self._selection.ordered:
            return self._ordered_documents(window)
        rows = window_rows(window, self._rows)
        tokens = None
        if self._tokens is not None:
            flat = np.concatenate(self._window_tokens(window.shards.tolist()))
            flat = flat.astype(np.int64, copy=False)
            tokens = flat[window.perm] if window.perm is not None else flat
        if self._selection is not None:
            rows = WindowRows(rows.shard, self._selection.lookup(rows.shard, rows.row))
        return rows, tokens

    def _ordered_documents(self, window: Window) -> tuple[WindowRows, np.ndarray | None]:
        """An ordered selection's window: ``window.shards`` holds positions in key order (see ``_epoch``)."""
        assert self._selection is not None
        shard, row = self._selection.in_key_order(window.shards)
        tokens = None
        if self._tokens is not None:
            tokens = np.empty(len(row), np.int64)
            for j in np.unique(shard).tolist():
                at = np.flatnonzero(shard == j)
                tokens[at] = self._tokens[j][row[at]]
        if window.perm is not None:
            shard, row = shard[window.perm], row[window.perm]
            tokens = tokens[window.perm] if tokens is not None else None
        return WindowRows(shard, row), tokens

    def _epoch(self) -> Iterator[Window]:
        """The windows of epoch ``self.epoch``: shard windows, or for an ordered selection runs of positions in
        key order (``Window.shards`` then holds those positions)."""
        selection = self._selection
        if selection is None or not selection.ordered:
            return epoch_windows(
                self._rows,
                seed=self._seed,
                dataset_index=self._index,
                epoch=self.epoch,
                shuffle=self._shuffle,
                window_shards=self._window,
            )
        return ordered_windows(
            selection.selected, seed=self._seed, dataset_index=self._index, epoch=self.epoch,
            shuffle=self._shuffle, window=selection.window,
        )  # fmt: skip

    def _next_window(self) -> bool:
        """Generate the next non-empty window; False when ``max_epochs`` epochs are generated."""
        while True:
            for window in self._windows:
                if not len(window.shards) or (
                    (self._selection is None or not self._selection.ordered) and not self._rows[window.shards].any()
                ):
                    continue
                rows, tokens = self._window_documents(window)
                n = len(rows.row)
                self._parts.append(
                    Documents(
                        shard_id=self._ids[rows.shard],
                        row=rows.row,
                        epoch=np.full(n, self.epoch, np.int32),
                        tokens=tokens,
                    )
                )
                self.buffered += n
                return True
            if (self._max_epochs is not None and self.epoch + 1 >= self._max_epochs) or not self._rows.any():
                self.exhausted = True
                return False
            self.epoch += 1
            self._windows = self._epoch()

    def fill(self, k: int) -> int:
        """Generate windows until ``k`` documents are buffered (or the epochs run out); return the count."""
        while self.buffered < k and self._next_window():
            pass
        return self.buffered

    def grow(self) -> bool:
        """Generate one more window; False when none is left."""
        return self._next_window()

    def peek(self, column: Literal["shard_id", "row", "epoch", "tokens"]) -> np.ndarray:
        """One column of every buffered document, concatenated (the merge peeks at ``"tokens"``)."""
        self._consolidate()
        values = getattr(self._parts[0], column) if self._parts else None
        return values[self._head :] if values is not None else np.empty(0, np.int64)

    def _consolidate(self) -> None:
        if len(self._parts) > 1 or self._head:
            first = self._parts[0]
            self._parts = [Documents.concat([first.slice(self._head, len(first.row)), *self._parts[1:]])]
            self._head = 0

    def take(self, k: int) -> Documents:
        """The next ``k`` documents (fewer when the epochs run out)."""
        self.fill(k)
        k = min(k, self.buffered)
        out: list[Documents] = []
        need = k
        while need:
            part = self._parts[0]
            size = len(part.row)
            n = min(need, size - self._head)
            out.append(part.slice(self._head, self._head + n))
            self._head += n
            need -= n
            if self._head == size:
                self._parts.pop(0)
                self._head = 0
        self.buffered -= k
        if not out:
            return Documents.empty(self._tokens is not None)
        return out[0] if len(out) == 1 else Documents.concat(out)
