"""plan.json: reading and validating the bundle's manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zephon.errors import PlanFormatError
from zephon.plan.format import FORMAT_VERSION, PLAN_JSON


def read_manifest(plan_dir: str | Path) -> dict[str, Any]:
    """Read and validate ``plan.json`` of a bundle; refuse unknown format versions."""
    path = Path(plan_dir) / PLAN_JSON
    if not path.is_file():
        raise PlanFormatError(
            f"plan directory must contain {PLAN_JSON}, got none at {path} — "
            "pass a directory written by `zephon plan` or Pipeline.plan()"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PlanFormatError(f"{path} must be valid JSON, got {exc} — rewrite the plan with `zephon plan`") from exc
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != FORMAT_VERSION:
        raise PlanFormatError(
            f"plan format version must be {FORMAT_VERSION}, got {version!r} in {path} — "
            "re-plan with this Zephon version, or install the version that wrote the plan"
        )
    for key in ("config_hash", "datasets", "totals"):
        if key not in manifest:
            raise PlanFormatError(f"{path} must have the key {key!r}, got none — the bundle is damaged; re-plan")
    return manifest


def manifest_phases(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """``plan.json`` ``phases``; for a plan without phases, one phase 0 spanning the plan with the mixture's
    weights (the same keys: ``index``, ``first_position``, ``end_position``, ``weights``, ``planned_documents``
    and, with token counts, ``planned_tokens``)."""
    if manifest.get("phases"):
        return list(manifest["phases"])
    entries = manifest["datasets"]
    tokens = {d["name"]: d["planned_tokens"] for d in entries if "planned_tokens" in d}
    return [
        {
            "index": 0,
            "first_position": 0,
            "end_position": manifest["totals"]["documents"],
            "weights": {d["name"]: d["weight"] for d in entries},
            "planned_documents": {d["name"]: d["planned_documents"] for d in entries},
            **({"planned_tokens": tokens} if tokens else {}),
        }
    ]
