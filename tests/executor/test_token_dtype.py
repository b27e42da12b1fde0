"""Token ids travel as int32 from the encoder to the batch, flags beside them (``zephon.executor.encode.flags``);
``to_training`` widens them to int64 once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zephon import Pipeline
from zephon.errors import DatasetError
from zephon.executor.encode.flags import FLAGGED, ID, LOSS, SEGMENT, as_ids, filled, join, tag, untag
from zephon.executor.encode.text import Encoder
from zephon.executor.pack.lanes import Lane, pop_rows
from zephon.io import Dataset
from zephon.specs import TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def test_plain_text_travels_as_int32_and_to_training_gives_int64_of_the_same_ids(
    make_parquet, tmp_path, tokenizer_dir
) -> None:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", make_parquet("web", [9, 6]))], mixture=MixtureSpec({"web": 1.0}), seed=3
    )
    plan = source.plan(tmp_path / "plan")
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    got = encoder.encode_flat(["Hello world", "a"])
    assert got.ids.dtype == ID and got.ids.tolist()[-1] == encoder.eos_id
    pipeline = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir, field="text")
    batch = next(iter(pipeline.pack_flat(max_length=17).batch(microbatch_size=3)))
    assert batch.tokens.dtype == ID
    t = batch.to_training(return_labels=True)
    assert t["input_ids"].dtype == t["labels"].dtype == torch.int64
    assert t["input_ids"].is_contiguous() and t["labels"].is_contiguous()
    assert t["input_ids"].tolist() == batch.tokens[:, :-1].tolist()
    real = np.arange(1, 17)[None, :] < batch.lengths[:, None]
    assert t["labels"].tolist() == np.where(real, batch.tokens[:, 1:], -100).tolist()
    assert t["input_ids"].data_ptr() != torch.from_numpy(batch.tokens).data_ptr()  # a copy: the batch stays int32
    narrow = batch.to_training(return_labels=True, ids_dtype=torch.int32)
    assert narrow["input_ids"].dtype == narrow["labels"].dtype == torch.int32
    assert narrow["input_ids"].data_ptr() == torch.from_numpy(batch.tokens).data_ptr()  # a view: no copy
    assert narrow["input_ids"].tolist() == t["input_ids"].tolist() and narrow["labels"].tolist() == t["labels"].tolist()


def test_flagged_tokens_keep_their_flags_through_a_lane_and_untag_splits_them() -> None:
    """Lane of width 4, documents 3: ids [5 6 7] mask [0 1 1] and 9: ids [8 9] with a segment start at 9."""
    lane = Lane(4, -1, dtype=FLAGGED)
    first = tag(np.array([5, 6, 7]), loss=np.array([False, True, True]))
    second = tag(np.array([8, 9]), segment=np.array([False, True]))
    lane.push_many(np.array([3, 9]), join([first, second]), np.array([3, 2]))
    rows = pop_rows([lane, lane])
    assert rows.tokens.dtype == FLAGGED
    ids, starts, loss = untag(rows.tokens, rows.doc_start)
    assert ids.dtype == ID and ids.flags.c_contiguous
    assert ids.tolist() == [[5, 6, 7, 8], [9, -1, -1, -1]]
    assert loss.tolist() == [[False, True, True, False], [False, False, False, False]]
    assert starts.tolist() == [[True, False, False, True], [True, False, False, False]]  # 9 starts a segment
    assert rows.lengths.tolist() == [4, 1]


def test_ids_and_flags_helpers() -> None:
    assert filled(3, 7, FLAGGED).tolist() == [(7, 0)] * 3 and filled((1, 2), 7, ID).tolist() == [[7, 7]]
    both = join([np.array([1, 2], dtype=np.uint16), tag(np.array([3]), loss=np.array([True]))])
    assert both.dtype == FLAGGED and both.tolist() == [(1, 0), (2, 0), (3, int(LOSS))]
    assert join([np.array([1], dtype=np.int64), np.array([2], dtype=np.uint32)]).dtype == ID
    assert int(SEGMENT) != int(LOSS)


def test_ids_past_int32_are_refused_never_wrapped() -> None:
    assert as_ids(np.array([0, 2**31 - 1], dtype=np.int64)).tolist() == [0, 2**31 - 1]
    with pytest.raises(DatasetError, match=r"must be in \[0, 2147483647\] to travel as int32, got 2147483648"):
        as_ids(np.array([1, 2**31], dtype=np.uint32), "ids of store s.bin")
