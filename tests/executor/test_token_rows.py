"""TokenRows: records' token lists as padded or packed rows with shifted labels, masks and packing boundaries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zephon.errors import ConfigError, DatasetError
from zephon.records import TokenRows

P = 0  # padding
IMG = 9


def as_lists(out: dict) -> dict:
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def test_packed_records_share_a_row_and_never_predict_placeholders_or_the_next_record():
    out = TokenRows(max_length=6, ignore_ids=(IMG,), pack=True)([{"input_ids": [9, 9, 5, 6]}, {"input_ids": [9, 7]}])
    assert as_lists(out) == {
        "input_ids": [[9, 9, 5, 6, 9]],
        "labels": [[-100, 5, 6, -100, 7]],
        "attention_mask": [[1, 1, 1, 1, 1]],
        "position_ids": [[0, 1, 2, 3, 0]],
        "cu_seqlens": [0, 4, 5],
        "max_seqlen": 4,
        "num_valid_tokens": 3,
    }
    assert out["cu_seqlens"].dtype == torch.int32 and out["input_ids"].dtype == torch.int64


def test_one_record_per_row_pads_and_masks_the_padding():
    out = TokenRows(max_length=6, ignore_ids=(IMG,), pad_token_id=P)(
        [{"input_ids": [9, 9, 5, 6]}, {"input_ids": [9, 7]}]
    )
    assert as_lists(out) == {
        "input_ids": [[9, 9, 5, 6, P], [9, 7, P, P, P]],
        "labels": [[-100, 5, 6, -100, -100], [7, -100, -100, -100, -100]],
        "attention_mask": [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]],
        "position_ids": [[0, 1, 2, 3, 0], [0, 1, 0, 1, 2]],
        "cu_seqlens": [0, 4, 5, 7, 10],
        "max_seqlen": 4,
        "num_valid_tokens": 3,
    }


def test_packing_opens_a_new_row_when_the_next_record_does_not_fit_and_keeps_the_order():
    records = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5, 6, 7]}, {"input_ids": [8]}, {"input_ids": [3, 3]}]
    out = TokenRows(max_length=5, pack=True)(records)
    assert out["input_ids"].tolist() == [[1, 2, 3, 0], [4, 5, 6, 7], [3, 3, 0, 0]]
    assert out["labels"].tolist() == [[2, 3, -100, -100], [5, 6, 7, -100], [3, -100, -100, -100]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0], [0, 1, 2, 3], [0, 1, 0, 1]]
    # record 8 sits after 7 in row 1: 7 does not predict it, and it is the row's last token (a label only)
    assert out["cu_seqlens"].tolist() == [0, 3, 4, 8, 10, 12]
    full = TokenRows(max_length=3, pack=True)([{"input_ids": [1, 2, 3]}, {"input_ids": []}, {"input_ids": [4]}])
    assert full["input_ids"].tolist() == [[1, 2], [4, 0]]  # an empty record takes no room, in the next row


def test_a_loss_mask_and_other_keys_collate_beside_the_rows():
    records = [
        {"__key__": "a", "input_ids": np.array([1, 2, 3]), "mask": [0, 1, 1], "pixels": np.ones((4, 2), np.float32)},
        {"__key__": "b", "input_ids": np.array([4, 5]), "mask": [0, 1], "pixels": np.zeros((4, 2), np.float32)},
    ]
    out = TokenRows(max_length=4, loss_mask="mask")(records)
    assert out["labels"].tolist() == [[2, 3, -100], [5, -100, -100]]
    assert out["__key__"] == ["a", "b"] and "mask" not in out
    assert out["pixels"].shape == (2, 4, 2) and out["pixels"][0].sum().item() == 8.0


def test_bad_records_are_one_line_naming_the_key():
    with pytest.raises(
        DatasetError, match=r"record 'k7' must have at most max_length=4 tokens in 'input_ids', got 5 — cut"
    ):
        TokenRows(max_length=4)([{"__key__": "k7", "input_ids": [1, 2, 3, 4, 5]}])
    with pytest.raises(
        DatasetError, match=r"record 1 of the microbatch must have 'input_ids' as a list of token ids, got str"
    ) as caught:
        TokenRows(max_length=4)([{"input_ids": [1]}, {"input_ids": "12"}])
    assert caught.value.index == 1  # a run names the record's dataset, shard and row from it
    with pytest.raises(DatasetError, match=r"record 'x' must have 'm' with one 0/1 per token \(2\), got shape \(1,\)"):
        TokenRows(max_length=4, loss_mask="m")([{"__key__": "x", "input_ids": [1, 2], "m": [1]}])
    with pytest.raises(DatasetError, match=r"must not have the keys it makes, got 'labels'"):
        TokenRows(max_length=4)([{"input_ids": [1], "labels": [1]}])
    with pytest.raises(ConfigError, match=r"max_length must be an integer ≥ 2, got 1"):
        TokenRows(max_length=1)
    with pytest.raises(ConfigError, match=r"ignore_ids must be a tuple of token ids, got \[9\]"):
        TokenRows(max_length=4, ignore_ids=[9])  # type: ignore[arg-type]
