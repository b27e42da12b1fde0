"""Batches of packed rows and their conversion to training tensors.

``Batch.to_training(return_labels=True)`` shifts by one: ``input_ids = tokens[:, :-1]`` and
``labels = tokens[:, 1:]``, both (B, max_length − 1); labels of padding are ``-100`` (ignored by
``torch.nn.functional.cross_entropy``). Both are int64 tensors (what embeddings and ``cross_entropy`` take),
each written once from the batch's int32 ids — the only place ids are widened (``zephon.executor.encode.flags``);
with ``pin_memory`` straight into page-locked memory. They are the two halves of one new allocation per call
(never a buffer reused across batches, so a batch a trainer keeps is never overwritten). The label after a
document's EOS is the next document's first token, as in GPT-style pretraining; use ``position_ids`` or
``cu_seqlens`` to keep attention inside documents.

* ``position_ids`` (B, max_length − 1) restart at 0 at the start of every row, every document and the
  padding: each token's flat index minus its segment's first (one ``np.repeat`` over the segment starts).
* ``cu_seqlens`` (int32, 1-D) are the cumulative segment boundaries of the flattened batch (B·(max_length − 1)
  tokens) for varlen attention kernels, with ``max_seqlen`` the longest segment; segments are cut at the
  same places where position ids restart.

Example, one row [a1 a2 E b1 E] (max_length 5): input_ids [a1 a2 E b1], labels [a2 E b1 E],
position_ids [0 1 2 0], cu_seqlens [0 3 4], max_seqlen 3.

Loss masks (``tokenize_chat``, ``zephon.executor.encode.chat_render``): ``loss_mask`` (B, max_length) says which
tokens train.
Labels are then ``-100`` where the predicted token's mask is 0 *and* at every document or segment boundary (the
last token of a document never predicts the next document's first), so a batch packs many conversations
without one leaking into another's loss. ``ignore_document_boundaries`` asks for the boundary rule without a
mask (default: on exactly when the batch has a loss mask, so pretraining labels stay as they were).

Other outputs on request: ``loss_mask`` (aligned with ``labels`` when labels are returned: 1 where the label
counts; else with ``input_ids``), ``attention_mask`` (1 on real tokens, 0 on padding), ``num_valid_tokens``
(a 0-d int64 tensor: labels that count toward the loss — sum it across microbatches and ranks to normalize a
summed loss).

Example with a mask, one row [u1 u2 a1 a2 E | v1] (5 tokens of one conversation, mask [0 0 1 1 1], then v1
starting the next, mask 0): labels [-100 a1 a2 E -100], num_valid_tokens 3.

``join_training`` joins the ``to_training`` dicts of consecutive row ranges of a batch into the batch's own,
tensor for tensor (``Pipeline.dataloader``'s workers each build a range): row tensors are concatenated,
``num_valid_tokens`` summed, ``max_seqlen`` the largest, and each part's ``cu_seqlens`` shifted by the tokens
before it (a segment never crosses a row, so the boundaries of the whole are those of the parts, in order).
Example: rows [a1 a2 E b1 E] and [c1 c2 c3 c4 c5] as two parts: cu_seqlens [0 3 4] and [0 4] join to
[0 3 4 8].
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from zephon.checks import require_bool
from zephon.errors import ConfigError

IGNORE_INDEX = -100


def check_ids_dtype(dtype: object) -> None:
    """``to_training``'s ``ids_dtype`` must be a torch dtype (a string would reach torch as a device name)."""
    if not isinstance(dtype, torch.dtype):
        raise ConfigError(f"ids_dtype must be a torch dtype, got {dtype!r} — pass e.g. torch.int32 or torch.int64")


