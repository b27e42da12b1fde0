"""``to_training``'s ``position_ids`` and ``cu_seqlens``, computed over the whole microbatch at once, against the
definition written row by row: positions count from 0 and restart at every row, document and padding start."""

from __future__ import annotations

import numpy as np
import pytest

from zephon.executor.batch import Batch


def reference(batch: Batch, labels: bool) -> tuple[list[list[int]], list[int]]:
    """The definition, one token at a time: the position ids and cu_seqlens of the (B, L) inputs."""
    span = batch.tokens.shape[1] - (1 if labels else 0)
    positions, bounds = [], []
    for r in range(len(batch)):
        row, pos = [], 0
        for c in range(span):
            start = c == 0 or bool(batch.doc_start[r, c]) or c == int(batch.lengths[r])
            pos = 0 if start else pos + 1
            if start:
                bounds.append(r * span + c)
            row.append(pos)
        positions.append(row)
    return positions, [*bounds, len(batch) * span]


def random_batch(rng: np.random.Generator, rows: int, width: int) -> Batch:
    lengths = rng.choice([0, 1, width - 2, width - 1, width, *rng.integers(0, width + 1, 4)], size=rows)
    doc_start = rng.random((rows, width)) < rng.choice([0.0, 0.05, 0.3, 1.0])
    doc_start &= np.arange(width)[None, :] < lengths[:, None]  # documents start inside the real tokens only
    tokens = rng.integers(0, 50, (rows, width)).astype(np.int32)
    return Batch(tokens=tokens, doc_start=doc_start, lengths=lengths.astype(np.int64))


@pytest.mark.parametrize("labels", [True, False])
def test_position_ids_and_cu_seqlens_match_the_row_by_row_definition_on_random_batches(labels: bool) -> None:
    rng = np.random.default_rng(29)
    for _ in range(200):
        batch = random_batch(rng, int(rng.integers(1, 6)), int(rng.integers(2, 12)))
        out = batch.to_training(labels, return_position_ids=True, return_cu_seqlens=True)
        positions, bounds = reference(batch, labels)
        assert str(out["position_ids"].dtype) == "torch.int64"
        assert out["position_ids"].tolist() == positions
        assert out["cu_seqlens"].tolist() == bounds and str(out["cu_seqlens"].dtype) == "torch.int32"
        assert out["max_seqlen"] == max(np.diff(bounds))


def test_positions_of_the_documented_example_row() -> None:
    """The module docstring's row [a1 a2 E b1 E] (a2 = 2 tokens of a, E = EOS)."""
    batch = Batch(
        tokens=np.array([[11, 12, 2, 21, 2]], dtype=np.int32),
        doc_start=np.array([[True, False, False, True, False]]),
        lengths=np.array([5]),
    )
    out = batch.to_training(return_position_ids=True, return_cu_seqlens=True)
    assert out["position_ids"].tolist() == [[0, 1, 2, 0]]
    assert out["cu_seqlens"].tolist() == [0, 3, 4] and out["max_seqlen"] == 3
    padded = Batch(tokens=batch.tokens, doc_start=batch.doc_start, lengths=np.array([3]))
    assert padded.to_training(return_position_ids=True)["position_ids"].tolist() == [[0, 1, 2, 0]]
    assert padded.to_training(False, return_position_ids=True)["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
