"""Shared-memory slots: how a DataLoader worker hands a microbatch's tensors to the loader's process.

Why: an item a ``torch`` DataLoader worker yields is pickled into a pipe and read back by the loader's
process. For a training dict of 8 × 2048 ids that is ~400 KB through the pipe, both ways, every microbatch:
0.5–0.8 ms of the loader's CPU and as much of the worker's (``benchmarks/bench_workers.py``), about what the
worker spends making the microbatch. Tensors cross no better (the DataLoader moves each through a
shared-memory file of its own, a descriptor on a socket and a mapping: ~1 ms a tensor).

Algorithm: each iteration of a worker allocates one *ring* of slots in one shared-memory tensor, made when its
first piece is ready, every slot that piece's bytes plus a quarter (later pieces of the same run differ only in
``cu_seqlens``). A worker sends ``g`` pieces per DataLoader item, the same ``g`` for all workers of a loader
(``group_size`` of a piece's bytes as the settings tell them: about ``GROUP_BYTES``, at most ``MAX_GROUP``; each
item costs the DataLoader 50-100 µs of each process's CPU). Piece ``k`` of the ring is
written into slot ``k mod R``, ``R = (prefetch_factor + 2) · g``; through the DataLoader's queue travels only a
``SlotPiece`` — the ring's id, ``k``, each tensor's dtype, shape and offset, the values that are not tensors —
and, with piece 0 only, the ring itself (one descriptor, once). The loader's process puts the pieces back in
order (``zephon.loader_pieces.in_order``), copies each out of its slot into tensors of its own (or straight into
the joined or page-locked tensors it hands out) and then writes ``k + 1`` into the ring's ``taken`` counter,
in the ring's first 64 bytes.

A worker's ``to_training`` writes a piece's fixed-size tensors (ids, labels, masks, positions) straight into the
slot that piece will take (``allocator``: views handed out one after another, new memory once the slot is full),
so ``put`` copies only the rest (``cu_seqlens``, an int32 view of the ids); a piece that must cross pickled after
all is copied out of its slot first (``owns``), since the next piece reuses it.

Invariant: a slot is written only when the loader has copied out the piece it held — piece ``k`` goes into
its slot only once ``taken ≥ k − R + 1``; a piece that finds its slot still held, that does not fit, or that
is not a dict of tensors crosses the pipe pickled, as before (``WorkerPiece``), and so does every piece of a
worker whose ring would take more than half of the free shared memory (``/dev/shm``: 64 MB in many containers,
and shared memory touched past it kills a process with SIGBUS). So the data never depends on the ring; the
ring only removes copies. It never waits: a worker has at most ``prefetch_factor`` items in flight (the
DataLoader asks for the next only after handing one out), the loader holds one more being read out, and one is
being written — ``R`` slots in all — and each ask is a system call, a full memory barrier between a piece's copy
and any reuse of its slot.

Worked example: ``prefetch_factor = 2``, pieces of 400 KB: slots of 500 KB, ``g = 5`` (2 MB ÷ 400 KB),
``R = 20`` (10 MB). Pieces 0-4 go into slots 0-4 as one item (piece 0 carries the ring), 5-9 into 5-9; the
loader copies piece 0 out and sets ``taken = 1``, …; piece 20 takes slot 0 once ``taken ≥ 1`` — long true by
then: the DataLoader asked for the item holding piece 20 only after handing out the one holding pieces 10-14.
"""

from __future__ import annotations

import itertools
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from zephon.executor.read.shared_groups import free_bytes
from zephon.tuple_pickling import tuple_pickled

#: Bytes before the first slot: the ``taken`` counter (int64) and padding to a cache line.
HEADER = 64
#: Every array in a slot starts on a multiple of this (a view of another dtype needs its alignment).
ALIGN = 64
#: A worker groups pieces into DataLoader items of about this many bytes (at most ``MAX_GROUP`` pieces): each
#: item costs the DataLoader some 50-100 µs of each process's CPU (its queues, threads and profiler spans). At
#: most 4 pieces an item, 2 workers' loader spent 1.35-1.47 CPU s on 4,159 microbatches of 8 × 2,049; at 10 (the
#: 2 MB bound on pieces of 196 KB), 0.81-1.08 s (``benchmarks/bench_workers.py``, docs/performance.md).
GROUP_BYTES = 2 << 20
MAX_GROUP = 16
_ring_ids = itertools.count()


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


#: One tensor of a piece in its slot: key, dtype, shape, byte offset in the ring and bytes (a plain tuple: it is
#: pickled with every piece).
Placed = tuple[str, torch.dtype, tuple[int, ...], int, int]


@tuple_pickled
@dataclass(frozen=True, kw_only=True, slots=True)
class SlotPiece:
    """What crosses the DataLoader's queue for a piece written into a ring (see the module docstring).

    Attributes:
        ring_id: the ring (unique per worker iteration: pid and a counter).
        seq: the piece's number ``k`` in its ring.
        placed: where each tensor of the piece lies (``Placed``).
        values: the piece's entries that are not tensors (``max_seqlen``, …).
        order: the dict's keys in order.
        ring: the ring's tensor, with piece 0 only (then the loader keeps it).
    """

    ring_id: str
    seq: int
    placed: tuple[Placed, ...]
    values: dict[str, Any]
    order: tuple[str, ...]
    ring: torch.Tensor | None = None


