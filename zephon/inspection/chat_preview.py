"""Records as ``zephon show`` previews them: a text field as it is, a conversation turn by turn.

A chat plan's documents are records, not strings: a ``messages`` list of ``{role, content}``, a ShareGPT
``conversations`` list of ``{from, value}``, or alpaca columns ``instruction`` / ``input`` / ``output``.
``holds_records(refs, field)`` says when to read records rather than strings: the field is a chat layout's
column (``messages``, ``conversations``, ``instruction``: ``zephon.specs.CHAT_FIELDS``) or, in a local Parquet
shard, a list column. ``record_text(field)`` returns the function the shard reader applies to each record (record
mode of ``zephon.executor.read.shard_reader``): it recognizes the layout by the record's shape (plan.json does not name
it, and a plan without a tokenizer does not even name the field) and writes each turn as ``role: content``
on its own line, with the roles of ``zephon.executor.encode.chat_render.to_messages`` (ShareGPT ``gpt`` →
``assistant``).

Worked example: ``{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo!"}]}``
with field ``conversations`` previews as ``user: Hi⏎assistant: Yo!``; an alpaca row ``{"instruction": "Say 1",
"input": "", "output": "One."}`` with field ``instruction`` as ``user: Say 1⏎assistant: One.``. A record that
is no conversation is shown as ``<not a conversation: …>`` (show never fails on one bad row). User operators
are not applied: the preview is the record as stored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from zephon.executor.encode.chat_render import BadRecord, to_messages
from zephon.executor.encode.encoders import RecordConverter
from zephon.plan.records import ShardRef
from zephon.specs import CHAT_FIELDS, ChatSpec

__all__ = ["ALPACA_COLUMNS", "holds_records", "record_reader", "record_text"]

#: Columns read beside the field, so an alpaca row (field ``instruction``) can be shown whole.
ALPACA_COLUMNS = ("input", "output")


def holds_records(refs: Sequence[ShardRef], field: str) -> bool:
    """Whether ``field`` holds conversations: a chat layout's column name, or a list column of a local Parquet
    shard (other fields are read as text, with the text field's errors)."""
    if field in CHAT_FIELDS.values():
        return True
    for ref in refs:
        if ref.format == "parquet" and os.path.isfile(ref.uri):
            schema = pq.read_schema(ref.uri)
            if field in schema.names:
                kind = schema.field(field).type
                return pa.types.is_list(kind) or pa.types.is_large_list(kind)
    return False


def _layout(value: object, record: dict[str, Any], field: str) -> str | None:
    """The chat layout the record has under ``field``, or None for text."""
    if isinstance(value, list):
        first = value[0] if value else None
        return "sharegpt" if isinstance(first, dict) and "from" in first else "messages"
    if field == "instruction" and isinstance(value, str) and "output" in record:
        return "alpaca"
    return None


def record_text(field: str) -> Callable[[dict[str, Any]], str]:
    """The preview text of a record read in record mode: its ``field`` string, or its conversation."""

    def text(record: dict[str, Any]) -> str:
        value = record.get(field)
        layout = _layout(value, record, field)
        if layout is None:
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        try:
            messages = to_messages(record, ChatSpec(layout=layout), field)
        except BadRecord as exc:
            return f"<not a conversation: {exc.expected}>"
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages)

    return text


def record_reader(field: str) -> RecordConverter:
    """The shard reader's converter for previews: ``field`` (required) and the alpaca columns where they exist."""
    return RecordConverter(columns=(field, *ALPACA_COLUMNS), required=(field,), final=record_text(field))
