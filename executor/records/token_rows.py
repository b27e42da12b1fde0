"""Records' token lists as training rows: one record per row, or several packed into a row (``TokenRows``).

A record pipeline's samples may carry tokens of their own — a caption tokenized in ``map_transform`` behind an
image placeholder token repeated once per patch. ``TokenRows`` is a collate (``.batch(collate=TokenRows(...))``)
that turns the records' ragged token lists into the tensors of a training step, with the conventions of
``Batch.to_training`` (``zephon.executor.batch``): rows of ``max_length`` tokens (context + 1), shifted by one.

* ``input_ids`` (R, max_length − 1) int64: each row but its last token, padded with ``pad_token_id``;
* ``labels`` (R, max_length − 1) int64: each row but its first token, ``-100`` where the predicted token is
  padding, one of ``ignore_ids`` (image placeholders: a model never predicts them), 0 in the record's
  ``loss_mask``, or the first token of another record (a record never predicts the start of the next);
* ``attention_mask`` (R, max_length − 1) int64: 1 on the records' tokens, 0 on padding;
* ``position_ids`` (R, max_length − 1) int64: restart at 0 at every record and at the padding;
* ``cu_seqlens`` (int32, 1-D) and ``max_seqlen`` (int): the segments of the flattened ``input_ids``, cut where
  the position ids restart (varlen attention kernels);
* ``num_valid_tokens``: a 0-d int64 tensor, the labels that count;
* every other key of the records, by ``default_collate``: one entry per record, in record order (``pixel_values``
  (N, patches, D): image ``i`` belongs to the ``i``-th run of placeholders in reading order, packed or not).

``pack=False``: record ``i`` is row ``i`` (R = records). ``pack=True``: records fill rows in their order, a new row
when the next one does not fit in what is left (R ≤ records; no record is split or reordered). A record longer
than ``max_length`` tokens is refused in one line naming its ``__key__`` (or its index in the batch): cut the
caption in ``map_transform``; in a run, the message starts with the record's dataset, shard and row
(``RecordError``). The records' order, and so each image's run of placeholders, never changes.

Invariant: every token of every record is in exactly one row, once, in order; a label counts only where both the
token and the one it predicts belong to the same record and the predicted one trains.

Example: ``max_length=6``, ``ignore_ids=(9,)``, records ``[9 9 5 6]`` and ``[9 7]``, ``pack=True``: one row
``[9 9 5 6 9 7]`` → input_ids ``[9 9 5 6 9]``, labels ``[-100 5 6 -100 7]`` (9 is never predicted; 6 does not
predict the next record's 9), position_ids ``[0 1 2 3 0]``, cu_seqlens ``[0 4 5]``, max_seqlen 4. With
``pack=False`` the same records are two rows: ``[9 9 5 6 P]`` and ``[9 7 P P P]`` (P the padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from zephon.checks import is_int
from zephon.errors import ConfigError
from zephon.executor.batch import IGNORE_INDEX
from zephon.executor.records.collate import RecordError, default_collate


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenRows:
    """A collate of records with token lists (see the module docstring).

    Attributes:
        max_length: tokens per row, context + 1 (rows are shifted by one, as ``pack_flat``'s).
        pad_token_id: the id that fills rows past their records.
        field: the records' key holding the token ids (a list of ints or a 1-D integer array).
        ignore_ids: ids never predicted: their labels are -100 (an image placeholder).
        loss_mask: the records' key of a per-token 0/1 list (1: predicting this token trains), or None (all do).
        pack: several records per row, in order (True), or one record per row (False).
    """

    max_length: int
    pad_token_id: int = 0
    field: str = "input_ids"
    ignore_ids: tuple[int, ...] = ()
    loss_mask: str | None = None
    pack: bool = False

    def __post_init__(self) -> None:
        if not is_int(self.max_length) or self.max_length < 2:
            raise ConfigError(f"TokenRows max_length must be an integer ≥ 2, got {self.max_length!r} — e.g. 129")
        if not is_int(self.pad_token_id) or self.pad_token_id < 0:
            raise ConfigError(f"TokenRows pad_token_id must be an integer ≥ 0, got {self.pad_token_id!r} — e.g. 0")
        if not isinstance(self.ignore_ids, tuple) or not all(is_int(i) for i in self.ignore_ids):
            raise ConfigError(
                f"TokenRows ignore_ids must be a tuple of token ids, got {self.ignore_ids!r} — e.g. (image_id,)"
            )

    def __call__(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The microbatch's tensors (see the module docstring); ``{}`` for no records."""
        if not records:
            return {}
        ids = [self._ids(record, i) for i, record in enumerate(records)]
        trains = [self._trains(record, i, len(x)) for i, (record, x) in enumerate(zip(records, ids, strict=True))]
        row, start = self._places([len(x) for x in ids])
        width = self.max_length
        tokens = np.full((int(row[-1]) + 1, width), self.pad_token_id, np.int64)
        counts = np.zeros(tokens.shape, bool)  # predicting this token trains
        starts = np.zeros(tokens.shape, bool)  # a record's first token
        used = np.zeros(len(tokens), np.int64)
        # One slice assignment per record: a microbatch holds a few dozen records, each a few hundred tokens.
        for x, keep, r, s in zip(ids, trains, row.tolist(), start.tolist(), strict=True):
            tokens[r, s : s + len(x)] = x
            counts[r, s : s + len(x)] = keep
            starts[r, s] = len(x) > 0
            used[r] = s + len(x)
        cols = np.arange(width)
        segments = starts.copy()  # where position ids restart: each record, each row, the padding
        segments[:, 0] = True
        segments |= (cols[None, :] == used[:, None]) & (used[:, None] < width)
        valid = counts[:, 1:] & ~starts[:, 1:]
        labels = np.where(valid, tokens[:, 1:], IGNORE_INDEX)
        inputs = segments[:, :-1]
        last = np.maximum.accumulate(np.where(inputs, cols[None, :-1], 0), axis=1)
        bounds = np.append(np.flatnonzero(inputs.reshape(-1)), inputs.size).astype(np.int32)
        out: dict[str, Any] = {
            "input_ids": torch.from_numpy(np.ascontiguousarray(tokens[:, :-1])),
            "labels": torch.from_numpy(labels),
            "attention_mask": torch.from_numpy((cols[None, :-1] < used[:, None]).astype(np.int64)),
            "position_ids": torch.from_numpy(cols[None, :-1] - last),
            "cu_seqlens": torch.from_numpy(bounds),
            "max_seqlen": int(np.diff(bounds).max()),
            "num_valid_tokens": torch.tensor(int(np.count_nonzero(valid)), dtype=torch.int64),
        }
        own = {self.field, self.loss_mask}
        rest = [{k: v for k, v in record.items() if k not in own} for record in records]
        if rest[0]:
            clash = sorted(set(out) & set(rest[0]))
            if clash:
                raise RecordError(
                    f"records collated by TokenRows must not have the keys it makes, got {clash[0]!r} in record "
                    f"{self._name(records[0], 0)} — rename it in map_transform",
                    0,
                )
            out.update(default_collate(rest))
        return out

    def _ids(self, record: dict[str, Any], i: int) -> np.ndarray:
        value = record.get(self.field) if isinstance(record, dict) else None
        array = np.asarray(value) if isinstance(value, list | tuple | np.ndarray | torch.Tensor) else None
        if array is None or array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise RecordError(
                f"record {self._name(record, i)} must have {self.field!r} as a list of token ids, got "
                f"{type(value).__name__ if array is None else f'{array.ndim}-D {array.dtype}'} — return it from "
                "map_transform",
                i,
            )
        if len(array) > self.max_length:
            raise RecordError(
                f"record {self._name(record, i)} must have at most max_length={self.max_length} tokens in "
                f"{self.field!r}, got {len(array)} — cut the caption in map_transform or raise max_length",
                i,
            )
        return array.astype(np.int64, copy=False)

    def _trains(self, record: dict[str, Any], i: int, size: int) -> np.ndarray:
        ids = np.asarray(record[self.field], np.int64)
        keep = ~np.isin(ids, self.ignore_ids) if self.ignore_ids else np.ones(size, bool)
        if self.loss_mask is None:
            return keep
        mask = np.asarray(record.get(self.loss_mask, ()))
        if mask.shape != (size,):
            raise RecordError(
                f"record {self._name(record, i)} must have {self.loss_mask!r} with one 0/1 per token ({size}), got "
                f"shape {mask.shape} — return both from map_transform",
                i,
            )
        return keep & (mask != 0)

    def _places(self, lengths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Each record's row and first column: its own row, or (``pack``) the current row while it fits."""
        if not self.pack:
            return np.arange(len(lengths)), np.zeros(len(lengths), np.int64)
        rows, starts, r, at = [], [], 0, 0
        for size in lengths:
            if at and at + max(size, 1) > self.max_length:  # an empty record after a full row: the next row
                r, at = r + 1, 0
            rows.append(r)
            starts.append(at)
            at += size
        return np.array(rows, np.int64), np.array(starts, np.int64)

    @staticmethod
    def _name(record: Any, i: int) -> str:
        key = record.get("__key__") if isinstance(record, dict) else None
        return f"{key!r}" if key is not None else f"{i} of the microbatch"
