"""Shared-memory slot rings (zephon.worker_slots): pieces written and read back exactly, and every case where a
piece must cross pickled instead is refused by the writer, never half-written."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import torch

from zephon import worker_slots
from zephon.worker_slots import GROUP_BYTES, HEADER, MAX_GROUP, SlotReader, SlotWriter, group_size


def piece(seed: int, rows: int = 4) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1 << 17, (rows, 33), generator=g)
    return {
        "input_ids": ids[:, :-1],  # a view, not contiguous: written out contiguous
        "labels": ids[:, 1:].clone(),
        "attention_mask": torch.rand((rows, 32), generator=g) > 0.2,
        "cu_seqlens": torch.arange(0, rows * 32 + 1, 16 + seed % 3, dtype=torch.int32),
        "max_seqlen": 17 + seed,
        "num_valid_tokens": torch.tensor(100 + seed),
    }


def equal(a: dict, b: dict) -> bool:
    if list(a) != list(b):
        return False
    for k, v in b.items():
        if isinstance(v, torch.Tensor):
            if not (isinstance(a[k], torch.Tensor) and a[k].dtype == v.dtype and a[k].shape == v.shape):
                return False
            if not torch.equal(a[k], v):
                return False
        elif a[k] != v:
            return False
    return True


def test_pieces_round_trip_and_the_ring_travels_with_the_first_only() -> None:
    writer, reader = SlotWriter(in_flight=1, group=1), SlotReader()
    for k in range(10):  # three times round the ring, each piece copied out before the next
        slot = writer.put(piece(k))
        assert slot is not None and slot.seq == k
        assert (slot.ring is not None) == (k == 0)
        got = reader.take(slot)
        assert equal(got, piece(k))
        assert all(
            v.untyped_storage().data_ptr() != writer.ring.untyped_storage().data_ptr()  # type: ignore[union-attr]
            for v in got.values()
            if isinstance(v, torch.Tensor)
        )  # its own memory, not the slot's


def test_a_piece_is_copied_out_once_into_one_buffer_pinned_or_not(monkeypatch) -> None:
    """``take`` copies a piece's tensors out of its slot together: one new buffer, each tensor a view of its part
    (every dtype, the bool mask and bfloat16 included) — page-locked with ``pin_memory``. Pinning needs an
    accelerator: here the one page-locked allocation is recorded and made as plain memory."""
    asked: list[tuple[int, bool]] = []
    empty = torch.empty

    def recording_empty(*size, pin_memory=False, **kw):  # type: ignore[no-untyped-def]
        asked.append((size[0], pin_memory))
        return empty(*size, **kw)

    writer, reader = SlotWriter(in_flight=1, group=1), SlotReader()
    for k in range(4):
        made = {**piece(k), "weights": torch.rand((4, 8)).to(torch.bfloat16)}
        slot = writer.put(made)
        assert slot is not None
        pin = k % 2 == 1
        monkeypatch.setattr(torch, "empty", recording_empty if pin else empty)
        got = reader.take(slot, pin_memory=pin)
        monkeypatch.setattr(torch, "empty", empty)
        assert equal(got, made)
        tensors = [v for v in got.values() if isinstance(v, torch.Tensor)]
        first, last = min(p[3] for p in slot.placed), max(p[3] + p[4] for p in slot.placed)
        if pin:  # one page-locked buffer, the slot's span, its views sharing its storage
            assert asked[-1:] == [(last - first, True)] and len(asked) == k // 2 + 1
            assert len({v.untyped_storage().data_ptr() for v in tensors}) == 1
        bases = sorted(v.data_ptr() for v in tensors)
        assert bases[-1] - bases[0] < last - first  # all inside one buffer of the span's size


def test_views_read_every_dtype_back_numpy_has_or_not() -> None:
    """The loader's views are NumPy views made tensors where NumPy has the dtype, torch's own where it has not
    (bfloat16): the same values, dtypes and shapes as ``take`` and as the piece written."""
    writer, reader = SlotWriter(in_flight=1, group=1), SlotReader()
    for k in range(3):
        made = {
            **piece(k),
            "weights": torch.rand((4, 8)).to(torch.bfloat16),
            "small": torch.arange(6).view(2, 3).short(),
        }
        slot = writer.put(made)
        assert slot is not None
        views = reader.views(slot)
        assert equal(views, made) and all(views[key].is_contiguous() for key in ("weights", "small", "labels"))
        assert equal(reader.take(slot), views)


def test_a_piece_whose_slot_is_still_held_is_refused_until_the_loader_releases_it() -> None:
    writer, reader = SlotWriter(in_flight=0, group=1), SlotReader()
    first, second = writer.put(piece(0)), writer.put(piece(1))
    assert first is not None and second is not None
    assert writer.put(piece(2)) is None  # slot 0 still holds piece 0: the caller pickles piece 2 instead
    views = reader.views(first)
    assert equal(views, piece(0))
    reader.release(first)
    third = writer.put(piece(2))  # slot 0 again
    assert third is not None and third.seq == 2
    assert equal(reader.take(second), piece(1)) and equal(reader.take(third), piece(2))


def test_what_does_not_fit_or_is_not_a_dict_of_cpu_tensors_is_refused() -> None:
    writer = SlotWriter(in_flight=2, group=1)
    assert writer.put([torch.zeros(3)]) is None  # a collate's list
    assert writer.put({"n": 3}) is None  # no tensor at all
    assert writer.put(piece(0, rows=4)) is not None  # sizes the slots: its bytes and a quarter more
    assert writer.put(piece(1, rows=5)) is not None  # a quarter more fits
    assert writer.put(piece(2, rows=8)) is None  # twice the first: crosses pickled
    assert writer.seq == 2  # nothing written for the refused pieces
    assert writer.ring is not None and writer.ring.numel() == HEADER + 4 * writer.slot_bytes


def _child(conn, depth: int, n: int) -> None:
    writer = SlotWriter(in_flight=depth - 2, group=1)
    for k in range(n):
        while (slot := writer.put(piece(k))) is None:  # the parent releases: then the slot is free
            time.sleep(0.001)
        conn.send(slot)
    conn.close()


@pytest.mark.parametrize("method", ["fork"])  # spawned DataLoader workers: test_workers.py
def test_a_ring_written_in_another_process_is_read_here(method: str) -> None:
    ctx = mp.get_context(method)
    import torch.multiprocessing  # noqa: F401  (registers the reductions that pass a shared tensor's memory)

    a, b = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(b, 2, 7))
    child.start()
    b.close()
    reader = SlotReader()
    for k in range(7):
        assert equal(reader.take(a.recv()), piece(k))
    child.join(30)
    assert child.exitcode == 0


def test_the_ring_is_deep_enough_for_the_groups_in_flight() -> None:
    writer = SlotWriter(in_flight=2, group=3)
    assert writer.put(piece(0)) is not None
    assert writer.depth == (2 + 2) * 3 and writer.ring is not None
    assert writer.ring.numel() == HEADER + writer.depth * writer.slot_bytes
    assert group_size(GROUP_BYTES // 2) == 2 and group_size(GROUP_BYTES * 3) == 1 and group_size(100) == MAX_GROUP


def test_no_ring_is_made_where_shared_memory_has_no_room_for_it(monkeypatch) -> None:
    monkeypatch.setattr(worker_slots, "shm_free", lambda: 2 * HEADER)  # a nearly full /dev/shm
    writer = SlotWriter(in_flight=2, group=1)
    assert writer.put(piece(0)) is None and writer.ring is None
    assert writer.put(piece(1)) is None and writer.ring is None  # not tried again: every piece crosses pickled


def test_no_ring_is_made_where_torch_cannot_allocate_shared_memory(monkeypatch) -> None:
    def refuse(self: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("unable to allocate shared memory(shm) for file </torch_1_2>: No space left on device")

    monkeypatch.setattr(torch.Tensor, "share_memory_", refuse)
    writer = SlotWriter(in_flight=2, group=1)
    assert writer.put(piece(0)) is None and writer.put(piece(1)) is None and writer.ring is None


def test_pieces_come_back_in_order_whatever_order_the_groups_come_in() -> None:
    from zephon.loader_pieces import PieceGroup, WorkerPiece, in_order

    def p(k: int) -> WorkerPiece:
        return WorkerPiece(arrays={"k": k}, step=k, microbatch=0, state={})

    # 3 workers; piece k is worker k mod 3's; 11 pieces: workers 0 and 1 have 4, worker 2 has 3.
    own = {w: [p(k) for k in range(w, 11, 3)] for w in range(3)}
    groups = [
        PieceGroup(worker=1, pieces=tuple(own[1][:3])),
        PieceGroup(worker=0, pieces=tuple(own[0][:2])),
        PieceGroup(worker=2, pieces=tuple(own[2])),
        PieceGroup(worker=0, pieces=tuple(own[0][2:])),
        PieceGroup(worker=1, pieces=tuple(own[1][3:])),
    ]
    assert [x.step for x in in_order(iter(groups), 3)] == list(range(11))


def batch(seed: int, rows: int = 4, width: int = 33):
    from zephon.executor.batch import Batch

    g = torch.Generator().manual_seed(seed)
    starts = torch.rand((rows, width), generator=g) > 0.9
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=g)
    return Batch(
        tokens=torch.randint(0, 1 << 17, (rows, width), generator=g).to(torch.int32).numpy(),
        doc_start=starts.numpy(),
        lengths=lengths.numpy(),
    )


ALL = {"return_position_ids": True, "return_cu_seqlens": True, "return_attention_mask": True,
       "return_loss_mask": True, "return_num_valid_tokens": True}  # fmt: skip


def test_to_training_writes_straight_into_the_next_slot_and_put_copies_only_the_rest() -> None:
    writer, reader = SlotWriter(in_flight=1, group=1), SlotReader()
    assert writer.allocator() is None  # no ring before the first piece
    reader.take(writer.put(batch(0).to_training(**ALL)))  # type: ignore[arg-type]
    for k in range(1, 8):  # round the ring twice
        allocate = writer.allocator()
        assert allocate is not None
        got = batch(k).to_training(**ALL, allocate=allocate)
        inside = {key for key, v in got.items() if isinstance(v, torch.Tensor) and writer.owns(v)}
        assert inside == {"input_ids", "labels", "attention_mask", "loss_mask", "position_ids"}
        slot = writer.put(got)
        assert slot is not None
        assert equal(reader.take(slot), batch(k).to_training(**ALL))  # the same values as new memory
    held = SlotWriter(in_flight=0, group=1)
    held.put(batch(0).to_training())
    held.put(batch(1).to_training())
    assert held.allocator() is None  # its slot still held: to_training makes new memory


def test_a_piece_written_into_its_slot_that_must_cross_pickled_is_copied_out_first() -> None:
    from zephon.loader_pieces import WorkerPiece

    writer = SlotWriter(in_flight=1, group=1)
    make = WorkerPiece.slotted(writer)
    make(batch(0).to_training(), step=0, microbatch=0, state={})  # slots of 1.25 × its ids and labels
    got = batch(1, rows=8).to_training(return_attention_mask=True, allocate=writer.allocator())  # twice the rows
    assert not writer.owns(got["input_ids"]) and writer.owns(got["attention_mask"])  # ids overflowed, mask fit
    piece = make(got, step=1, microbatch=0, state={})
    assert piece.slot is None  # pickled: its arrays hold copies, not the slot the next piece overwrites
    assert not any(writer.owns(torch.as_tensor(v)) for v in piece.arrays.values())
    assert equal(piece.tensors(), batch(1, rows=8).to_training(return_attention_mask=True))
