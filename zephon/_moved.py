"""Import paths of modules that moved when the package was split into layers (2026-12) keep working.

``from zephon.sql import connect`` imports ``zephon.inspection.sql``: a finder on ``sys.meta_path`` answers
each old name in ``MOVED`` with the module at its new name (the same module object, so classes and
functions are identical, not copies). New code imports the new names; docs/architecture.md lists them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

MOVED: dict[str, str] = {
    "zephon.audit": "zephon.inspection.audit",
    "zephon.audit_report": "zephon.cli.audit_report",
    "zephon.cli_cache": "zephon.cli.cache_commands",
    "zephon.cli_inspect": "zephon.cli.inspect_commands",
    "zephon.executor.engine": "zephon.specs",
    "zephon.executor.provenance": "zephon.executor.provenance_log",
    "zephon.hf_path": "zephon.storage.hub.paths",
    "zephon.hub": "zephon.storage.hub.client",
    "zephon.hub_discovery": "zephon.storage.hub.discovery",
    "zephon.inspect_views": "zephon.inspection.views",
    "zephon.jsonl_lines": "zephon.storage.jsonl",
    "zephon.plan_diff": "zephon.inspection.diff",
    "zephon.plan_format": "zephon.plan.format",
    "zephon.plan_steps": "zephon.inspection.steps",
    "zephon.planner.lanes": "zephon.planner.lane_dealing",
    "zephon.provenance": "zephon.inspection.log_check",
    "zephon.remote": "zephon.storage.remote",
    "zephon.shard_cache": "zephon.storage.shard_cache",
    "zephon.shard_cache_lock": "zephon.storage.shard_cache_lock",
    "zephon.shard_scan": "zephon.storage.scan",
    "zephon.show": "zephon.inspection.show",
    "zephon.sources": "zephon.storage.local",
    "zephon.sql": "zephon.inspection.sql",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def __init__(self) -> None:
        self._real_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[spec.name])
        self._real_specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module already ran under its new name. The import system has just set its ``__spec__`` to the
        # alias's; put back the real one, so the module keeps one identity (pickling, reload, tracebacks).
        module.__spec__ = self._real_specs[module.__name__]


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
