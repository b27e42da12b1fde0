"""A cost computed by a planning pass: ``cost=computed_cost("mypkg.costs:image_cost")`` (docs/records.md).

Some costs need the sample's bytes decoded — an image's patch count needs its width and height from the JPEG
header, a caption's token count needs a tokenizer — which a DuckDB expression over columns cannot do. A
``ComputedCost`` names a Python function by import path; the planner's computed pass
(``zephon.planner.counts.computed``) calls it on every sample of every shard, as a record pipeline would see the
sample *before* its operators (a tar sample's dict of member bytes keyed by extension plus ``__key__``; a
Parquet row's or JSONL object's columns; an MDS sample's decoded values), and keeps one array per shard in
``$ZEPHON_CACHE_DIR/computed-costs``, keyed by the shard's fingerprint and the function's identity (its import
path and a SHA-256 of its source), so an edited function is computed again.

This module is configuration only: the function is imported by the planner, never here (a recipe can be built
on a machine that lacks the function's package; the plan cannot).

``expression``: the computed value as one more column, ``computed``, of the dataset's DuckDB ``cost=``
expression (``zephon.planner.costs``), beside the sample's columns and a sidecar's:
``computed_cost("mypkg.costs:patches", expression="computed + text_tokens")``. Without it the cost is the
computed value itself.

Worked example: ``image_cost(sample)`` returning ``ceil(w / 14) * ceil(h / 14) + len(sample["txt"]) / 4`` on a
sample of a 28 × 14 JPEG and a 10-byte caption gives 2 + 2.5 = 4.5, planned as cost 5 (rounded up).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from zephon.errors import ConfigError

__all__ = ["COMPUTED_COLUMN", "ComputedCost", "computed_cost"]

#: The column a ``ComputedCost.expression`` reads the computed value from.
COMPUTED_COLUMN = "computed"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
_PATH = re.compile(rf"^{_NAME}:{_NAME}$")


@dataclass(frozen=True, kw_only=True, slots=True)
class ComputedCost:
    """A sample's cost computed by a Python function at plan time.

    Attributes:
        function: ``"module.path:name"`` — the function, importable by the planner (and by its worker processes
            and Ray tasks), called as ``function(sample) -> number``.
        expression: a DuckDB expression over ``computed`` (the function's value) and the sample's or sidecar's
            columns; None: the cost is the function's value.
    """

    function: str
    expression: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.function, str) or not _PATH.match(self.function):
            raise ConfigError(
                f"computed_cost function must be an import path 'module.path:name', got {self.function!r} — write "
                'e.g. computed_cost("mypkg.costs:image_cost")'
            )
        if self.expression is not None and (not isinstance(self.expression, str) or not self.expression.strip()):
            raise ConfigError(
                f"computed_cost expression must be a non-empty DuckDB expression over {COMPUTED_COLUMN!r}, got "
                f'{self.expression!r} — write e.g. expression="{COMPUTED_COLUMN} + text_tokens" or leave it out'
            )

    def normalized(self) -> dict[str, Any]:
        """The CONFIG form (``cost: {function: ..., expression: ...}``), the expression only when set."""
        out: dict[str, Any] = {"function": self.function}
        if self.expression is not None:
            out["expression"] = self.expression
        return out


def computed_cost(function: str, *, expression: str | None = None) -> ComputedCost:
    """``Dataset.from_path(..., cost=computed_cost("mypkg.costs:image_cost"))``: see ``ComputedCost``."""
    return ComputedCost(function=function, expression=expression)
