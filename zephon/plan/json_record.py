"""A JSON record: a frozen dataclass whose fields are the keys of one JSON object, read and written by one
declaration (the plan.json schema, ``zephon.plan.manifest``, is made of them).

Each field is declared ``key(value)``: ``value`` (a ``zephon.plan.json_fields.Value``) says what the key must
hold and what its absence means, and the field's default is that meaning. ``read_record(cls, o)`` reads a
``JsonObject`` into ``cls`` (one-line errors naming the file and the key); ``to_json_value(record)`` writes it
back as plain JSON values, keys in field order: a required key always; an optional key only when it holds
something other than its default, unless it is declared ``always`` (then written, as null when ``None``).

Invariant: for an object written by this rule, ``to_json_value(read_record(cls, o)) == o``, key order
included — plan.json reads back and writes out byte for byte (``Manifest.from_json(text).to_json() == text``).
Example::

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Counts:
        documents: int = key(COUNT)
        tokens: int | None = key(COUNT.optional())
        unit: str | None = key(TEXT.optional(), always=True)

    Counts(documents=3)             → {"documents": 3, "unit": null}
    Counts(documents=3, tokens=40)  → {"documents": 3, "tokens": 40, "unit": null}
    {"documents": 3} read           → Counts(documents=3, tokens=None, unit=None)

Fields without a ``key`` declaration are written always (``zephon.plan.integrity``'s records, read by their
own parser).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

from zephon.plan.json_fields import JsonObject, Value, list_of, nested

__all__ = ["key", "read_record", "record", "records", "to_json_value"]

R = TypeVar("R")

_KEY = "zephon.plan.json_record"


@dataclass(frozen=True, slots=True)
class _Key:
    value: Value
    always: bool

    def left_out(self, got: object) -> bool:
        """Whether an optional key holding ``got`` is not written (it holds what its absence reads as)."""
        if self.value.required or self.always:
            return False
        default = self.value.default
        return got is default or (type(got) is type(default) and got == default)


def key(value: Value, *, always: bool = False) -> Any:
    """A record field that is the JSON key of its name, read by ``value`` (see the module docstring): required,
    or optional with ``value.default`` as the field's default; ``always``: written even when it holds that."""
    meta = {_KEY: _Key(value, always)}
    if value.required:
        return field(metadata=meta)
    default = value.default
    if default is None or isinstance(default, str | int | float | tuple):
        return field(default=default, metadata=meta)
    return field(default_factory=lambda: default, metadata=meta)


def read_record(cls: type[R], o: JsonObject) -> R:
    """The ``cls`` record of the JSON object ``o``: every ``key`` field read and checked (unknown keys ignored)."""
    values = {f.name: f.metadata[_KEY].value for f in fields(cls) if _KEY in f.metadata}  # type: ignore[arg-type]
    return cls(**o.read(**values))


def record(cls: type[Any], parse: Callable[[JsonObject], Any] | None = None) -> Value:
    """A JSON object read as a ``cls`` record (by ``parse``, when it checks more than the keys)."""
    return nested(parse or (lambda o: read_record(cls, o)))


def records(cls: type[Any], parse: Callable[[JsonObject], Any] | None = None) -> Value:
    """A list of JSON objects read as ``cls`` records, as a tuple."""
    return list_of(parse or (lambda o: read_record(cls, o)))


def to_json_value(value: object) -> Any:
    """``value`` as plain JSON values: records as objects (see the module docstring), mappings as objects,
    tuples as lists; anything else as it is."""
    if is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in fields(value):
            got = getattr(value, f.name)
            declared = f.metadata.get(_KEY)
            if declared is None or not declared.left_out(got):
                out[f.name] = to_json_value(got)
        return out
    if isinstance(value, Mapping):
        return {name: to_json_value(v) for name, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(v) for v in value]
    return value
