"""Reading one JSONL shard (plain, gzip or zstd): read and decompressed whole, then one line per row.

gzip and zstd streams cannot be sought, so ``JsonlShard`` reads the file's bytes at once and keeps the
decompressed text with the span of every non-empty line (``zephon.storage.jsonl``). It checks the shard when
it is opened, before any row is used — a shard that changed since planning is refused, never read: the
BLAKE2b fingerprint of the file's bytes when the reader asks for it (one hash pass over the bytes read anyway,
~0.9 GB/s on one core), a complete gzip/zstd stream, and the planned row count.

In range mode a plain ``.jsonl`` object whose line index is known is a ``JsonlLines`` instead: only the rows
asked for are fetched, by byte ranges.

A row's text is its JSON object's ``field``; a line that is not UTF-8, not JSON, not an object, lacks the field
or holds no string there is a bad document, handed to the reader's ``BadDocuments`` policy. So is a text that
UTF-8 cannot encode (reason ``not_utf8`` too): JSON's ``"\\ud800"`` escape without its pair parses to a lone
surrogate, which no tokenizer engine takes — the text field's, or in record mode (chat, operators) any string of
the record (``zephon.executor.encode.surrogates``). Only a line holding a ``\\ud``/``\\uD`` escape can give one,
so the others pay one substring search.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import DatasetError, one_line
from zephon.executor.encode.surrogates import lone_surrogate
from zephon.executor.read.bad_documents import FIELD_HINT, BadDocuments, nested_hint
from zephon.plan.records import ShardRef
from zephon.storage.jsonl import decompress, line_spans
from zephon.storage.scan import jsonl_fingerprint


class JsonlShard:
    """One open JSONL shard: its decompressed bytes (``data``) and the ``(starts, ends)`` of its lines."""

    __slots__ = ("_documents", "data", "ref", "spans")

    def __init__(self, ref: ShardRef, path: str | bytes, documents: BadDocuments, *, check_fingerprint: bool) -> None:
        """Read ``path`` (the shard ``ref``, or its cached copy; or the shard's bytes, read from an object store)
        and check it; ``check_fingerprint``: compare the file's bytes with the planned fingerprint too."""
        self.ref = ref
        self._documents = documents
        where = f"dataset {ref.dataset!r}: shard {ref.uri}"
        try:
            raw = path if isinstance(path, bytes) else Path(path).read_bytes()
        except OSError as exc:
            raise DatasetError(f"{where} must be readable, got {exc.strerror or exc} — restore the file") from exc
        if check_fingerprint:
            fingerprint = jsonl_fingerprint(raw)
            if fingerprint != ref.fingerprint:
                raise DatasetError(
                    f"{where} changed since planning: its bytes must match fingerprint {ref.fingerprint}, got "
                    f"{fingerprint} — restore the planned data or re-plan"
                )
        try:
            self.data: bytes = decompress(raw, ref.format)
        except ValueError as exc:
            raise DatasetError(
                f"{where} must be a complete {ref.format} file, got {one_line(exc)} — restore it from its source or "
                "re-export it, then re-plan"
            ) from exc
        self.spans: tuple[np.ndarray, np.ndarray] = line_spans(self.data)
        if len(self.spans[0]) != ref.rows:
            raise DatasetError(
                f"{where} changed since planning: rows (non-empty lines) must be {ref.rows}, got "
                f"{len(self.spans[0])} — restore the planned data or re-plan"
            )

    def read(self, rows: np.ndarray) -> list[Any]:
        """Texts (record mode: converted records) of ``rows``, in the order given; None for a skipped document."""
        starts, ends = self.spans
        data = self.data
        return [self._row(row, data[starts[row] : ends[row]]) for row in rows.tolist()]

    def iter_texts(self, chunk_rows: int) -> Iterator[list[str | None]]:
        """Every text in row order, ``chunk_rows`` rows at a time."""
        count = len(self.spans[0])
        for start in range(0, count, chunk_rows):
            yield self.read(np.arange(start, min(start + chunk_rows, count)))

    def _row(self, row: int, line: bytes) -> Any:
        ref, documents, field = self.ref, self._documents, self._documents.field
        where = f"dataset {ref.dataset!r}: shard {ref.uri} row {row}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            documents.report(
                ref,
                row,
                "not_utf8",
                f"{where} must be UTF-8 text, got byte 0x{line[exc.start]:02x} at byte {exc.start} of the line — "
                "re-encode the file as UTF-8 (e.g. iconv -t utf-8), fix or remove that line",
            )
            return None
        if row == 0 and text.startswith("\ufeff"):  # a UTF-8 byte order mark opens the file
            text = text[1:]
        try:
            record = json.loads(text)
        except ValueError as exc:
            got = (
                f"a line of only whitespace {_excerpt(text)} — remove it (an empty line is not a row; one of spaces "
                "or tabs is)"
                if not text.strip()
                else f"invalid JSON ({one_line(exc)}) in {_excerpt(text)} — fix or remove that line"
            )
            documents.report(ref, row, "invalid_json", f"{where} must be a JSON object, got {got}")
            return None
        if not isinstance(record, dict):
            documents.report(
                ref,
                row,
                "not_an_object",
                f"{where} must be a JSON object, got a JSON {_json_kind(record)} — fix or remove that line",
            )
            return None
        if "\\ud" in text or "\\uD" in text:  # only such a line can hold a lone surrogate (encode.surrogates)
            # a record run reads every string of the record (named by its top-level key); a text run its field's
            lone = lone_surrogate(record) if documents.convert is not None else lone_surrogate(record.get(field), field)
            if lone is not None:
                documents.report(
                    ref,
                    row,
                    "not_utf8",
                    f"{where} field {lone[0]!r} must be text UTF-8 can encode, got a lone surrogate U+{lone[1]:04X} "
                    "(a JSON \\u escape without its pair) — fix or remove that line",
                )
                return None
        if documents.convert is not None:  # record mode (chat): the whole record, converted
            return record
        if field not in record:
            documents.report(
                ref,
                row,
                "missing_field",
                f"{where} must have the field {field!r}, got keys {sorted(record)} — fix the data or choose "
                f"another text field ({FIELD_HINT}){nested_hint(field, record)}",
            )
            return None
        return documents.text(ref, row, record[field])


