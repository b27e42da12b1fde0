"""The README's first command runs the quickstart: it must print the documented snippet's shapes, offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quickstart_prints_the_seed_shapes(tmp_path) -> None:
    env = {**os.environ, "ZEPHON_DEMO_DIR": str(tmp_path / "demo"), "ZEPHON_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "quickstart.py")], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout == "torch.Size([8, 2048]) torch.Size([8, 2048])\n"


def test_readme_commands_are_the_ones_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    test_command = next(line for line in readme.splitlines() if line.startswith("pip install") and "pytest" in line)
    assert test_command in ci
    assert any(line.startswith("pip install") and "examples/quickstart.py" in line for line in readme.splitlines())
