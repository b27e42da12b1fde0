"""docs/token-stores.md's example runs against the committed fixtures and prints what the page shows."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_readers_example_prints_what_the_page_shows(monkeypatch, capsys) -> None:
    page = (ROOT / "docs" / "token-stores.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    monkeypatch.chdir(ROOT)
    exec(compile(block, "docs/token-stores.md", "exec"), {})
    shown = [line.split("#", 1)[1].split("←")[0].strip() for line in block.splitlines() if line.startswith("# ")]
    assert capsys.readouterr().out.splitlines() == shown
