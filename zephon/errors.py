"""Error types raised by Zephon, and the warnings it issues (``ZephonWarning``, ``PlanWarning``).

Every message says what is wrong, where (dataset, shard, row, file) and how to fix it, in the form
"X must be Y, got Z — fix". Callers catch :class:`ZephonError`; the CLI prints its message on one line.
"""

from __future__ import annotations

import sys
import warnings


class ZephonError(Exception):
    """Base class of every error Zephon raises on purpose."""


class ConfigError(ZephonError, ValueError):
    """A configuration value (Python argument or CONFIG file entry) is invalid."""


class DatasetError(ZephonError):
    """A dataset path, shard or row cannot be used as given."""


class PlanFormatError(ZephonError):
    """A plan bundle is missing, malformed, or of an unsupported format version."""


class HubError(ZephonError):
    """A Hugging Face Hub dataset cannot be resolved or read."""


class TokenizerError(ZephonError):
    """A tokenizer cannot be loaded or lacks what the pipeline needs."""


class StorageError(ZephonError):
    """A cache or output directory cannot be written: disk full, read-only file system, permission denied."""


class WorkerLost(ZephonError, RuntimeError):
    """A DataLoader worker of ``Pipeline.dataloader()`` died (a signal, the out-of-memory killer) or gave no piece
    within the loader's ``timeout``: the loader's state is still the last batch handed out, and iterating it again
    resumes right after that batch (docs/training.md, "When a worker dies"). A ``RuntimeError``, as torch's own."""


#: How a refused checkpoint state is fixed (``zephon.executor.state`` and the lanes it resumes).
STATE_FIX = "fix the state file, or save it again with json.dump(pipeline.state_dict())"


class ZephonWarning(UserWarning):
    """Base class of every warning Zephon issues with ``warnings.warn`` (filter it like any warning)."""


class PlanWarning(ZephonWarning):
    """A plan falls short of its budget or repeats a dataset heavily: plan.json ``warnings`` (docs/plans.md).

    ``warnings.filterwarnings("error", category=zephon.PlanWarning)`` turns such a plan into an error.
    """


class ShortRunWarning(ZephonWarning):
    """An estimated run ended with tokens still in its packing lanes: the length it measured (``num_steps()``) fell
    short of its data, and those tokens were not trained on (``stats().lanes_cut``; docs/training.md, "Known
    length")."""


def warn(message: str, category: type[Warning] = ZephonWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first caller outside Zephon, so the line shown
    (and a filter by module) is the user's code, not Zephon's."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] == "zephon":
        level, frame = level + 1, frame.f_back  # type: ignore[assignment]
    warnings.warn(message, category, stacklevel=level)


def one_line(exc: BaseException | str) -> str:
    """An error message on one printable line: the one formatter of every message Zephon prints.

    Arrow and Thrift messages span lines and carry raw bytes; DuckDB's point at the error with a line of
    carets (``"...\n\nLINE 1: SELEC 1\n        ^^^^^"``). The words are kept, the caret lines dropped,
    white space folded and unprintable characters shown as ``?``.
    """
    lines = [line for line in str(exc).splitlines() if set(line.strip()) != {"^"}]
    text = " ".join(" ".join(lines).split())
    if not text and isinstance(exc, BaseException):
        text = type(exc).__name__
    return "".join(c if c.isprintable() else "?" for c in text)