#: ``allocate(shape, dtype)``: a NumPy array of that shape and dtype to write an output into (``to_training``).
Allocate = Callable[[tuple[int, ...], np.dtype], np.ndarray]
#: The ids dtypes ``to_training`` writes with NumPy, and back (another dtype: written as int64, then converted).
_NUMPY = {torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32)}
#: The torch dtype of each array ``to_training`` writes (for page-locked memory, which torch allocates).
_TORCH = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.bool_): torch.bool}


@dataclass(frozen=True, kw_only=True, slots=True)
class Batch:
    """``tokens`` (B, max_length) int32 ids, ``doc_start`` (B, max_length) bool, ``lengths`` (B,) valid tokens.

    ``step`` and ``microbatch`` place the batch in training (global step, microbatch within the step on this
    rank); ``sequences`` are the global ids of its rows (see ``zephon.executor.geometry``); ``pieces`` say
    which tokens of which plan documents fill each row.
    """

    tokens: np.ndarray
    doc_start: np.ndarray
    lengths: np.ndarray
    step: int = 0
    microbatch: int = 0
    sequences: np.ndarray | None = None
    #: Provenance: the plan documents' token spans in each row (``zephon.executor.pack.rows.PIECE_DTYPE``).
    pieces: np.ndarray | None = None
    #: (B, max_length) bool: the tokens that count toward the loss (None: every real token; no chat data).
    loss_mask: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    def segment_starts(self) -> np.ndarray:
        """(B, L) bool: where a segment starts (row start, document start, first padding token)."""
        starts = self.doc_start.copy()
        starts[:, 0] = True
        cols = np.arange(self.tokens.shape[1])
        pad_begin = (cols[None, :] == self.lengths[:, None]) & (self.lengths[:, None] < self.tokens.shape[1])
        return starts | pad_begin

    def _segment_offsets(self, span: int) -> np.ndarray:
        """Where a segment starts in the first ``span`` columns, flattened (row-major, sorted): ``segment_starts``'
        true cells without building its (B, L) comparisons — the row starts, the document starts, and the one cell
        per row where its padding begins."""
        starts = self.doc_start[:, :span].copy()
        starts[:, 0] = True
        padded = np.flatnonzero(self.lengths < span)
        starts[padded, self.lengths[padded]] = True
        return np.flatnonzero(starts)

    def to_training(
        self,
        return_labels: bool = True,
        *,
        return_position_ids: bool = False,
        return_cu_seqlens: bool = False,
        return_loss_mask: bool = False,
        return_attention_mask: bool = False,
        return_num_valid_tokens: bool = False,
        ignore_document_boundaries: bool | None = None,
        pin_memory: bool = False,
        ids_dtype: torch.dtype = torch.int64,
        allocate: Allocate | None = None,
    ) -> dict[str, torch.Tensor | int]:
        """Torch tensors for a training step (see the module docstring). ``ids_dtype=torch.int32`` gives
        ``input_ids`` and ``labels`` as int32 (``input_ids`` then a view of the batch's ids: no copy).
        ``allocate(shape, dtype)``: where the fixed-size outputs are written instead of new memory (a DataLoader
        worker's shared-memory slot, ``zephon.worker_slots``; not with ``pin_memory``) — the same values."""
        if ids_dtype not in _NUMPY:
            check_ids_dtype(ids_dtype)
        check_switches(locals())  # a quoted "false" is true to Python: refused, not taken as True
        new = _Outputs(allocate if not pin_memory else None, pin_memory)
        width = self.tokens.shape[1]
        span = width - 1 if return_labels else width
        rows = len(self.lengths)
        out: dict[str, torch.Tensor | int] = {}
        boundaries = self.loss_mask is not None if ignore_document_boundaries is None else ignore_document_boundaries
        # The documented API's path (no mask, no boundary rule, no mask outputs) stays exactly as cheap as it was.
        masked = self.loss_mask is not None or boundaries or return_loss_mask or return_num_valid_tokens
        counts = None
        if masked:
            counts = np.arange(width)[None, :] < self.lengths[:, None]  # real tokens (not padding)
            if self.loss_mask is not None:
                counts &= self.loss_mask  # tokens that train
            if return_labels:
                counts = counts[:, 1:] & ~self.segment_starts()[:, 1:] if boundaries else counts[:, 1:]
        wide = _NUMPY.get(ids_dtype, np.dtype(np.int64))  # another dtype: converted by torch at the end
        if return_labels:
            if ids_dtype == torch.int32 and not pin_memory:  # int32 asked: input_ids a view, labels a copy
                out["input_ids"] = torch.from_numpy(self.tokens[:, :-1])
                labels = new.array((rows, span), wide)
                labels[:] = self.tokens[:, 1:]
            else:  # one allocation for both (fresh pages are faulted in once, not twice), widened by NumPy
                both = new.array((2, rows, span), wide)
                both[0], both[1] = self.tokens[:, :-1], self.tokens[:, 1:]
                out["input_ids"], labels = new.tensor(both[0]), both[1]
            if counts is not None:
                labels[~counts] = IGNORE_INDEX
            else:  # only rows with padding need masking: label j predicts token j + 1, padding from the row's length
                for row, length in _short_rows(self.lengths, width):
                    labels[row, max(length - 1, 0) :] = IGNORE_INDEX  # one slice a short row (no (B, L) mask)
            out["labels"] = new.tensor(labels)
        elif ids_dtype == torch.int32 and not pin_memory:
            out["input_ids"] = torch.from_numpy(self.tokens)
        else:
            ids = new.array((rows, width), wide)
            ids[:] = self.tokens
            out["input_ids"] = new.tensor(ids)
        if return_loss_mask:
            assert counts is not None
            mask = new.array(counts.shape, np.dtype(np.bool_))
            mask[:] = counts
            out["loss_mask"] = new.tensor(mask)
        if return_attention_mask:  # 1 on real tokens: ones, then each short row's padding zeroed (one slice each)
            attention = new.array((rows, span), np.dtype(np.int64))
            attention.fill(1)
            for row, length in _short_rows(self.lengths, span):
                attention[row, length:] = 0
            out["attention_mask"] = new.tensor(attention)
        if return_num_valid_tokens:
            assert counts is not None
            out["num_valid_tokens"] = new.tensor(np.array(np.count_nonzero(counts), dtype=np.int64))
        if return_position_ids or return_cu_seqlens:
            flat = self._segment_offsets(span)
        if return_position_ids:
            into = new.array((rows, span), np.dtype(np.int64))
            out["position_ids"] = new.tensor(_positions(flat, rows, span, into))
        if return_cu_seqlens:
            bounds = np.append(flat, rows * span).astype(np.int32)
            out["cu_seqlens"] = new.tensor(bounds)
            out["max_seqlen"] = int(np.diff(bounds).max()) if len(bounds) > 1 else 0
        if ids_dtype not in _NUMPY:
            for key in ("input_ids", "labels"):
                if key in out:
                    converted = out[key].to(ids_dtype)  # type: ignore[union-attr]
                    out[key] = converted.pin_memory() if pin_memory else converted
        return out


