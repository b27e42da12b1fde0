"""Value checks every layer shares: what a config's number or integer is, and the one-line refusal of a count
that must be at least 1.

A boolean is never a number here (``True`` is an ``int`` to Python, never a count to a user). Example:
``require_positive(0, "read_chunk")`` raises ``ConfigError("read_chunk must be an integer ≥ 1, got 0")``;
``require_positive(0, "window", unit="steps", fix="pass e.g. --window 100")`` says
``window must be an integer ≥ 1 (steps), got 0 — pass e.g. --window 100``. A switch must be a real boolean:
``require_bool("no", "drop_last")`` refuses the string a config file left quoted, which Python reads as true.
NumPy scalars are numbers too: ``plain_numbers`` turns a spec's ``np.int64(50)`` into ``50`` before it is checked
(and hashed into a plan's config), as a budget computed with NumPy arrives. A folder Zephon writes to (a plan's
``out_dir``, ``provenance_dir``, ``CacheOptions.root``) must be a local directory's path: ``local_directory``.

A size in bytes (``size_bytes``, every ``ZEPHON_*_MEMORY`` setting) reads its unit as DuckDB does, so that one
text means one number of bytes in the planner and the executor: SI units are powers of 1000 with or without the
``B`` (``2GB`` = ``2G`` = 2 × 10^9), IEC units powers of 1024 (``2GiB`` = 2^31), no unit or ``B`` bytes; case and
spaces ignored. Example: ``size_bytes("1.5 GiB")`` is 1,610,612,736, ``size_bytes("512MB")`` 512,000,000,
``size_bytes("lots")`` None.
"""

from __future__ import annotations

import math
import os
import re
from decimal import Decimal

import numpy as np

from zephon.errors import ConfigError


def is_int(value: object) -> bool:
    """An ``int`` that is not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object, *, finite: bool = False) -> bool:
    """An ``int``, ``float`` or ``Decimal`` that is not a boolean (and, with ``finite``, not inf or NaN)."""
    if not isinstance(value, int | float | Decimal) or isinstance(value, bool):
        return False
    return not finite or math.isfinite(value)


def require_positive(value: object, name: str, *, unit: str = "", fix: str = "", optional: bool = False) -> None:
    """Raise ``ConfigError`` unless ``value`` is an integer ≥ 1 (or None, when ``optional``)."""
    if optional and value is None:
        return
    if not is_int(value) or value < 1:  # type: ignore[operator]
        what = f"an integer ≥ 1{f' ({unit})' if unit else ''}{' or None' if optional else ''}"
        raise ConfigError(f"{name} must be {what}, got {value!r}{f' — {fix}' if fix else ''}")


def require_bool(value: object, name: str, *, optional: bool = False) -> None:
    """Raise ``ConfigError`` unless ``value`` is ``True`` or ``False`` (or None, when ``optional``): a string such
    as ``"false"`` is true to Python and would silently turn the switch on."""
    if (optional and value is None) or isinstance(value, bool | np.bool_):
        return
    what = "True or False" + (" (or None)" if optional else "")
    raise ConfigError(f"{name} must be {what}, got {value!r} ({type(value).__name__}) — pass a boolean")


def plain(value: object) -> object:
    """``value`` with a NumPy scalar made the Python number it stands for (``np.int64(5)`` → ``5``); else as is."""
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def plain_numbers(spec: object, *names: str) -> None:
    """Replace the NumPy scalars among ``spec``'s attributes ``names`` with Python numbers (frozen dataclasses
    too), so that every later check, comparison and JSON dump sees an ``int``/``float``/``bool``."""
    for name in names:
        value = getattr(spec, name)
        if isinstance(value, np.generic):
            object.__setattr__(spec, name, plain(value))


def local_directory(path: object, name: str, *, example: str, remote_fix: str, file_ok: bool = False) -> str:
    """``path`` as a local directory's path (a ``str`` or ``os.PathLike``), else one ``ConfigError``: empty or blank
    (it would be the working directory, or a folder named by spaces), a URL (``s3://b/x`` would become a local
    folder named ``s3:``; ``remote_fix`` says what to do instead), a file (unless ``file_ok``: the caller words it).
    ``example`` is a path to suggest. Example: ``local_directory("", "provenance_dir", example="'logs/run1'",
    remote_fix=...)`` → ``provenance_dir must name a local directory, got '' — pass a path such as 'logs/run1'``."""
    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise ConfigError(f"{name} must name a local directory, got {path!r} — pass a path such as {example}")
    text = str(os.fspath(path))
    if "://" in text:
        raise ConfigError(f"{name} must be a local directory, got {text!r} — {remote_fix}")
    if not file_ok and os.path.exists(text) and not os.path.isdir(text):
        raise ConfigError(f"{name} must be a directory, got a file at {text!r} — choose another {name}")
    return text


#: ``size_bytes``' units: SI (powers of 1000, as DuckDB's ``memory_limit``: ``GB`` and ``G`` alike), IEC (1024).
SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
              "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([a-z]*)")


def size_bytes(value: str) -> int | None:
    """``value`` as a number of bytes (see the module docstring: ``2GB``, ``512MiB``, ``1.5G``, ``1000000``), or
    None when it is not a size."""
    found = _SIZE.fullmatch(value.strip().lower().replace(" ", ""))
    if found is None or found.group(2) not in SIZE_UNITS:
        return None
    return int(float(found.group(1)) * SIZE_UNITS[found.group(2)])


def size_setting(name: str, value: str, words: dict[str, int | None], example: str) -> int | None:
    """Setting ``name``'s ``value``: one of ``words`` (their values), else a size in bytes (``size_bytes``);
    anything else refused in one line naming the words and ``example``."""
    text = value.strip()
    if text.lower() in words:
        return words[text.lower()]
    size = size_bytes(text)
    if size is None:
        listed = " or ".join(f'"{word}"' for word in words)
        named = f", or {listed}" if words else ""
        raise ConfigError(
            f"{name} must be a size such as {example} (GB = 10^9 bytes, GiB = 2^30){named}, got {text!r} — "
            "unset it or set one"
        )
    return size
