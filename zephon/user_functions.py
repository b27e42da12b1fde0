"""The user's functions a pipeline carries into another process, checked as the pipeline is pickled for it.

A DataLoader worker started by ``spawn`` or ``forkserver`` (the default start method on macOS and Windows, and on
Linux from Python 3.14) receives the pipeline pickled, and pickle sends a function as its module and qualified
name for the worker to import: a lambda, or a function defined inside another, cannot be sent. Pickle's own error
(``Can't pickle local object 'main.<locals>.clean'``) names neither the operator nor a fix and comes from deep in
torch's worker start-up, so ``require_picklable`` checks each user function of the pipeline's settings — its
``map_transform`` / ``map_batch`` operators and a record pipeline's ``collate`` — and refuses the first that cannot
be sent in one line. It runs where a pipeline is sent to another process and only there: ``reduce_for_process`` is
registered with multiprocessing's own pickler (``ForkingPickler``, what a spawned or forkserver worker's arguments
go through), so ``copy.deepcopy`` and a plain ``pickle.dumps`` of a pipeline with a lambda work as before, and a
forked worker (which copies the process and pickles nothing) pays nothing; the check costs one extra pickling of
each function (by reference: microseconds).

Example: ``Pipeline(source).map_transform(lambda r: r)`` handed to ``dataloader(num_workers=2,
multiprocessing_context="spawn")`` → "map_transform __main__.<lambda> must be picklable to reach another process
(...), got AttributeError: ... — define it at module level (...), or use num_workers=0 or
multiprocessing_context='fork'".
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

from zephon.errors import ConfigError, one_line
from zephon.executor.operators import qualified_name
from zephon.executor.settings import ExecutorSpec

__all__ = ["reduce_for_process", "require_picklable"]


def reduce_for_process(pipeline: Any) -> tuple[Any, ...]:
    """``ForkingPickler``'s reducer of a ``Pipeline``: its user functions checked, then pickled as it always is."""
    require_picklable(pipeline._spec)
    return pipeline.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


def require_picklable(spec: ExecutorSpec) -> None:
    """Refuse, in one line naming it, the first user function of ``spec`` pickle cannot send to another process."""
    for op in spec.operators:
        _check(op.fn, f"{op.kind} {op.name}")
    if spec.collate is not None:
        _check(spec.collate, f"collate {qualified_name(spec.collate)}")


def _check(fn: Callable[..., Any], what: str) -> None:
    try:
        ForkingPickler.dumps(fn)  # as the worker's arguments will be: refused only where that would fail
    except Exception as exc:  # pickle raises PicklingError, AttributeError or TypeError, by what it met
        raise ConfigError(
            f"{what} must be picklable to reach another process (a DataLoader worker started by spawn or "
            f"forkserver), got {type(exc).__name__}: {one_line(exc)} — define it at module level (not a lambda, "
            "not a function inside another), or use num_workers=0 or multiprocessing_context='fork'"
        ) from None
