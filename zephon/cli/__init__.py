"""The ``zephon`` command line (``zephon.cli.app``); ``zephon.cli:main`` is the console script."""

from zephon.cli.app import cli, main

__all__ = ["cli", "main"]
