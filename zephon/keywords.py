"""Unknown keyword arguments of the documented API, refused in one line that names the closest known one.

Python's own ``TypeError: batch() got an unexpected keyword argument 'micro_batch_size'`` names the typo but not
the word meant, and a CONFIG file's unknown key already gets a suggestion (``zephon.recipe.config_sections``).
``known_keywords`` gives the Python API the same: it wraps a function — or a class's ``__init__``, for the
dataclasses users construct — so that a keyword the signature lacks is a ``ConfigError`` before the call.
A function taking ``**kwargs`` is left as it is (it checks its own).

Example: ``Pipeline(...).batch(micro_batch_size=8)`` raises ``Pipeline.batch() keywords must be among
microbatch_size, global_batch_size, drop_last, collate, got unknown `micro_batch_size` (did you mean
`microbatch_size`?) — fix the spelling or remove it``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from zephon.errors import ConfigError

__all__ = ["did_you_mean", "known_keywords", "unknown_keyword"]

T = TypeVar("T")

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def did_you_mean(key: str, allowed: Sequence[str]) -> str:
    """`` (did you mean `x`?)`` naming the one of ``allowed`` closest to ``key``, or nothing: the hint of every
    unknown keyword and CONFIG key."""
    close = difflib.get_close_matches(str(key), allowed, n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""


def unknown_keyword(name: str, key: str, allowed: list[str]) -> ConfigError:
    """The error for keyword ``key`` that ``name()`` does not take (``allowed``: the ones it does)."""
    return ConfigError(
        f"{name}() keywords must be among {', '.join(allowed)}, got unknown `{key}`{did_you_mean(key, allowed)} — "
        "fix the spelling or remove it"
    )


def known_keywords(target: T) -> T:
    """``target`` (a function, or a class whose ``__init__`` is checked, named after the instance's class) refusing
    keywords its signature lacks (see the module docstring)."""
    if isinstance(target, type):
        target.__init__ = _checked(target.__init__, lambda args: type(args[0]).__name__)  # type: ignore[misc]
        return target
    name = target.__qualname__  # type: ignore[attr-defined]
    return _checked(target, lambda args: name)  # type: ignore[arg-type, return-value]


def _checked(fn: Callable[..., Any], name_of: Callable[[tuple[Any, ...]], str]) -> Callable[..., Any]:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return fn
    allowed = [p.name for p in params if p.kind in _NAMED and p.name not in ("self", "cls")]
    known = frozenset(allowed)

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for key in kwargs:
            if key not in known:
                raise unknown_keyword(name_of(args), key, allowed)
        return fn(*args, **kwargs)

    return checked
