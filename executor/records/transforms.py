"""User operators over records (``map_transform`` / ``map_batch``), with seeded randomness by plan position.

A record pipeline runs the operators of ``zephon.executor.operators`` on each microbatch's records, knowing each
record's plan position. A ``map_transform(fn, seeded=True)`` is called as ``fn(record, rng)`` with

    rng = numpy.random.default_rng([plan seed, position, k])

where ``k`` is the operator's index in the pipeline's operators (two seeded operators draw independent streams).
The generator depends on nothing but the plan and the record's place in it — not on the rank, the data-parallel
size, the DataLoader worker, the batch or what ran before — so a random crop is the same after a resume and at
any dp size. A record read again in a later epoch has another position, so another crop. A plan without a seed
uses 0.

Worked example (seed 7): the record at position 12 gets ``default_rng([7, 12, 0])``; its first
``rng.integers(0, 100)`` is the same number whether position 12 is read by rank 0 of 1 or rank 1 of 4, from the
start or after resuming at step 3.

``map_batch`` runs once per microbatch on its live records and must return one output per record, each depending
on its own record only (microbatch sizes are execution settings). Start-up check, as for text: on the first
records an operator sees, it runs twice on copies of them (``map_batch``: once more on each half), and outputs
that differ are refused naming the operator; values are compared by content (NumPy arrays and tensors too).

A record an operator returns None for is dropped: counted (``RunStats.skipped["dropped"]``), listed in the
provenance log's skipped file, and absent from its batch. An operator that raises is a ``DatasetError`` naming
the dataset, shard and row (``on_bad_document="skip"``: counted as ``operator_error`` instead).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from zephon.errors import ConfigError, DatasetError
from zephon.executor.operators import SAMPLE, Operator, OperatorChain, Where

#: ``report(where, reason, message)``: a failed record (raises, or counts it under the skip policy).
Report = Callable[[Where, str, str], None]


def record_rng(seed: int, position: int, index: int) -> np.random.Generator:
    """The generator of operator ``index`` for the record at plan ``position`` (see the module docstring)."""
    return np.random.default_rng([seed, position, index])


def same(a: Any, b: Any) -> bool:
    """Equal by content: dicts, lists and tuples item by item; arrays and tensors by shape, dtype and values."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        )
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a, b))
        )
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a truth value
        return a is b


class RecordOperators(OperatorChain):
    """The pipeline's operators over records with plan positions (see the module docstring): ``OperatorChain``
    with seeded calls and a start-up check that compares arrays and tensors by content.

    State: whether the start-up check has run (``checked``).
    """

    def __init__(self, operators: tuple[Operator, ...], seed: int | None) -> None:
        super().__init__(operators)
        self.seed = 0 if seed is None else int(seed)

    def run(  # type: ignore[override]
        self, records: list[Any], where: list[Where], positions: list[int], *, report: Report, drop: Callable
    ) -> list[Any]:
        """The records after every operator, in order; None for dropped (``drop``) or failed (``report``) ones."""
        if not self.operators:
            return records
        return super().run(records, where, report=report, drop=drop, positions=positions)

    def _call(self, op: Operator, k: int, record: Any, position: int) -> Any:
        return op.fn(record, record_rng(self.seed, position, k)) if op.seeded else op.fn(record)

    def _check(self, records: list[Any], where: list[Where], positions: list[int] | None = None) -> None:
        """Run each operator twice on a sample (map_batch: also on its halves); refuse one whose outputs differ."""
        assert positions is not None  # run() always passes them
        idx = [i for i, r in enumerate(records) if r is not None][:SAMPLE]
        sample, at, pos = [records[i] for i in idx], [where[i] for i in idx], [positions[i] for i in idx]
        for k, op in enumerate(self.operators):
            try:
                runs = self._runs(op, k, sample, pos, at[0])
            except DatasetError:
                raise  # a map_batch that miscounts: said as such, not as randomness
            except Exception:
                return  # the run itself reports the failure with the record's location
            differs = [k2 for k2 in range(len(sample)) if any(not same(run[k2], runs[0][k2]) for run in runs[1:])]
            if differs:
                raise ConfigError(
                    f"{op.kind} {op.name} must be deterministic (every resume and every rank depend on it), got "
                    f"different outputs for the same input at {at[differs[0]]} — draw randomness from the rng of "
                    "map_transform(fn, seeded=True), not from global state"
                    + (", and make each output depend on its own record only" if op.kind == "map_batch" else "")
                )
            kept = [j for j, r in enumerate(runs[0]) if r is not None]
            sample, at, pos = [runs[0][j] for j in kept], [at[j] for j in kept], [pos[j] for j in kept]