#: ``to_training``'s switches, from its signature: name → whether None is allowed (``bool | None``).
_SWITCHES = {
    name: param.annotation == "bool | None"
    for name, param in inspect.signature(Batch.to_training).parameters.items()
    if param.annotation in ("bool", "bool | None")
}


def check_switches(options: Mapping[str, object]) -> None:
    """Refuse a ``to_training`` switch among ``options`` that is not a boolean (``require_bool``): checked by
    ``to_training`` itself and, when a loader is made, by ``zephon.training_options``. One type test a switch."""
    for name, optional in _SWITCHES.items():
        if name in options and type(options[name]) is not bool:
            require_bool(options[name], name, optional=optional)


class _Outputs:
    """Where ``to_training`` writes its arrays: ``allocate``'s memory (a worker's slot), page-locked tensors
    (``pin_memory``) or new arrays; ``tensor`` wraps one without a copy (a pinned array's tensor is pinned)."""

    __slots__ = ("allocate", "pin_memory")

    def __init__(self, allocate: Allocate | None, pin_memory: bool) -> None:
        self.allocate, self.pin_memory = allocate, pin_memory

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if self.allocate is not None:
            return self.allocate(shape, dtype)
        if self.pin_memory:
            return torch.empty(shape, dtype=_TORCH[dtype], pin_memory=True).numpy()
        return np.empty(shape, dtype=dtype)

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        made = torch.from_numpy(array)
        return made if not self.pin_memory or made.is_pinned() else made.pin_memory()


