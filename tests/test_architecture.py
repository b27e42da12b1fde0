"""docs/architecture.md's folder drawing matches the source tree: every package is drawn, every drawn folder is one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("zephon", "planner", "executor")


def drawn() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("The folders, each a package", 1)[1].split("```", 2)[1]
    out: set[str] = set()
    stack: list[str] = []
    for line in block.splitlines():
        match = re.match(r"^( *)([a-z_]+)/ ", line + " ")
        if not match:
            continue
        depth = len(match.group(1)) // 2
        stack[depth:] = [match.group(2)]
        out.add("/".join(stack))
    return out


def packages() -> set[str]:
    found = set()
    for top in TOPS:
        for init in (ROOT / top).rglob("__init__.py"):
            if "__pycache__" not in init.parts and "assets" not in init.parts:
                found.add(init.parent.relative_to(ROOT).as_posix())
    return found


def test_the_folder_drawing_is_the_package_tree() -> None:
    assert drawn() == packages()


def test_no_module_is_over_400_lines_without_a_reason_at_its_top() -> None:
    """A module past 400 lines says why in its docstring's first lines (``Over 400 lines: ...``)."""
    long = []
    for top in TOPS:
        for module in (ROOT / top).rglob("*.py"):
            lines = module.read_text(encoding="utf-8").splitlines()
            if len(lines) > 400 and not any("Over 400 lines" in line for line in lines[:30]):
                long.append(f"{module.relative_to(ROOT)} ({len(lines)} lines)")
    assert long == []
