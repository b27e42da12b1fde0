"""Several datasets reading one source: which documents more than one selection holds, and how often the plan
reads each (plan.json ``sources``, printed by ``zephon plan``).

Datasets read "the same source" when their shards are the same files with the same content (``(uri,
fingerprint)`` of every shard). Example: ``web_hq`` (``int_score >= 4``, 40 documents) planned 100 times and
``web`` (``int_score >= 2``, 120 documents including those 40) planned 120 times: each ``web_hq`` document is
read 2 or 3 times there and once in ``web`` — 3 to 4 reads; the other 80, once.
"""

from __future__ import annotations

import numpy as np

from zephon.plan.manifest import PlanSource, SourceReads
from zephon.plan.records import ShardRef
from zephon.planner.distinct import sorted_distinct
from zephon.planner.selection.evaluate import SelectedRows

__all__ = ["overlaps"]


def overlaps(
    names: list[str],
    shards: tuple[tuple[ShardRef, ...], ...],
    selections: tuple[SelectedRows | None, ...],
    planned: list[int],
) -> tuple[PlanSource, ...]:
    """plan.json ``sources``: datasets that read the same shards (several selections of one source), and how
    often the plan reads each of that source's documents.

    Per source: its datasets, its distinct selected documents, those selected by more than one dataset, and
    the least and most times any one document is planned. A dataset that plans ``n`` documents over ``s``
    selected reads each of them ``n // s`` or ``n // s + 1`` times; a document's reads are the sum over the
    datasets that select it, so ``min``/``max`` are exact bounds (equal when every ``s`` divides ``n``).
    """
    groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for index, refs in enumerate(shards):
        groups.setdefault(tuple(r.identity for r in refs), []).append(index)
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        codes, low, high = [], [], []
        for i in members:
            chosen = selections[i]
            if chosen is not None:
                code = (chosen.shard.astype(np.int64) << 32) | chosen.row.astype(np.int64)
            else:
                refs = shards[i]
                code = np.concatenate(
                    [(np.int64(j) << 32) | np.arange(r.rows, dtype=np.int64) for j, r in enumerate(refs)]
                )
            codes.append(np.sort(code))
            low.append(planned[i] // len(code))
            high.append(-(-planned[i] // len(code)))
        union = sorted_distinct(np.concatenate(codes))
        member = np.stack([np.isin(union, c, assume_unique=True) for c in codes])
        least = (member * np.array(low)[:, None]).sum(axis=0)
        most = (member * np.array(high)[:, None]).sum(axis=0)
        out.append(
            PlanSource(
                datasets=tuple(names[i] for i in members),
                documents=len(union),
                in_several_selections=int((member.sum(axis=0) > 1).sum()),
                reads_per_document=SourceReads(min=int(least.min()), max=int(most.max())),
            )
        )
    return tuple(out)
