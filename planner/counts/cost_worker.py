"""The computed cost pass on one shard, and its worker process: ``python -m zephon.planner.counts.cost_worker``.

``compute_shard(ref, function)`` calls a dataset's cost function (``zephon.recipe.computed_cost``) on every sample
of one shard, in row order, as a record pipeline reads the sample before its operators
(``zephon.executor.records``): a Parquet row's or JSONL object's columns (``ShardReader`` in record mode; a remote
shard through the planning shard cache), a WebDataset sample ``{"__key__": ..., ext: bytes}`` (a local tar by
positioned reads; a remote one read whole by one request and indexed in memory: the pass reads every payload
anyway), an MDS sample's decoded values. Each value is checked and rounded up: a cost is an integer
``0 ≤ c ≤ 2^31 - 1`` (``zephon.planner.costs.MAX_COST``); an exception, a non-number (``bool`` included), NaN,
infinity, a negative value or a larger one is one ``DatasetError`` naming the dataset, shard, row and key.

Invariant: the array depends on the shard's samples and the function only — never on the worker, the engine or
what else the worker computed — so 1 or N workers, local or Ray, give the same bytes.

The worker reads its job as JSON on stdin (``{"sys_path": [...], "tasks": [{"ref", "out", "function",
"source"}]}``), imports each function once, refuses one whose source hash differs from the planner's (edited
while planning), writes each array atomically and prints one JSON line per shard (``{"shard_id": 3}``) or, on a
``ZephonError``, ``{"error": "...", "kind": "DatasetError"}`` before exiting 1.

Worked example: ``fn = lambda s: len(s["txt"]) / 4`` over a shard of captions of 8, 10 and 0 bytes gives
``[2, 3, 0]`` (2.5 rounded up).
"""

from __future__ import annotations

import importlib
import json
import math
import numbers
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import ConfigError, DatasetError, ZephonError, one_line
from zephon.executor.operators import source_hash
from zephon.executor.records.tar import sample_key
from zephon.plan.records import ShardRef
from zephon.planner.record_samples import CHUNK, shard_samples
from zephon.storage.files import write_atomic

__all__ = ["CHUNK", "CostFunction", "compute_shard", "resolve"]

#: Costs travel in samples.parquet's int32 ``tokens`` column (``zephon.planner.costs.MAX_COST``).
MAX_COST = 2**31 - 1


@dataclass(frozen=True, kw_only=True, slots=True)
class CostFunction:
    """A dataset's cost function, imported: its import ``path`` (``module:name``), the function and its
    ``source`` (SHA-256 of its source, ``zephon.executor.operators.source_hash``)."""

    path: str
    fn: Callable[[Any], Any]
    source: str


def resolve(dataset: str, path: str) -> CostFunction:
    """Import ``path`` (``module.path:name``); one line naming ``dataset`` when it is not importable or callable."""
    module, _, attr = path.partition(":")
    fix = "install its package or fix the path (the planner, its worker processes and Ray tasks import it)"
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # any import-time failure of user code is the same refusal
        raise ConfigError(
            f"dataset {dataset!r}: cost function {path!r} must be importable, got {type(exc).__name__}: "
            f"{one_line(exc)} — {fix}"
        ) from None
    if not callable(obj):
        raise ConfigError(
            f"dataset {dataset!r}: cost function {path!r} must be callable, got {type(obj).__name__} — name a def"
        )
    try:
        source = source_hash(obj)
    except ConfigError:
        raise ConfigError(
            f"dataset {dataset!r}: cost function {path!r} must be a Python function, got {type(obj).__name__} — "
            "name a def (its source is hashed, so an edited function is computed again)"
        ) from None
    return CostFunction(path=path, fn=obj, source=source)


def _checked(value: Any) -> tuple[int | None, str]:
    """``(cost, "")`` for a valid value (rounded up), else ``(None, what it was)``; a negative value is refused
    before rounding (-0.5 is negative, as for an expression's cost)."""
    shown = one_line(repr(value))[:40]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None, f"{type(value).__name__} {shown}"
    if isinstance(value, numbers.Integral):  # exact, however large (float() of 10**400 overflows)
        cost = int(value)
    else:
        number = float(value)
        if math.isnan(number) or math.isinf(number):
            return None, f"not a finite number ({number})"
        cost = math.ceil(number) if number >= 0 else -1
    if cost < 0:
        return None, f"negative ({shown})"
    if cost > MAX_COST:
        return None, f"above {MAX_COST} ({shown})"
    return cost, ""


def compute_shard(ref: ShardRef, function: CostFunction) -> np.ndarray:
    """The cost (int64, rounded up) of every sample of ``ref`` under ``function`` (see the module docstring)."""
    out = np.zeros(ref.rows, np.int64)
    row = 0
    fn = function.fn
    for samples in shard_samples(ref):
        for sample in samples:  # a user function per sample: the pass's whole point (benchmarks/bench_costs.py)
            try:
                cost, bad = _checked(fn(sample))
            except Exception as exc:  # the user's function: any exception is a refusal naming the sample
                cost, bad = None, f"{type(exc).__name__}: {one_line(exc)}"
            if cost is None:
                key = sample_key(sample)
                raise DatasetError(
                    f"dataset {ref.dataset!r}: cost function {function.path} must return a number ≥ 0 and ≤ "
                    f"{MAX_COST} for every sample, got {bad} at shard {ref.uri} row {row}"
                    + (f" (key {key!r})" if key is not None else "")
                    + " — fix the function (it runs at plan time on every sample)"
                )
            out[row] = cost
            row += 1
    if row != ref.rows:
        raise DatasetError(
            f"dataset {ref.dataset!r}: shard {ref.uri} must hold {ref.rows} samples as planned, got {row} — restore "
            "it or re-plan"
        )
    return out


def save_atomic(path: Path, array: np.ndarray) -> None:
    """Write a shard's costs all or nothing (temporary + rename): a killed pass leaves no partial array."""
    write_atomic(path, lambda tmp: np.save(tmp, array), "the computed cost cache")


def checked_function(ref: ShardRef, path: str, source: str) -> CostFunction:
    """A worker's (or Ray task's) import of ``path``, refused when its source is not the planner's ``source``."""
    function = resolve(ref.dataset, path)
    if function.source != source:
        raise ConfigError(
            f"dataset {ref.dataset!r}: cost function {path} must be the planner's (source {source[:12]}), got "
            f"another source ({function.source[:12]}) in a worker — plan again once the function stops changing"
        )
    return function


def add_paths(paths: list[str]) -> None:
    """Make the planner's import paths (``sys.path``) this process's too, so its functions import here."""
    sys.path[:0] = [p for p in paths if p not in sys.path]


def main() -> None:
    job = json.load(sys.stdin)
    add_paths(job["sys_path"])
    functions: dict[tuple[str, str, str], CostFunction] = {}
    try:
        for task in job["tasks"]:
            ref = ShardRef(**task["ref"])
            which = (ref.dataset, task["function"], task["source"])
            if which not in functions:
                functions[which] = checked_function(ref, task["function"], task["source"])
            save_atomic(Path(task["out"]), compute_shard(ref, functions[which]))
            print(json.dumps({"shard_id": ref.shard_id}), flush=True)
    except ZephonError as exc:  # one line: the planner raises it again, as the same kind
        print(json.dumps({"error": str(exc), "kind": type(exc).__name__}), flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
