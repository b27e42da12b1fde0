"""Which of a dataset's documents a plan reads, and in what order: a selection by metadata (configuration only).

``Dataset.from_path(name, path, where=..., metadata=..., key=..., order_by=..., dedup_on=...)`` carries one
``Selection``; the planner evaluates it with DuckDB at plan time (``zephon.planner.selection.evaluate``) and the plan
holds the selected rows, so the executor's work does not change. Every field is optional; a dataset without
them reads every row, exactly as before (plans stay byte-identical).

Fields are SQL text as the user wrote it (DuckDB dialect); they are recorded in plan.json verbatim and hashed
into the plan's ``config_hash``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon.checks import is_int
from zephon.errors import ConfigError

__all__ = ["NULLS_RULE", "Selection"]

#: What ``order_by`` does with NULL keys (documented in docs/curricula.md).
NULLS_RULE = "nulls last (ascending and descending)"


#: What each selection field is, and an example of it, for the refusal of an empty or non-string one.
_FIELDS = {
    "where": ("SQL predicate", 'where="int_score >= 3"'),
    "metadata": ("path of a sidecar table", 'metadata="scores/*.parquet"'),
    "key": ("column name", 'key="id"'),
    "order_by": ("column or SQL expression", 'order_by="quality DESC"'),
    "dedup_on": ("column or SQL expression", 'dedup_on="url"'),
}


def _text(name: str, field: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        what, example = _FIELDS[field]
        raise ConfigError(
            f"dataset {name!r}: {field} must be a non-empty {what}, got {value!r} — write e.g. {example} or leave it "
            "out"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Selection:
    """A dataset's selection by metadata.

    Attributes:
        dataset: the dataset's name (for messages).
        where: a DuckDB predicate over the dataset's columns and its sidecar's (``int_score >= 3``).
        metadata: a sidecar table (Parquet file, directory or glob; local, ``s3://``, ``gs://``, ``az://`` or
            ``hf://``) joined on ``key``.
        key: the column both the dataset and the sidecar hold, one value per document.
        order_by: a column or SQL expression, with an optional ``ASC``/``DESC``: the dataset is read in this
            order (ties by shard and row), shuffled only inside windows of ``order_window`` documents.
        order_window: documents per local shuffle window of an ordered dataset (1: strict order).
        dedup_on: a column or expression: one document per value is kept, chosen by the seed; NULL keys
            are all kept.
    """

    dataset: str
    where: str | None = None
    metadata: str | None = None
    key: str | None = None
    order_by: str | None = None
    order_window: int = 1024
    dedup_on: str | None = None

    def __post_init__(self) -> None:
        for field in ("where", "metadata", "key", "order_by", "dedup_on"):
            _text(self.dataset, field, getattr(self, field))
        if (self.metadata is None) != (self.key is None):
            given, missing = ("metadata", "key") if self.metadata is not None else ("key", "metadata")
            raise ConfigError(
                f"dataset {self.dataset!r}: {given}= needs {missing}= too, got only {given} — pass both "
                'metadata="scores/*.parquet" and key="id" (the column both tables hold)'
            )
        if not is_int(self.order_window) or self.order_window < 1:
            raise ConfigError(
                f"dataset {self.dataset!r}: order_window must be an integer ≥ 1, got {self.order_window!r} — "
                "write e.g. order_window=1024 (1 reads in strict order)"
            )

    @property
    def active(self) -> bool:
        """True when the selection changes anything (a where, a sidecar, an order or a dedup key)."""
        return any(v is not None for v in (self.where, self.metadata, self.order_by, self.dedup_on))

    def normalized(self) -> dict[str, Any]:
        """The fields that define the selection, for the plan's config (sidecar fingerprints are added there)."""
        out: dict[str, Any] = {}
        for field in ("where", "metadata", "key", "order_by", "dedup_on"):
            value = getattr(self, field)
            if value is not None:
                out[field] = value
        if self.order_by is not None:
            out["order_window"] = self.order_window
        return out
