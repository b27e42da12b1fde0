"""No silent shortfalls: what plan.json ``warnings`` records about a plan that falls short of its budget or
repeats a dataset heavily (``zephon plan`` prints them; Python issues them as ``zephon.PlanWarning``).

Two kinds, decided from the plan's totals once it is laid out (``E`` is the epochs budget: ``epochs``, else 1
— also with a ``num_documents`` or ``num_tokens`` budget, as the stop rule counts it):

* ``budget_not_met`` — ``on_exhaustion="stop"`` ended the plan before its budget: fewer documents than
  ``num_documents``, fewer (estimated or exact) tokens than ``num_tokens``, fewer costs than ``num_cost``, or,
  with an epochs budget, some dataset short of its ``E`` passes. ``dataset`` is the one that ran out (the
  first, in work-source order, that read all of its ``E`` passes); ``requested`` and ``planned`` are in the
  budget's unit (documents, tokens, costs, or passes of the dataset furthest short).
* ``repetition`` — a dataset planned for more than ``REPETITION_LIMIT × E`` passes (planned documents /
  rows). Repeating data up to about four times costs little against fresh data; beyond that its value falls
  quickly (Muennighoff et al., "Scaling Data-Constrained Language Models", 2023), so a mixture that reads a
  small dataset hundreds of times is almost always a mistake of weights or data.

Worked example: weights a 0.5 / b 0.5, a with 2 documents, b with 3, ``num_documents=100`` and
``on_exhaustion="stop"``: the plan ends after 4 positions, before a would start its second pass — one
``budget_not_met`` (``num_documents``, requested 100, planned 4, dataset a). The same with ``new_epoch``
plans 100 positions, 50 of a (25 passes) and 50 of b (16.67 passes): two ``repetition`` entries (limit 4).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from zephon.plan.manifest import PlanWarningEntry
from zephon.planner.prepare import PreparedPlan

#: A dataset read more than this many times its epochs budget (planned documents / rows) draws a warning.
REPETITION_LIMIT = 4

_REPEAT_ANYWAY = "or set on_exhaustion to new_epoch to repeat datasets"


def plan_warnings(
    prepared: PreparedPlan, *, documents: int, docs: np.ndarray, tokens: int | None
) -> tuple[PlanWarningEntry, ...]:
    """plan.json ``warnings`` of a plan of ``documents`` positions, ``docs`` per dataset and ``tokens`` in all
    (None without token counts)."""
    source = prepared.source
    names = [ds.name for ds in source.datasets]
    rows = [prepared.dataset_rows(i) for i in range(len(prepared.shards))]
    passes = source.epochs or 1
    planned = [int(d) for d in docs]
    # A continued plan's left-out datasets (``zephon.planner.continuation.datasets``) owe no passes.
    left_out = {i for i, entry in enumerate(prepared.config["datasets"]) if entry.get("removed_at_branch")}
    out: list[PlanWarningEntry] = []
    if source.on_exhaustion == "stop":
        ran_out = next((i for i, (d, r) in enumerate(zip(planned, rows, strict=True)) if d >= passes * r), None)
        name = names[ran_out] if ran_out is not None else None
        why = (
            f"on_exhaustion stop ended the plan before dataset {name!r} ({rows[ran_out]} documents) would start "
            f"pass {passes + 1}"
            if ran_out is not None
            else "on_exhaustion stop ended the plan"
        )
        shortfall = partial(PlanWarningEntry, kind="budget_not_met", dataset=name)
        if source.num_documents is not None and documents < source.num_documents:
            text = (
                f"budget not met: num_documents {source.num_documents} asked, {documents} planned — {why}; add "
                f"data, lower num_documents, {_REPEAT_ANYWAY}"
            )
            out.append(
                shortfall(budget="num_documents", requested=source.num_documents, planned=documents, message=text)
            )
        elif source.num_tokens is not None and tokens is not None and tokens < source.num_tokens:
            kind = "exact" if prepared.exact else "estimated"
            text = (
                f"budget not met: num_tokens {source.num_tokens} asked, {tokens} ({kind}) planned — {why}; add "
                f"data, lower num_tokens, {_REPEAT_ANYWAY}"
            )
            out.append(shortfall(budget="num_tokens", requested=source.num_tokens, planned=tokens, message=text))
        elif source.num_cost is not None and tokens is not None and tokens < source.num_cost:
            text = (
                f"budget not met: num_cost {source.num_cost} asked, {tokens} planned — {why}; add data, lower "
                f"num_cost, {_REPEAT_ANYWAY}"
            )
            out.append(shortfall(budget="num_cost", requested=source.num_cost, planned=tokens, message=text))
        elif source.num_documents is None and source.num_tokens is None and source.num_cost is None:
            short = [
                i for i, (d, r) in enumerate(zip(planned, rows, strict=True)) if d < passes * r and i not in left_out
            ]
            if short:
                worst = min(short, key=lambda i: planned[i] / rows[i])
                got = planned[worst] / rows[worst]
                text = (
                    f"budget not met: epochs {passes} asked of every dataset, {got:.2f} passes planned of dataset "
                    f"{names[worst]!r} — {why}; give {names[worst]!r} more weight, add data to "
                    f"{name!r}, {_REPEAT_ANYWAY}"
                )
                out.append(shortfall(budget="epochs", requested=passes, planned=got, message=text))
    limit = REPETITION_LIMIT * passes
    for name, d, r in zip(names, planned, rows, strict=True):
        if r and d > limit * r:
            read = d / r
            out.append(
                PlanWarningEntry(
                    kind="repetition",
                    dataset=name,
                    passes=read,
                    epochs=passes,
                    limit=limit,
                    message=(
                        f"heavy repetition: dataset {name!r} is planned for {read:.2f} passes ({d} documents of "
                        f"{r}), more than {REPETITION_LIMIT} × its epochs budget {passes} — add data to it, lower "
                        "its weight, or set on_exhaustion to stop"
                    ),
                )
            )
    return tuple(out)
