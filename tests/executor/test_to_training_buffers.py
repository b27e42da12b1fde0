"""``Batch.to_training``: per-document positions from one repeat over the flat batch equal the running-maximum
formula they replaced, and every call's tensors are new memory (a batch a trainer keeps is never overwritten)."""

from __future__ import annotations

import numpy as np
import torch

from zephon.executor.batch import IGNORE_INDEX, Batch


def _reference_positions(batch: Batch, labels: bool) -> np.ndarray:
    """The formula of commit f44571e: column minus the last segment start at or before it."""
    starts = batch.segment_starts()[:, :-1] if labels else batch.segment_starts()
    cols = np.arange(starts.shape[1])
    return cols[None, :] - np.maximum.accumulate(np.where(starts, cols[None, :], 0), axis=1)


def test_position_ids_match_the_running_maximum_formula_on_seeded_random_batches() -> None:
    rng = np.random.default_rng(29)
    for _ in range(40):
        rows, width = int(rng.integers(1, 6)), int(rng.integers(2, 40))
        doc_start = rng.random((rows, width)) < float(rng.choice([0.0, 0.05, 0.5, 1.0]))
        lengths = rng.integers(0, width + 1, size=rows)
        batch = Batch(
            tokens=rng.integers(0, 9, size=(rows, width)).astype(np.int32), doc_start=doc_start, lengths=lengths
        )
        for labels in (True, False):
            got = batch.to_training(return_labels=labels, return_position_ids=True, return_cu_seqlens=True)
            want = _reference_positions(batch, labels)
            assert got["position_ids"].dtype == torch.int64 and got["position_ids"].tolist() == want.tolist()
            starts = np.flatnonzero((want == 0).reshape(-1))
            assert got["cu_seqlens"].tolist() == [*starts.tolist(), want.size]


def test_each_call_returns_new_tensors_that_later_batches_never_overwrite() -> None:
    tokens = np.array([[1, 2, 3, 4], [5, 6, 7, 0]], dtype=np.int32)
    batch = Batch(tokens=tokens, doc_start=np.zeros((2, 4), dtype=bool), lengths=np.array([4, 3]))
    kept = [batch.to_training(return_labels=True) for _ in range(3)]
    other = Batch(tokens=tokens + 10, doc_start=np.zeros((2, 4), dtype=bool), lengths=np.array([4, 4]))
    for _ in range(3):
        other.to_training(return_labels=True)
    for t in kept:
        assert t["input_ids"].tolist() == [[1, 2, 3], [5, 6, 7]]
        assert t["labels"].tolist() == [[2, 3, 4], [6, 7, IGNORE_INDEX]]
        assert t["input_ids"].dtype == t["labels"].dtype == torch.int64
    pointers = {t[k].data_ptr() for t in kept for k in ("input_ids", "labels")}
    assert len(pointers) == 6  # no two tensors of the kept batches share memory
    t = batch.to_training(return_labels=True, ids_dtype=torch.int32)  # int32: input_ids a view of the batch
    assert t["input_ids"].data_ptr() == torch.from_numpy(tokens).data_ptr() and t["labels"].dtype == torch.int32


def test_padding_labels_are_ignored_from_each_short_rows_length_on_every_length_and_dtype() -> None:
    """Short rows are masked one slice a row (issue #29 hot path): labels from column ``length - 1`` on are
    ``IGNORE_INDEX`` — a row of length 0 or 1 entirely — the same as the (B, L) mask it replaced."""
    tokens = np.arange(1, 31, dtype=np.int32).reshape(6, 5)
    lengths = np.array([5, 0, 1, 2, 4, 5])
    batch = Batch(tokens=tokens, doc_start=np.zeros((6, 5), dtype=bool), lengths=lengths)
    i = IGNORE_INDEX
    want = [[2, 3, 4, 5], [i, i, i, i], [i, i, i, i], [17, i, i, i], [22, 23, 24, i], [27, 28, 29, 30]]
    for dtype in (torch.int64, torch.int32):
        for pin in (False, True) if torch.cuda.is_available() else (False,):
            t = batch.to_training(return_labels=True, ids_dtype=dtype, pin_memory=pin)
            assert t["labels"].tolist() == want and t["labels"].dtype == dtype
            assert t["input_ids"].tolist() == tokens[:, :-1].tolist()
    full = Batch(tokens=tokens, doc_start=np.zeros((6, 5), dtype=bool), lengths=np.full(6, 5))
    assert full.to_training(return_labels=True)["labels"].tolist() == tokens[:, 1:].tolist()


def test_an_ids_dtype_numpy_has_no_name_for_is_converted_from_the_int64_values() -> None:
    """``to_training`` writes ids with NumPy (int64 and int32, its own dtypes); any other torch dtype gets the
    int64 values converted by torch — labels' ``IGNORE_INDEX`` included."""
    tokens = np.arange(1, 11, dtype=np.int32).reshape(2, 5)
    batch = Batch(tokens=tokens, doc_start=np.zeros((2, 5), dtype=bool), lengths=np.array([5, 3]))
    wide = batch.to_training(return_labels=True)
    for dtype in (torch.int16, torch.float32, torch.bfloat16):
        t = batch.to_training(return_labels=True, ids_dtype=dtype)
        assert t["input_ids"].dtype == t["labels"].dtype == dtype
        assert t["labels"].tolist() == wide["labels"].to(dtype).tolist()
        assert t["input_ids"].tolist() == wide["input_ids"].to(dtype).tolist()
        assert batch.to_training(return_labels=False, ids_dtype=dtype)["input_ids"].tolist() == tokens.tolist()