def _bytes(value: torch.Tensor) -> np.ndarray:
    """A tensor's bytes, in order, as a uint8 array (a view when it is contiguous)."""
    return value.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def _view(memory: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """``memory`` (bytes) as a tensor of ``dtype`` and ``shape``, sharing it: NumPy's view and reshape, then one
    tensor (~2 µs, against ~4 for torch's three steps); torch's own where NumPy has no such dtype (bfloat16)."""
    if dtype not in _NUMPY_DTYPES:
        try:
            _NUMPY_DTYPES[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
        except TypeError:
            _NUMPY_DTYPES[dtype] = None
    as_numpy = _NUMPY_DTYPES[dtype]
    if as_numpy is None:
        return torch.from_numpy(memory).view(dtype).view(shape)
    return torch.from_numpy(memory.view(as_numpy).reshape(shape))


_NUMPY_DTYPES: dict[torch.dtype, np.dtype | None] = {}


def group_size(piece_bytes: int) -> int:
    """Pieces a worker sends in one DataLoader item (``GROUP_BYTES`` of tensors, 1 to ``MAX_GROUP``)."""
    return max(1, min(MAX_GROUP, GROUP_BYTES // max(1, piece_bytes)))


def loader_pins(pin_memory: bool, pieces: int) -> bool:
    """Whether the loader itself makes page-locked tensors: joined pieces (``pieces`` > 1) and pieces read out of
    slots (the DataLoader's pinning thread pins the pickled whole pieces). Without an accelerator: no, with
    torch's warning (the DataLoader gave it already for whole pieces)."""
    if not pin_memory:
        return False
    if not torch.accelerator.is_available():
        if pieces > 1:
            warnings.warn(
                "'pin_memory' argument is set as true but no accelerator is found, then device pinned memory "
                "won't be used.",
                stacklevel=3,
            )
        return False
    return True


def shm_free() -> int | None:
    """Bytes free where shared memory lives (``/dev/shm``), None where that cannot be told."""
    return free_bytes("/dev/shm")


class SlotWriter:
    """A worker's ring for one iteration: ``put`` writes a piece's tensors into its next slot.

    ``in_flight``: the DataLoader items a worker may have in flight (its ``prefetch_factor``); ``group``: the
    pieces per item (the loader's choice, ``group_size``, the same for all its workers). The ring holds
    ``(in_flight + 2) · group`` slots — the items in flight, the one the loader is reading out and the one
    being written — each sized by the first piece (its bytes and a quarter). A ring that would take more than
    half of the free shared memory is not made (a container's ``/dev/shm`` is often 64 MB, and memory past it
    kills the process with SIGBUS when touched): every piece then crosses pickled."""

    def __init__(self, in_flight: int, *, group: int) -> None:
        self.in_flight = in_flight
        self.group = group
        self.depth = (in_flight + 2) * group
        self.ring: torch.Tensor | None = None
        self._bytes = np.empty(0, np.uint8)  # the ring's memory, as NumPy (slicing it costs ~0.2 µs, torch's ~3)
        self._taken = np.zeros(1, np.int64)
        self._base = 0  # the ring's address
        self.slot_bytes = 0
        self.seq = 0
        self.ring_id = f"{os.getpid()}-{next(_ring_ids)}"

    def put(self, tensors: Any) -> SlotPiece | None:
        """The piece as a ``SlotPiece`` once its tensors are in its slot; None when it must cross pickled
        (not a dict, a tensor that is not a plain CPU one, larger than a slot, or its slot still held)."""
        if not isinstance(tensors, dict):
            return None
        arrays = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        if not arrays or not all(v.is_cpu and v.layout is torch.strided for v in arrays.values()):
            return None
        sizes = {k: v.nbytes for k, v in arrays.items()}
        need = sum(_aligned(n) for n in sizes.values())
        if self.ring is None:
            if self.slot_bytes:
                return None  # no ring could be made: everything crosses pickled
            self.slot_bytes = _aligned(need + need // 4)
            size = HEADER + self.depth * self.slot_bytes
            free = shm_free()
            if free is not None and size > free // 2:
                return None
            try:
                self.ring = torch.empty(size, dtype=torch.uint8).share_memory_()
            except RuntimeError:  # torch could not allocate it (it checks with posix_fallocate): pickled, then
                return None
            self._bytes = self.ring.numpy()
            self._taken = self._bytes[:8].view(np.int64)
            self._taken[0] = 0
            self._base = self.ring.data_ptr()
        if need > self.slot_bytes or self.seq - int(self._taken[0]) >= self.depth:
            return None
        start = HEADER + (self.seq % self.depth) * self.slot_bytes
        end = start + self.slot_bytes
        inside = {}  # tensors to_training wrote into this slot already (``allocator``): where they lie
        for k, v in arrays.items():
            at = v.data_ptr() - self._base
            if start <= at < end and v.is_contiguous():
                inside[k] = at
        offset = max((at + _aligned(sizes[k]) for k, at in inside.items()), default=start)
        placed = []
        for key, value in arrays.items():
            size = sizes[key]
            if key in inside:
                placed.append((key, value.dtype, tuple(value.shape), inside[key], size))
                continue
            if offset + size > end:
                return None  # the slot's tail is taken by what was written into it: pickled (copied) instead
            self._bytes[offset : offset + size] = _bytes(value)
            placed.append((key, value.dtype, tuple(value.shape), offset, size))
            offset += _aligned(size)
        piece = SlotPiece(
            ring_id=self.ring_id,
            seq=self.seq,
            placed=tuple(placed),
            values={k: v for k, v in tensors.items() if k not in arrays},
            order=tuple(tensors),
            ring=self.ring if self.seq == 0 else None,
        )
        self.seq += 1
        return piece

    def allocator(self) -> Callable[[tuple[int, ...], np.dtype], np.ndarray] | None:
        """Where the next piece's ``to_training`` may write its arrays (``Batch.to_training(allocate=...)``): views
        into the slot ``put`` will give that piece, handed out one after another, or a new array once the slot is
        full — None before the ring exists or while that slot is still held. ``put`` then copies only what lies
        elsewhere. A piece that must cross pickled after all is copied out of the slot first (``owns``)."""
        if self.ring is None or self.seq - int(self._taken[0]) >= self.depth:
            return None
        start = HEADER + (self.seq % self.depth) * self.slot_bytes
        cursor, end, memory = [start], start + self.slot_bytes, self._bytes

        def allocate(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            size = math.prod(shape) * dtype.itemsize
            at = cursor[0]
            if at + size > end:
                return np.empty(shape, dtype=dtype)
            cursor[0] = at + _aligned(size)
            return memory[at : at + size].view(dtype).reshape(shape)

        return allocate

    def owns(self, value: object) -> bool:
        """``value`` is a tensor lying in this writer's ring."""
        if self.ring is None or not isinstance(value, torch.Tensor):
            return False
        return 0 <= value.data_ptr() - self.ring.data_ptr() < self.ring.numel()


class SlotReader:
    """The loader's side: the rings its workers sent, and the pieces read out of them."""

    def __init__(self) -> None:
        self.rings: dict[str, tuple[torch.Tensor, np.ndarray]] = {}

    def _ring(self, piece: SlotPiece) -> np.ndarray:
        if piece.ring is not None:  # kept: the tensor holds the shared memory, the array reads it
            self.rings[piece.ring_id] = (piece.ring, piece.ring.numpy())
        return self.rings[piece.ring_id][1]

    def views(self, piece: SlotPiece) -> dict[str, Any]:
        """The piece's dict, its tensors views into the slot (valid until ``release``)."""
        return _read(piece, self._ring(piece), 0)

    def release(self, piece: SlotPiece) -> None:
        """The piece is copied out: its slot may be written again."""
        self.rings[piece.ring_id][1][:8].view(np.int64)[0] = piece.seq + 1

    def take(self, piece: SlotPiece, *, pin_memory: bool = False) -> dict[str, Any]:
        """The piece's dict in tensors of its own (page-locked with ``pin_memory``); its slot released. The piece's
        tensors lie one after another in its slot: they are copied out together into one new buffer, and each
        tensor is a view of its part: one allocation and one copy a piece, as ``to_training`` makes ``input_ids``
        and ``labels`` one allocation in-process (one torch allocation, copy and two views a tensor cost the
        loader's process of one worker 0.85 against 0.72 CPU s over 3,804 pieces of three, docs/performance-log.md)."""
        ring = self._ring(piece)
        lo = min(offset for _, _, _, offset, _ in piece.placed)
        hi = max(offset + nbytes for _, _, _, offset, nbytes in piece.placed)
        pinned = torch.empty(hi - lo, dtype=torch.uint8, pin_memory=True) if pin_memory else None
        own = pinned.numpy() if pinned is not None else np.empty(hi - lo, dtype=np.uint8)
        own[:] = ring[lo:hi]
        self.release(piece)
        return _read(piece, own, lo, pinned)


def _read(piece: SlotPiece, memory: np.ndarray, start: int, pinned: torch.Tensor | None = None) -> dict[str, Any]:
    """The piece's dict, each tensor a view of its bytes in ``memory`` (its slot's bytes from ring offset ``start``
    on), the other entries its ``values``, in its order. With ``pinned`` (the tensor ``memory`` is, page-locked):
    torch's views of it, which share its storage, so each is ``is_pinned()``."""
    out: dict[str, Any] = {}
    for key, dtype, shape, offset, nbytes in piece.placed:
        at = offset - start
        if pinned is not None:
            out[key] = pinned[at : at + nbytes].view(dtype).view(shape)
        else:
            out[key] = _view(memory[at : at + nbytes], dtype, shape)
    return {k: out[k] if k in out else piece.values[k] for k in piece.order}
