"""A continuation's datasets: the parent's, matched by name and content, then the new ones.

The kept prefix's rows name datasets by the parent's ``dataset_id``, and each dataset's reading order
derives from its index (``(seed, dataset_index, epoch)``), so the child lists the parent's datasets first, at
the parent's indices, whatever order the new config gives them in; datasets the parent did not have follow,
in the new config's order. A dataset is the same when its name and its content fingerprint (the shards'
URIs and fingerprints) are the parent's.

**A dataset the new config leaves out** stays in the child at its index — the kept steps still read it —
rebuilt from the parent's plan.json (its pinned path and selection; its files must still hold the data the
parent planned), with weight 0 in every stage from the branch on: the new segment never reads it. Its
plan.json entry (``config.datasets[i].removed_at_branch: true``, ``datasets[i].weight`` 0) keeps the prefix's
accounting (planned documents and tokens, epochs); ``zephon audit`` checks the kept phases against the
parent's targets and the new segment against a 0 target for it.

Worked example: parent ``[prose, code, short]``, new config ``[math, prose, short]`` with weights 0.2 /
0.5 / 0.3 → child ``[prose, code, short, math]``: ``code`` is left out (weight 0 after the branch, its
prefix documents kept), ``math`` is added; the segment's mixture is prose 0.5, code 0, short 0.3, math 0.2.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from zephon.errors import ConfigError, DatasetError, ZephonError
from zephon.plan.integrity import config_digest
from zephon.plan.manifest import Manifest
from zephon.planner.interleave import exact_weights
from zephon.planner.prepare import PreparedPlan
from zephon.recipe.dataset import Dataset
from zephon.recipe.work_source import MixtureSpec, WorkSource

#: The keys of a plan.json selection entry that rebuild a ``Dataset.from_path`` selection.
_SELECTION_KEYS = ("where", "metadata", "key", "order_by", "order_window", "dedup_on")


@dataclass(frozen=True, kw_only=True, slots=True)
class Aligned:
    """The new config's work source with the child's dataset order, and the datasets it left out."""

    #: The work source to prepare: the parent's datasets first (left-out ones rebuilt, with a placeholder weight
    #: that ``finish`` sets to 0), then the added ones.
    source: WorkSource
    #: The new config as given (its weights are the segment's).
    given: WorkSource
    #: Names of the parent's datasets the new config leaves out.
    removed: tuple[str, ...]
    #: Names of datasets the parent did not have.
    added: tuple[str, ...]


def align(source: WorkSource, parent: Manifest) -> Aligned:
    """The child's datasets (see the module docstring); a left-out dataset that cannot be read is one line."""
    given = {ds.name: ds for ds in source.datasets}
    config_entries = parent.config["datasets"]
    datasets: list[Dataset] = []
    removed: list[str] = []
    for entry, info in zip(parent.datasets, config_entries, strict=True):
        if entry.name in given:
            datasets.append(given[entry.name])
            continue
        removed.append(entry.name)
        datasets.append(_rebuild(entry.name, entry.pinned or entry.path, info.get("selection")))
    added = [ds for ds in source.datasets if ds.name not in {d.name for d in parent.datasets}]
    datasets += added
    weights = dict(source.mixture.weights) | dict.fromkeys(removed, 1.0)  # placeholders: 0 in every stage (finish)
    aligned = replace(source, datasets=tuple(datasets), mixture=MixtureSpec(weights))
    return Aligned(source=aligned, given=source, removed=tuple(removed), added=tuple(ds.name for ds in added))


def _rebuild(name: str, path: str, selection: dict[str, Any] | None) -> Dataset:
    """A left-out dataset as the parent planned it: its pinned path and its selection."""
    options = {k: selection[k] for k in _SELECTION_KEYS if selection and k in selection}
    try:
        return Dataset.from_path(name, path, **options)
    except ZephonError as error:
        raise DatasetError(
            f"dataset {name!r}, left out of the new config, must still be readable at {path!r} (the kept steps "
            f"before the branch read it), got: {error} — restore its files, or keep it in the config"
        ) from None


def finish(prepared: PreparedPlan, aligned: Aligned, parent: Manifest, where: str) -> PreparedPlan:
    """Check each parent dataset's content and the added ones' names, then give the left-out datasets weight 0
    from the branch on (stage 0's weights, the config's mixture, ``removed_at_branch``), rehashing the config."""
    entries = prepared.config["datasets"]
    for ds, entry in zip(parent.datasets, entries, strict=False):
        if entry["fingerprint"] != ds.fingerprint:
            left_out = " (left out of the new config, read by the kept steps)" if ds.name in aligned.removed else ""
            raise ConfigError(
                f"dataset {ds.name!r}{left_out} must hold the data the parent planned, got shards whose content "
                f"differs from {where}'s — restore the parent's files (pin a revision), or plan a new run"
            )
    by_content = {ds.fingerprint: ds.name for ds in parent.datasets if ds.name in aligned.removed}
    for entry in entries[len(parent.datasets) :]:
        if entry["fingerprint"] in by_content:
            old = by_content[entry["fingerprint"]]
            raise ConfigError(
                f"dataset {entry['name']!r} must be new to a continuation, got the data of the parent's dataset "
                f"{old!r} under another name — datasets are matched by name and content: name it {old!r} again"
            )
    if not aligned.removed:
        return prepared
    names = [d["name"] for d in entries]
    zero = {names.index(n) for n in aligned.removed}
    first = prepared.stages[0]
    stage0 = replace(first, raw=tuple(0.0 if i in zero else w for i, w in enumerate(first.raw)))
    kept = [n for n in names if n not in aligned.removed]
    fracs = dict(zip(kept, exact_weights([float(aligned.given.mixture.weights[n]) for n in kept]), strict=True))
    config = dict(prepared.config)
    config["mixture"] = {**config["mixture"], "weights": {n: str(fracs.get(n, 0)) for n in names}}
    config["datasets"] = [entry | {"removed_at_branch": True} if entry["name"] in aligned.removed else entry
                          for entry in entries]  # fmt: skip
    return replace(prepared, config=config, config_hash=config_digest(config), stages=(stage0, *prepared.stages[1:]))
