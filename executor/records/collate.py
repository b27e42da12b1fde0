"""Records to one microbatch: the default collate, and the check that every batch has one structure.

``default_collate(records)`` turns a list of records (dicts of the same keys) into one dict, key by key:

* numbers (``bool``, ``int``, ``float``, NumPy scalars) → a 1-D tensor (``bool``, ``int64``, ``float32``);
* NumPy arrays or tensors of one shape and dtype → one stacked tensor ``(B, *shape)``;
* dicts → collated recursively (a Hugging Face image struct ``{bytes, path}`` gives ``{"bytes": [...],
  "path": [...]}``);
* anything else — bytes, strings, None, lists, arrays of different shapes (ragged) — a Python list of the values.

Invariant: a key's collated form depends only on its values' kinds and shapes, never on the batch size, so a
key keeps one form across batches unless the data changes kind or shape (an image resized to one size stacks;
images of different sizes stay a list). ``Structure`` records the form of the first batch (key paths, tensor
dtype and rank, list or tensor) and refuses a later batch with another in one line naming the first path that
differs: a model would otherwise meet a list where it was given a tensor. A user ``collate`` is checked the same
way.

Example: records ``{"id": 3, "jpg": b"..", "vec": np.zeros(4)}`` and ``{"id": 5, "jpg": b"..", "vec":
np.ones(4)}`` collate to ``{"id": tensor([3, 5]), "jpg": [b"..", b".."], "vec": tensor of shape (2, 4)}``; a
third record with ``vec`` of 5 values in a batch makes that batch's ``vec`` a list, and ``Structure`` refuses it:
``collated batch must keep the structure of the first batch, got vec: list where it was tensor(float64, 2-D)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from zephon.errors import ConfigError, DatasetError

#: A user's collate: the microbatch's records (after the operators) → anything the training loop takes.
Collate = Callable[[list[dict[str, Any]]], Any]


class RecordError(DatasetError):
    """A collate's refusal of one record; ``index`` is its place in the list the collate was given, so the run
    names the record's dataset, shard and row before the message (``RecordRunner``)."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


_FLOAT = (float, np.floating)
_INT = (int, np.integer)


def default_collate(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The records as one dict of tensors and lists (see the module docstring); ``{}`` for no records."""
    if not records:
        return {}
    keys = list(records[0])
    for i, record in enumerate(records[1:], start=1):
        if list(record) != keys and set(record) != set(keys):
            raise DatasetError(
                f"records of a batch must have the same keys to collate, got {sorted(keys)} in record 0 and "
                f"{sorted(record)} in record {i} — make map_transform return the same keys, or pass "
                ".batch(collate=fn)"
            )
    return {key: _column([r[key] for r in records]) for key in keys}


def _column(values: list[Any]) -> Any:
    first = values[0]
    if all(isinstance(v, bool | np.bool_) for v in values):
        return torch.tensor([bool(v) for v in values], dtype=torch.bool)
    if all(isinstance(v, _INT) and not isinstance(v, bool | np.bool_) for v in values):
        return torch.tensor([int(v) for v in values], dtype=torch.int64)
    if all(isinstance(v, _INT + _FLOAT) and not isinstance(v, bool | np.bool_) for v in values):
        return torch.tensor([float(v) for v in values], dtype=torch.float32)
    if isinstance(first, np.ndarray) and all(isinstance(v, np.ndarray) for v in values):
        if first.dtype != object and all(v.shape == first.shape and v.dtype == first.dtype for v in values):
            return torch.from_numpy(np.stack(values))
        return values
    if isinstance(first, torch.Tensor) and all(isinstance(v, torch.Tensor) for v in values):
        if all(v.shape == first.shape and v.dtype == first.dtype for v in values):
            return torch.stack(values)
        return values
    if isinstance(first, Mapping) and all(isinstance(v, Mapping) and v.keys() == first.keys() for v in values):
        return {key: _column([v[key] for v in values]) for key in first}
    return list(values)


def structure(value: Any, path: str = "") -> tuple[tuple[str, str], ...]:
    """The form of a collated value: ``(path, kind)`` pairs in order — ``tensor(dtype, N-D)`` with the rank
    *including* the batch dimension, ``list``, ``dict``, or a Python type's name."""
    if isinstance(value, torch.Tensor):
        return ((path, f"tensor({str(value.dtype).removeprefix('torch.')}, {value.dim()}-D)"),)
    if isinstance(value, np.ndarray):
        return ((path, f"ndarray({value.dtype}, {value.ndim}-D)"),)
    if isinstance(value, Mapping):
        out: list[tuple[str, str]] = [(path, "dict")]
        for key in value:
            out.extend(structure(value[key], f"{path}.{key}" if path else str(key)))
        return tuple(out)
    if isinstance(value, list | tuple):
        return ((path, type(value).__name__),)
    return ((path, type(value).__name__),)


class Structure:
    """The collated form of the first batch, which every later batch must keep (see the module docstring).

    State: ``first`` — the first non-empty batch's ``structure`` (None until one was collated)."""

    __slots__ = ("first", "user")

    def __init__(self, *, user: bool) -> None:
        self.first: tuple[tuple[str, str], ...] | None = None
        self.user = user

    def check(self, collated: Any, where: str) -> None:
        """Refuse ``collated`` when its structure differs from the first batch's (``where``: the batch)."""
        got = structure(collated)
        if self.first is None:
            self.first = got
            return
        if got == self.first:
            return
        was, now = dict(self.first), dict(got)
        path = next(
            (p for p, _ in (*self.first, *got) if was.get(p) != now.get(p)),
            "",
        )
        shown = path or "the batch"
        fix = (
            "make the collate return one structure"
            if self.user
            else "resize or pad the values to one shape in map_transform, or pass .batch(collate=fn)"
        )
        raise DatasetError(
            f"collated batch must keep the structure of the first batch, got {shown}: {now.get(path, 'missing')} "
            f"where it was {was.get(path, 'missing')} at {where} — {fix}"
        )


def check_collate(collate: object) -> None:
    """A ``collate`` must be callable (or None)."""
    if collate is not None and not callable(collate):
        raise ConfigError(f"collate must be a function of a list of records, got {type(collate).__name__} — pass a def")
