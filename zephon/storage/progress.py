"""Progress bars for long steps: one rule says whether a bar is drawn, tqdm draws it.

Every step that can take more than a few seconds — scanning shards, sizing documents and calibrating token
estimates, the count pass, listing and downloading Hub files — reports through :func:`progress_bar` (or
:func:`track` for a loop), and :func:`show_progress` alone decides whether anything appears:

* ``progress=False``: never; ``progress=True``: always (``zephon count --progress``);
* ``progress=None``, the default of every API that takes it: only when stderr is a terminal, and not in CI
  (``CI`` set to anything but ``0``/``false``), not under pytest (``PYTEST_CURRENT_TEST``), not when
  ``TERM=dumb``. ``ZEPHON_PROGRESS=0`` turns bars off and ``ZEPHON_PROGRESS=1`` on, for callers that cannot
  pass ``progress`` (``Pipeline(work_source)`` plans on first iteration).

A shown bar goes to stderr, appears only once its step has run :data:`DELAY_S` seconds (so quick steps print
nothing, even on a terminal) and is erased when the step ends, so what a command prints is the same with or
without bars. Bars only observe: they never change what is read, computed or written.

Example: ``with progress_bar(total=len(files), desc="scanning shards", unit="shard") as bar:`` then
``bar.update(1)`` per file; off a terminal the same code runs with a disabled bar that prints nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

from zephon.errors import ConfigError

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["DELAY_S", "ENV_VAR", "progress_bar", "show_progress", "track"]

#: Seconds a step runs before its bar appears.
DELAY_S = 2.0
#: ``0`` turns bars off, ``1`` on, wherever ``progress`` is left at ``None``.
ENV_VAR = "ZEPHON_PROGRESS"

_T = TypeVar("_T")
_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def show_progress(progress: bool | None = None) -> bool:
    """Whether to draw progress bars: ``progress`` when it is a bool, else the rule of the module docstring."""
    if progress is not None:
        if not isinstance(progress, bool):
            raise ConfigError(f"progress must be True, False or None, got {progress!r} — pass a bool or leave it out")
        return progress
    env = os.environ.get(ENV_VAR, "").strip().lower()
    if env in _OFF:
        return False
    if env in _ON:
        return True
    if os.environ.get("PYTEST_CURRENT_TEST") or os.environ.get("TERM") == "dumb":
        return False
    if os.environ.get("CI", "").strip().lower() not in ("", *_OFF):
        return False
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


def progress_bar(
    *,
    total: float | None,
    desc: str,
    unit: str = "it",
    progress: bool | None = None,
    unit_scale: bool = False,
) -> tqdm:
    """A tqdm bar on stderr, disabled (a no-op that prints nothing) unless :func:`show_progress` says to draw.

    ``total=None`` counts without a total (e.g. files listed page by page); ``unit_scale=True`` prints bytes
    as ``12.3MB``. Use it as a context manager, or call ``close()``.
    """
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=unit_scale,
        unit_divisor=1024 if unit_scale else 1000,
        disable=not show_progress(progress),
        delay=DELAY_S,
        leave=False,
        file=sys.stderr,
        dynamic_ncols=True,
    )


def track(
    items: Iterable[_T], *, total: int | None, desc: str, unit: str = "it", progress: bool | None = None
) -> Iterator[_T]:
    """Yield ``items`` unchanged, advancing a :func:`progress_bar` by one per item; the bar closes at the end
    (or when the loop is left early)."""
    with progress_bar(total=total, desc=desc, unit=unit, progress=progress) as bar:
        for item in items:
            yield item
            bar.update(1)
