"""Frozen, slotted dataclasses that cross a DataLoader's queue pickle as the tuple of their values
(zephon.tuple_pickling): each comes back equal to itself, still frozen, and the state is that tuple."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from zephon.loader_pieces import PieceGroup, WorkerError, WorkerPiece
from zephon.loader_stats import StatsPiece
from zephon.tuple_pickling import tuple_pickled
from zephon.worker_slots import SlotPiece


def slot(seq: int) -> SlotPiece:
    placed = (("input_ids", torch.int64, (8, 2048), 64, 131072), ("labels", torch.int32, (8, 2048), 131136, 65536))
    return SlotPiece(ring_id="12-0", seq=seq, placed=placed, values={"max_seqlen": 7}, order=("input_ids", "labels"))


def test_the_loaders_items_come_back_equal_and_frozen() -> None:
    state = {"step": 3, "lane_cursors": {"0": [5, 2], "1": [9, 0]}}
    pieces = tuple(
        WorkerPiece(
            arrays=None, step=3, microbatch=k, state=state, slot=slot(k), worker=1, stats=StatsPiece((k,), (9,))
        )
        for k in range(3)
    )
    group = PieceGroup(worker=1, pieces=pieces, error=WorkerError("DatasetError", "shard x must decode — fix"))
    for item in (group, slot(4), StatsPiece((1, 2), (30, 40)), WorkerError("ConfigError", "no")):
        back = pickle.loads(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
        assert back == item and type(back) is type(item)
        with pytest.raises(dataclasses.FrozenInstanceError):
            back.__setattr__(dataclasses.fields(back)[0].name, None)
    assert StatsPiece((3,), (120,)).__getstate__() == ((3,), (120,), None)  # type: ignore[attr-defined]


def test_one_field_and_no_field() -> None:
    @tuple_pickled
    @dataclasses.dataclass(frozen=True, slots=True)
    class One:
        value: int

    globals()["One"] = One  # pickle finds a class by its module's name
    One.__qualname__ = "One"
    assert pickle.loads(pickle.dumps(One(5))) == One(5) and One(5).__getstate__() == (5,)  # type: ignore[attr-defined]

    @dataclasses.dataclass(frozen=True, slots=True)
    class Empty:
        pass

    with pytest.raises(TypeError, match="must decorate a dataclass with fields"):
        tuple_pickled(Empty)
