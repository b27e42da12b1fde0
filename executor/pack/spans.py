"""Copying an exact plan's tokens as contiguous spans where they are contiguous, by index where they are not.

An exact run keeps its tokenized documents in one array laid out in plan order (``ExactSequences``' cache:
document ``i`` at ``base[i] .. base[i] + size[i]``, the documents sorted by plan position, end to end). Two
copies per microbatch move tokens: new documents merged into the cache, and the pieces of each row copied from
the cache into the row. Both can be written as gathers by index (``spread``: an int64 index per token, built
with ``np.repeat`` — ~20 ns a token in all), which any layout allows; in the steady case both are contiguous:

* merging: the kept documents are the cache's tail and the new ones all come after them → the new ids are
  appended after the tail, in the array's spare room (else the tail moves to a new array of twice the room:
  each id is copied O(1) times) (``merge_tail``);
* a wrap row: its pieces are consecutive documents of the cache, each from where the previous one ended → the
  row is one slice of the cache (``fill_rows``: one copy a row); full rows that follow each other in the cache
  too (one rank of dp 1 walking the stream) are one slice together (one copy for a whole chunk of rows).

Invariant: both give exactly the arrays the gathers give (tests/executor/test_exact_spans.py); the fast path is
taken only when its condition is checked, else the gather runs.

Example: cache of documents at positions [5, 6] (sizes 3, 2: base 0, 3) in an array of room 16, new documents
[7] (4 ids): kept [5, 6] are the tail, 7 comes after → cache [5, 6, 7], base [0, 3, 5], the 4 new ids written
at 5..8 of the same array. A wrap
row of width 4 made of pieces (doc 6, from 1, 1 id, at offset 0) and (doc 7, from 0, 3 ids, at 1): the sources
are 3 + 1 = 4 and 5 + 0 = 5, each its offset past 4 → the row is cache ids 4 .. 7, one slice.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fill_rows", "merge_tail", "spread"]


def spread(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Indices ``starts[i] + j`` for ``j < sizes[i]``, concatenated over ``i``."""
    total = int(sizes.sum())
    return np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(total, dtype=np.int64)


def merge_tail(
    keep: np.ndarray, base: np.ndarray, size: np.ndarray, tokens: np.ndarray, cached: np.ndarray, want: np.ndarray,
    new_ids: np.ndarray, new_sizes: np.ndarray,
) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
    """The merged cache — its array and the start of each kept then new document in it — when the kept documents
    (indices ``keep`` into the cache, sorted) are a run of the cache's documents and every new position
    (``want``, sorted) comes after them; else None (the caller gathers).

    The new ids are appended after the kept span in the array's spare room when it has enough (the kept
    documents stay where they are); else the kept span and the new ids are copied to the front of a new array
    with twice the room, so each id is copied O(1) times however long it stays cached."""
    if len(keep) and (
        int(keep[-1]) - int(keep[0]) + 1 != len(keep) or (len(want) and int(want[0]) <= int(cached[keep[-1]]))
    ):
        return None
    lo = hi = shift = 0
    if len(keep):
        lo, hi = int(base[keep[0]]), int(base[keep[-1]] + size[keep[-1]])
    need = len(new_ids)
    if hi + need > len(tokens):  # no room: the kept span to the front of a larger array
        grown = np.empty(max(2 * (hi - lo + need), 1 << 16), dtype=tokens.dtype)
        grown[: hi - lo] = tokens[lo:hi]
        tokens, shift, hi = grown, lo, hi - lo
    tokens[hi : hi + need] = new_ids
    new_starts = hi + np.cumsum(new_sizes) - new_sizes
    return tokens, np.concatenate([base[keep] - shift, new_starts])


def fill_rows(
    out: np.ndarray, source: np.ndarray, rows: np.ndarray, offsets: np.ndarray, src: np.ndarray, lengths: np.ndarray
) -> bool:
    """Copy each row's pieces (``rows`` nondecreasing, piece ``i`` = ``lengths[i]`` ids of ``source`` from
    ``src[i]`` into row ``rows[i]`` of ``out`` at ``offsets[i]``) as one slice a row when each row's pieces are
    contiguous in ``source`` and in the row; returns False (nothing copied) otherwise."""
    if not len(rows):
        return True
    delta = src - offsets
    same_row = rows[1:] == rows[:-1]
    if np.any(same_row & (offsets[1:] != offsets[:-1] + lengths[:-1])):  # a gap in a row (padding): not one span
        return False
    first = np.flatnonzero(np.r_[True, ~same_row])
    owner = np.repeat(first, np.diff(np.r_[first, len(rows)]))
    if not np.array_equal(delta, delta[owner]):
        return False
    ends = np.r_[first[1:], len(rows)] - 1
    width = out.shape[1]
    row, delta = rows[first].astype(np.int64), delta[first].astype(np.int64)
    lo, hi = offsets[first].astype(np.int64), (offsets[ends] + lengths[ends]).astype(np.int64)
    # Runs of rows that continue each other in ``out`` (a row ends at its end, the next starts at 0) and in
    # ``source`` are one slice each: a chunk of consecutive full rows is one copy.
    joined = (row[1:] == row[:-1] + 1) & (hi[:-1] == width) & (lo[1:] == 0) & (delta[1:] == delta[:-1] + width)
    joined &= out.flags.c_contiguous  # rows one after another in memory (else one copy a row)
    run_first = np.flatnonzero(np.r_[True, ~joined])
    run_last = np.r_[run_first[1:], len(row)] - 1
    flat = out.reshape(-1) if out.flags.c_contiguous else out
    for r, a, start, r_end, stop in zip(
        row[run_first].tolist(), delta[run_first].tolist(), lo[run_first].tolist(), row[run_last].tolist(),
        hi[run_last].tolist(), strict=True,
    ):  # fmt: skip
        # one copy a run (a chunk's rows: one run when they follow each other, else one a row)
        if flat is out:
            out[r, start:stop] = source[a + start : a + stop]
        else:
            flat[r * width + start : r_end * width + stop] = source[a + start : a + (r_end - r) * width + stop]
    return True
