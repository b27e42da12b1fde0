"""docs/token-stores.md's example runs against the committed fixtures and prints what the page shows."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run_block(index: int, monkeypatch, capsys) -> None:
    """Run the page's ``index``-th runnable Python block; it prints what its ``# `` lines show."""
    page = (ROOT / "docs" / "token-stores.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "print(" in b]
    block = blocks[index]
    monkeypatch.chdir(ROOT)
    exec(compile(block, "docs/token-stores.md", "exec"), {})
    shown = [line.split("#", 1)[1].split("←")[0].strip() for line in block.splitlines() if line.startswith("# ")]
    assert capsys.readouterr().out.splitlines() == shown


def test_the_readers_example_prints_what_the_page_shows(monkeypatch, capsys) -> None:
    run_block(0, monkeypatch, capsys)


def test_the_worked_mixed_plan_prints_what_the_page_shows(monkeypatch, capsys) -> None:
    run_block(1, monkeypatch, capsys)
