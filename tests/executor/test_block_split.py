"""``split_block``: a block of rows cut together, split into the microbatches that hand them out — each one's rows,
its pieces renumbered from its first row and its documents and tokens per dataset — against slicing and counting
each microbatch alone, on seeded random blocks (rows of no microbatch, microbatches of no rows, another worker's
microbatches in between)."""

from __future__ import annotations

import numpy as np
import pytest

from zephon.executor.block_split import split_block
from zephon.executor.pack.rows import PIECE_DTYPE, PackedRows
from zephon.executor.settings import RunStats


def random_block(rng: np.random.Generator, rows: int, width: int) -> PackedRows:
    records = []
    for row in range(rows):
        offset = 0
        while offset < width and rng.random() < 0.9:
            length = int(rng.integers(1, width - offset + 1))
            records.append((row, offset, int(rng.integers(0, 50)), int(rng.integers(0, 3)), length))
            offset += length
    return PackedRows(
        tokens=rng.integers(0, 1000, (rows, width)).astype(np.int32),
        doc_start=rng.random((rows, width)) < 0.1,
        lengths=rng.integers(0, width + 1, rows),
        pieces=np.array(records, dtype=PIECE_DTYPE),
    )


def alone(block: PackedRows, a: int, b: int, dataset: np.ndarray, names: list[str]) -> tuple:
    """One microbatch's rows ``[a, b)`` sliced and counted on its own (what ``split_block`` must equal)."""
    assert block.pieces is not None
    mine = block.pieces[(block.pieces["row"] >= a) & (block.pieces["row"] < b)].copy()
    mine["row"] -= a
    docs, toks = [0] * len(names), [0] * len(names)
    for piece in mine.tolist():
        d = int(dataset[piece[2]])
        docs[d] += piece[3] == 0
        toks[d] += piece[4]
    stats = RunStats()
    stats.handed_out(names, dataset[mine["position"]], mine)  # the per-batch count, array form
    assert [stats.documents.get(n, 0) for n in names] == docs and [stats.tokens.get(n, 0) for n in names] == toks
    return block.tokens[a:b].tolist(), block.doc_start[a:b].tolist(), block.lengths[a:b].tolist(), mine, docs, toks


@pytest.mark.parametrize("every", [False, True], ids=["some-another-workers", "every-microbatch-taken"])
@pytest.mark.parametrize("seed", range(12))
def test_split_block_equals_each_microbatch_sliced_and_counted_alone(seed: int, every: bool) -> None:
    rng = np.random.default_rng(seed)
    names = ["a", "b", "c"]
    dataset = rng.integers(0, len(names), 50).astype(np.int16)
    rows = int(rng.integers(1, 40))
    block = random_block(rng, rows, 16)
    cuts = sorted({0, rows, *rng.integers(0, rows + 1, int(rng.integers(0, 8))).tolist()})
    spans: list = []
    for a, b in zip(cuts, [*cuts[1:], cuts[-1]], strict=True):  # the last: a microbatch of no rows
        mine = every or rng.random() >= 0.3  # every: no gather (each piece handed out in order); else some None
        spans.append(((0, b - a), (a, b)) if mine else None)  # None: another worker's
    before = block.pieces.copy()
    got = split_block(block, spans, lambda positions: dataset[positions], len(names))
    assert np.array_equal(block.pieces, before)  # the block's own pieces untouched
    assert len(got) == len(spans)
    for span, item in zip(spans, got, strict=True):
        if span is None:
            assert item is None
            continue
        packed, (docs, toks) = item
        tokens, starts, lengths, pieces, want_docs, want_toks = alone(block, *span[1], dataset, names)
        assert packed.tokens.tolist() == tokens and packed.doc_start.tolist() == starts
        assert packed.lengths.tolist() == lengths
        assert packed.pieces.tolist() == pieces.tolist() and packed.pieces.dtype == PIECE_DTYPE
        assert (docs, toks) == (want_docs, want_toks)
        stats = RunStats()
        stats.handed_out(names, (docs, toks), packed.pieces)  # the pair form adds the same counts
        assert [stats.tokens.get(n, 0) for n in names] == want_toks


def test_a_block_no_microbatch_takes_gives_nothing() -> None:
    block = random_block(np.random.default_rng(0), 4, 8)
    assert split_block(block, [None, None], lambda p: np.zeros(len(p), dtype=np.int16), 1) == [None, None]
