"""Reading a JSON file key by key with one-line errors: the checks ``zephon.plan.manifest`` parses plan.json with.

``JsonObject(value, file).read(name=TEXT, count=COUNT.optional(), ...)`` returns the values of those keys,
checked and converted, under the same names (so they pass straight to a dataclass of the same field names).
A missing required key or a value of the wrong type raises ``PlanFormatError``, one line naming the file
and the dotted key::

    /plans/a/plan.json key 'totals.documents' must be an integer ≥ 0, got '12' — the bundle is damaged; re-plan
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from zephon.checks import is_int, is_number
from zephon.errors import PlanFormatError

__all__ = [
    "COUNT",
    "FLAG",
    "INT",
    "NAME",
    "NUMBER",
    "POSITIVE",
    "TEXT",
    "JsonObject",
    "Value",
    "json_mapping",
    "list_of",
    "mapping_of",
    "nested",
    "one_of",
    "texts",
]

_FIX = "the bundle is damaged; re-plan"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True, slots=True)
class Value:
    """How to read one key: what it must be (for the message), a test, a conversion and what absence means.

    A required key must be present and not null, unless ``nullable`` (present, possibly null); an optional
    key that is absent or null reads as ``default``.
    """

    want: str
    test: Callable[[Any], bool]
    make: Callable[[Any, str, Path], Any] = lambda value, where, file: value
    required: bool = True
    nullable: bool = False
    default: Any = None

    def optional(self, default: Any = None) -> Value:
        return replace(self, required=False, default=default)

    def or_null(self) -> Value:
        return replace(self, nullable=True)


INT = Value("an integer", is_int)
COUNT = Value("an integer ≥ 0", lambda v: is_int(v) and v >= 0)
POSITIVE = Value("an integer ≥ 1", lambda v: is_int(v) and v >= 1)
NUMBER = Value("a number", is_number, lambda v, where, file: float(v))
TEXT = Value("a string", lambda v: isinstance(v, str))
NAME = Value("a non-empty string", lambda v: isinstance(v, str) and bool(v))
FLAG = Value("true or false", lambda v: isinstance(v, bool))


def one_of(*choices: str) -> Value:
    return Value(f"one of {', '.join(map(repr, choices))}", lambda v: isinstance(v, str) and v in choices)


def texts() -> Value:
    """A non-empty list of strings, as a tuple."""
    return Value(
        "a non-empty list of file names",
        lambda v: isinstance(v, list) and bool(v) and all(isinstance(s, str) and s for s in v),
        lambda v, where, file: tuple(v),
    )


def nested(parse: Callable[[JsonObject], Any]) -> Value:
    """A JSON object, parsed by ``parse``."""
    return Value("an object", lambda v: isinstance(v, dict), lambda v, where, file: parse(JsonObject(v, file, where)))


def list_of(parse: Callable[[JsonObject], Any]) -> Value:
    """A list of JSON objects, each parsed by ``parse``, as a tuple."""
    return Value(
        "a list of objects",
        lambda v: isinstance(v, list),
        lambda v, where, file: tuple(parse(JsonObject(item, file, f"{where}[{i}]")) for i, item in enumerate(v)),
    )


def mapping_of(values: Value, want: str) -> Value:
    """A JSON object whose every value is read by ``values`` (dataset names to numbers, say), read-only."""

    def make(v: dict[str, Any], where: str, file: Path) -> Any:
        return MappingProxyType(JsonObject(v, file, where).read(**dict.fromkeys(v, values)))

    return Value(want, lambda v: isinstance(v, dict), make)


def json_mapping() -> Value:
    """A JSON object kept as it is (read-only at the top level)."""
    return Value("an object", lambda v: isinstance(v, dict), lambda v, where, file: MappingProxyType(v))


class JsonObject:
    """One JSON object of ``file`` at the dotted key ``where`` ("" for the top level)."""

    def __init__(self, value: object, file: Path, where: str = "") -> None:
        self.file, self.where = file, where
        if not isinstance(value, dict):
            raise self.wrong(where, "an object", value)
        self.data: dict[str, Any] = value

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def wrong(self, where: str, want: str, value: object) -> PlanFormatError:
        what = f"{self.file} key {where!r}" if where else str(self.file)
        return PlanFormatError(f"{what} must be {want}, got {_shown(value)} — {_FIX}")

    def missing(self, where: str, why: str = "") -> PlanFormatError:
        return PlanFormatError(f"{self.file} must have the key {where!r}{why}, got none — {_FIX}")

    def read(self, /, **values: Value) -> dict[str, Any]:
        """The checked, converted values of these keys, under the same names (see the module docstring)."""
        out = {}
        for name, value in values.items():
            where = self.key(name)
            got = self.data.get(name)
            if name not in self.data and value.required:
                raise self.missing(where)
            if got is None and (value.nullable or not value.required):
                out[name] = None if value.nullable else value.default
            elif value.test(got):
                out[name] = value.make(got, where, self.file)
            else:
                raise self.wrong(where, value.want, got)
        return out
