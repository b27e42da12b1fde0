"""Check the import contracts in pyproject.toml (import-linter) on the package as it installs.

``zephon.planner`` and ``zephon.executor`` live in the top-level folders ``planner/`` and ``executor/``
(setuptools ``package-dir``); import-linter finds a package's modules by walking its directory, so on an
editable install it would not see them. This script lays the package out as a wheel would — ``zephon/`` with
``planner/`` and ``executor/`` copied in under their installed names — in a temporary directory, and runs
``lint-imports`` on that copy. Exit status: lint-imports'.

    python scripts/lint_imports.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    with tempfile.TemporaryDirectory(prefix="zephon-lint-") as tmp:
        for package, folder in sorted(package_dir.items()):  # "zephon" sorts before "zephon.executor"
            shutil.copytree(ROOT / folder, Path(tmp, *package.split(".")), ignore=shutil.ignore_patterns("__pycache__"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")])}
        lint = shutil.which("lint-imports") or "lint-imports"
        return subprocess.run([lint, str(ROOT / "pyproject.toml")], env=env, cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main())
