"""Zephon: deterministic plans for training data, executed as token batches.

Public API: ``zephon.Pipeline``; datasets and storage options in ``zephon.io``; work sources in
``zephon.work``. Names are imported lazily so that ``import zephon`` stays light on training nodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zephon.errors import (
    ConfigError,
    DatasetError,
    HubError,
    PlanFormatError,
    PlanWarning,
    ShortRunWarning,
    TokenizerError,
    ZephonError,
    ZephonWarning,
)

if TYPE_CHECKING:
    from zephon.executor.batch import Batch
    from zephon.executor.state import merge_states
    from zephon.pipeline import Pipeline

__all__ = [
    "Batch",
    "ConfigError",
    "DatasetError",
    "HubError",
    "Pipeline",
    "PlanFormatError",
    "PlanWarning",
    "ShortRunWarning",
    "TokenizerError",
    "ZephonError",
    "ZephonWarning",
    "merge_states",
]


def __getattr__(name: str) -> Any:
    if name == "Pipeline":
        from zephon.pipeline import Pipeline

        return Pipeline
    if name == "merge_states":
        from zephon.executor.state import merge_states

        return merge_states
    if name == "Batch":
        from zephon.executor.batch import Batch

        return Batch
    raise AttributeError(f"module 'zephon' has no attribute {name!r}")