def _excerpt(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _json_kind(value: object) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


class JsonlLines(JsonlShard):
    """A plain JSONL object read by ranges (``StoreOptions(remote_read="range")``), through its line index.

    The line spans (saved when the object was scanned or first read whole, ``zephon.storage.objects.scan``)
    say where each row is; ``read`` fetches only the rows asked for: nearby rows (gaps under 64 KiB) are
    coalesced into one range, ranges are fetched concurrently, and nothing else is kept. The row count is
    checked against the plan, and every GET carries the object's pin.

    Worked example: rows 3, 4 and 90 of spans ``(0,10) … (30,40) (41,55) … (9000,9020)``: two GETs, bytes
    [30, 55) and [9000, 9020).
    """

    __slots__ = ("_fetch",)

    GAP = 64 << 10

    def __init__(
        self,
        ref: ShardRef,
        spans: tuple[np.ndarray, np.ndarray],
        fetch: Callable[[list[tuple[int, int]]], list[bytes]],
        documents: BadDocuments,
    ) -> None:
        self.ref = ref
        self._documents = documents
        self.spans = spans
        self.data = b""
        self._fetch = fetch
        if len(spans[0]) != ref.rows:
            raise DatasetError(
                f"dataset {ref.dataset!r}: shard {ref.uri} changed since planning: rows (non-empty lines) must be "
                f"{ref.rows}, got {len(spans[0])} — restore the planned data or re-plan"
            )

    def read(self, rows: np.ndarray) -> list[str | None]:
        starts, ends = self.spans
        wanted = np.unique(rows)
        if not len(wanted):
            return []
        lo, hi = starts[wanted], ends[wanted]
        # A new range where the gap to the previous row's end is large.
        breaks = np.flatnonzero(lo[1:] - hi[:-1] > self.GAP) + 1
        first = np.concatenate(([0], breaks))
        last = np.concatenate((breaks, [len(wanted)])) - 1
        ranges = [(int(lo[a]), int(hi[b])) for a, b in zip(first.tolist(), last.tolist(), strict=True)]
        blobs = self._fetch(ranges)
        which = np.searchsorted(first, np.arange(len(wanted)), side="right") - 1
        lines: dict[int, bytes] = {}
        for i, row in enumerate(wanted.tolist()):
            base = ranges[which[i]][0]
            lines[row] = blobs[which[i]][int(starts[row]) - base : int(ends[row]) - base]
        return [self._row(row, lines[row]) for row in rows.tolist()]
