"""Run a docs page's first ```python block under a heading, and what it shows as ``# `` comment lines.

A page's worked example prints lines and shows them as comments at its end (``# [4, 11, 1]``); the tests run the
block as written (``exec``) and compare what it printed with those comments.
"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_block(page: str, heading: str) -> str:
    """The first ```python block after ``heading`` in ``docs/page``."""
    section = (DOCS / page).read_text(encoding="utf-8").split(heading, 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, f"docs/{page}: no python block after {heading!r}"
    return found.group(1)


def run_block(page: str, heading: str, *, shown_prefix: str = "# ") -> list[str]:
    """Run the block (``python_block``) and return the lines it shows: its comment lines starting with
    ``shown_prefix``, without the ``# ``."""
    block = python_block(page, heading)
    exec(compile(block, f"<docs/{page}: {heading}>", "exec"), {})
    return [line.removeprefix("# ") for line in block.splitlines() if line.startswith(shown_prefix)]
