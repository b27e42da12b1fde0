"""The one way a work source becomes a plan bundle: ``plan_source``, used by ``work_source.plan(...)``,
``zephon plan`` and ``Pipeline(work_source)``.

* ``out_dir`` given: plan into it (``--overwrite`` rules and one writer at a time: ``build.write_bundle``), from
  the start (``build.write_plan``) or continuing a parent plan (``continuation.continue_plan``); a budget not
  met is a ``zephon.PlanWarning``.
* ``out_dir`` None: the plan cache — ``$ZEPHON_CACHE_DIR/plans/<config hash>-layout<N>``, written once and
  reused while the hash (datasets' contents, mixture, budget, seed, tokenizer, packing, operators) is the same;
  ranks planning it together wait for the one that writes. The caller (the pipeline) reports its warnings when
  it opens the bundle. Copies of the selections (which the hash does not cover: they change how rows are read,
  never which) make a bundle of their own, ``…-layout<N>-copies``, so a cached bundle without them is never
  taken for one with them (nor the reverse).

Every option reaches every caller (``PlanOptions``): ``workers`` and ``progress`` steer the count pass and the bars,
``materialize_selections`` writes copies of the selected rows (docs/curricula.md).

Example: ``plan_source(ws, None, PlanOptions(tokenize=spec))`` → ``~/.cache/zephon/plans/3f2a…-layout3``
(planned the first time, found the next).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zephon.errors import ConfigError
from zephon.planner.build import PlanOptions, write_bundle, write_plan
from zephon.recipe.work_source import WorkSource
from zephon.storage.files import cache_dir


def plan_source(
    source: WorkSource,
    out_dir: str | Path | None,
    options: PlanOptions | None = None,
    *,
    continue_from: str | Path | None = None,
    at_step: int | None = None,
    global_batch: int | None = None,
    state: dict[str, Any] | None = None,
) -> Path:
    """Plan ``source`` with ``options`` into ``out_dir`` (None: the plan cache) and return the bundle's path (module
    docstring)."""
    options = options or PlanOptions()
    if continue_from is None and (at_step is not None or global_batch is not None or state is not None):
        raise ConfigError(
            "at_step, global_batch and state must come with continue_from, got them without — pass "
            "continue_from=PARENT_PLAN_DIR, or leave them out to plan from the start"
        )
    if out_dir is None:
        if continue_from is not None:
            # the cache is keyed by the config hash, which a parent plan does not change
            raise ConfigError(
                "a continuation must be written to a directory of its own, got the plan cache — plan it with "
                "work_source.plan(DIR, continue_from=...) or zephon plan -o DIR --continue-from, then "
                "Pipeline.from_plan(DIR)"
            )
        return _cached(source, options)
    if continue_from is not None:
        from zephon.planner.continuation.child import continue_plan

        parent = {"at_step": at_step, "global_batch": global_batch, "state": state}
        return continue_plan(continue_from, source, Path(out_dir), **parent, options=options)
    return write_plan(source, Path(out_dir), options)


def _cached(source: WorkSource, options: PlanOptions) -> Path:
    """The plan cache's bundle for ``source``: written when absent (one writer; the others wait), else reused."""
    from zephon.planner.layout import LAYOUT_VERSION

    prepared = options.prepare(source)
    copies = options.materialize_selections
    name = f"{prepared.config_hash}-layout{LAYOUT_VERSION}" + ("-copies" if copies else "")
    target = cache_dir() / "plans" / name
    if not (target / "plan.json").is_file():
        # A read-only or full cache directory is a StorageError naming it (storage.files).
        write_bundle(prepared, target, overwrite=True, wait=True, materialize_selections=copies)
    return target
