"""The notebooks under notebooks/ run from top to bottom (offline, in a temporary working directory)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _run(name: str, cwd: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return notebook


def _text(notebook: nbformat.NotebookNode) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", "") + str(output.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def test_inspect_curriculum_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ZEPHON_DEMO_DIR", str(tmp_path / "demo"))
    notebook = _run("inspect_curriculum.ipynb", tmp_path)
    assert (tmp_path / "plans" / "demo" / "plan.json").is_file()
    assert (tmp_path / "demo").is_dir()
    text = _text(notebook)
    assert "audit plans/demo: tokens (exact) per window of 50 steps" in text
    assert "step 100 of " in text and "(exact wrap, 257 tokens per sequence; batch 8)" in text
    outputs = [o for c in notebook.cells for o in c.get("outputs", [])]
    assert "error" not in {o.get("output_type") for o in outputs}
    assert any("image/png" in o.get("data", {}) for o in outputs), "the share plot must be displayed"