def _short_rows(lengths: np.ndarray, width: int) -> list[tuple[int, int]]:
    """``(row, length)`` of the rows shorter than ``width`` (padded): a torch boolean mask over the whole (B, L)
    labels cost ~7 CPU ns a token on a batch with one short row; a slice per short row costs nothing per token.
    In Python over the few lengths of a microbatch: ~1 µs, against ~5 for NumPy's calls on arrays this small."""
    return [(row, length) for row, length in enumerate(lengths.tolist()) if length < width]


def _positions(flat: np.ndarray, rows: int, span: int, into: np.ndarray | None = None) -> np.ndarray:
    """(rows, span) int64 positions restarting at 0 at each flat segment start (``flat[0]`` is 0): one cumulative
    sum over the microbatch of steps of 1, each segment's first step taking back the length of the one before
    (in ``into`` when given). Example: span 4, starts at 0, 3 and 4 (row 1) → steps [0 1 1 -2 | 0 1 1 1] →
    [[0 1 2 0] [0 1 2 3]]."""
    if into is None:
        steps = np.ones(rows * span, dtype=np.int64)
    else:
        steps = into.reshape(-1)
        steps.fill(1)
    if not len(steps):
        return steps.reshape(rows, span)
    steps[flat[1:]] = flat[:-1] - flat[1:] + 1
    steps[0] = 0
    return np.cumsum(steps, out=steps).reshape(rows, span)  # in place: one (rows, span) array, not two


def join_training(
    parts: list[dict[str, torch.Tensor | int]], *, pin_memory: bool = False
) -> dict[str, torch.Tensor | int]:
    """The ``to_training`` dict of a batch from those of its consecutive row ranges, in order (module docstring):
    one operation per tensor, never per row. ``pin_memory``: the row tensors are concatenated straight into
    page-locked buffers (no second copy)."""
    if len(parts) == 1 and not pin_memory:
        return parts[0]
    first = parts[0]
    out: dict[str, torch.Tensor | int] = {}
    for key in first:
        values = [part[key] for part in parts]
        if key == "max_seqlen":
            out[key] = max(int(v) for v in values)  # type: ignore[call-overload]
        elif key == "num_valid_tokens":
            out[key] = torch.stack(values).sum()  # type: ignore[arg-type]
        elif key == "cu_seqlens":
            sizes = [part["input_ids"].numel() for part in parts]  # type: ignore[union-attr]
            shifted, before = [values[0]], 0
            for size, bounds in zip(sizes[:-1], values[1:], strict=True):
                before += size
                shifted.append(bounds[1:] + before)  # type: ignore[index]
            out[key] = torch.cat(shifted)  # type: ignore[arg-type]
        else:
            out[key] = _cat(values, pin_memory=pin_memory)  # type: ignore[arg-type]
    if pin_memory:
        out = {k: v.pin_memory() if isinstance(v, torch.Tensor) and not v.is_pinned() else v for k, v in out.items()}
    return out


def _cat(values: list[torch.Tensor], *, pin_memory: bool) -> torch.Tensor:
    if not pin_memory:
        return torch.cat(values)
    shape = (sum(v.shape[0] for v in values), *values[0].shape[1:])
    return torch.cat(values, out=torch.empty(shape, dtype=values[0].dtype, pin_memory=True))
