"""What the shard reader does with a bad document: raise (the default), or skip it and count it.

A bad *document* — invalid UTF-8 or JSON, not an object, no such field, null or not a string — raises a
``DatasetError`` naming the dataset, shard and row, unless the reader runs with ``on_bad_document="skip"``:
then its text is None, ``on_skip(ref, row, reason)`` counts it and the first one per shard is logged (with
``defer``, under "raise": ``on_skip(ref, row, reason, error)``, the error raised later, ``BadDocuments``). A bad
*shard* (truncated, corrupt, changed, missing column) always raises, never through this policy: a shard is not
a document. Empty texts (``""``) are valid documents.

The format readers (``zephon.executor.read.parquet``, ``zephon.executor.read.jsonl``) find the bad
documents and word the problem; ``BadDocuments`` decides what happens next.

Hints fit every caller: the text field is named with all its spellings (``FIELD_HINT``: Python, CONFIG, the
CLI), and the skip policy is suggested only by a reader that is told it applies (``skippable``: a run of an
estimated plan; exact plans refuse it, and planning and ``zephon show`` cannot skip).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from typing import Any, Protocol

from zephon.errors import ConfigError, DatasetError
from zephon.executor.encode.chat_render import CHAT_SKIP_REASONS
from zephon.executor.operators import all_dropped
from zephon.executor.read.arrow_values import NotUTF8
from zephon.plan.records import ShardRef

# The skip warnings keep the logger they had before this module was split out of the shard reader.
log = logging.getLogger("zephon.executor.read.shard_reader")

#: Values of ``on_bad_document``: raise a ``DatasetError`` (default), or skip the document and count it.
ON_BAD_DOCUMENT = ("raise", "skip")
#: Why a document was skipped: the keys of ``RunStats.skipped``.
SKIP_REASONS = (
    "not_utf8",
    "invalid_json",
    "not_an_object",
    "missing_field",
    "null_text",
    "not_text",
    *CHAT_SKIP_REASONS,
    "operator_error",
    "truncated_member",
    "bad_sample",
    "dropped",
)
#: How to choose the text field, in every caller's words (the shard readers' missing-column messages).
FIELD_HINT = (
    "tokenize(field=...) in Python, `field:` under `tokenizer:` in CONFIG, --field for zephon show and zephon tokenize"
)
_SKIP_HINT = 'or skip and count such documents with Pipeline.options(on_bad_document="skip")'


def nested_hint(field: str, names: Container[str]) -> str:
    """For a text field named like a path into a nested column (``meta.text`` where ``meta`` is a column or key):
    how to lift it, as a clause to append to a missing-field message; else ""."""
    head, _, rest = field.partition(".")
    if not rest or head not in names:
        return ""
    path = "".join(f"[{part!r}]" for part in field.split("."))
    return (
        f"; {field!r} reads as a field inside {head!r}, which fields do not reach — lift it with a map_transform "
        f"returning {{**record, 'text': record{path}}} and tokenize field 'text' (Python), or write it to a column "
        "of its own"
    )


class RecordConverter(Protocol):
    """Turns whole records into what the encoder takes (``zephon.executor.encode.encoders.RecordConverter``):
    ``columns`` to read from Parquet (None: all), ``required`` of them must exist."""

    columns: tuple[str, ...] | None
    required: tuple[str, ...]

    def convert_all(self, where: list[Any], records: list[Any], documents: BadDocuments) -> list[Any]: ...


class BadDocuments:
    """The ``on_bad_document`` policy of one reader, for the text field ``field``; ``skippable``: the reader
    serves a run that may switch on the skip policy (an estimated plan), so its errors suggest it.

    State: the shards whose first skipped document was logged (``warned``), and whether skips are counted now
    (``counting``: off while a run's calibration reads the documents it will hand out later, so each is counted
    once, when it is handed out; ``zephon.executor.shard_access``). ``defer``: under "raise", a bad document read
    while counting is reported to ``on_skip`` with its error, as a skipped one is, instead of raised — an estimated
    run raises it when the document's packing lane reaches it (``zephon.executor.estimated``), so where a run
    stops never depends on how far reading ran ahead (the read chunk, DataLoader workers' lanes).
    """

    __slots__ = ("_on_skip", "_skip", "convert", "counting", "defer", "field", "skippable", "warned")

    def __init__(
        self,
        field: str,
        on_bad_document: str,
        on_skip: Callable[..., None] | None,
        *,
        skippable: bool = False,
        convert: RecordConverter | None = None,
    ) -> None:
        """``convert``: the reader hands out whole records converted by it (chat), not the field's strings."""
        if on_bad_document not in ON_BAD_DOCUMENT:
            raise ConfigError(f'on_bad_document must be "raise" or "skip", got {on_bad_document!r}')
        self.field = field
        self._skip = on_bad_document == "skip"
        self._on_skip = on_skip
        self.skippable = skippable
        self.convert = convert
        self.warned: set[int] = set()
        self.counting = True
        self.defer = False

    def report(self, ref: ShardRef, row: int, reason: str, message: str) -> None:
        """A bad document: raise (default), or count it for ``on_bad_document="skip"`` (its text becomes None).

        ``message`` is the problem and its fix ("... — fix or remove that line"); a ``skippable`` reader adds
        the hint to skip such documents.
        """
        if not self._skip:
            error = DatasetError(f"{message}, {_SKIP_HINT}" if self.skippable else message)
            if not (self.defer and self.counting and self._on_skip is not None):
                raise error
            self._on_skip(ref, row, reason, error)  # raised where its lane reaches it (``defer``)
            return
        if self._on_skip is not None and self.counting:
            self._on_skip(ref, row, reason)
        if ref.shard_id not in self.warned:
            self.warned.add(ref.shard_id)
            log.warning(
                "skipping a bad document (on_bad_document='skip'; Pipeline.stats().skipped counts them, this is "
                "logged once per shard by each process reading it): %s",
                message.rpartition(" — ")[0] or message,
            )

    def drop(self, ref: ShardRef, row: int) -> None:
        """A record a user operator dropped: counted (reason ``dropped``) under any policy, never an error."""
        if self._on_skip is not None and self.counting:
            self._on_skip(ref, row, "dropped")

    def text(self, ref: ShardRef, row: int, value: object) -> Any:
        """``value`` when it is a string (in record mode: the record, a dict, converted later by
        ``convert.convert_all``); otherwise a bad document (None when skipped): bytes that are not UTF-8
        (``NotUTF8``: any mode), a null or another type."""
        if isinstance(value, str):
            return value
        if isinstance(value, NotUTF8):
            self.report(
                ref,
                row,
                "not_utf8",
                f"dataset {ref.dataset!r}: shard {ref.uri} row {row} must be UTF-8 text, got byte 0x{value.byte:02x} "
                f"at byte {value.offset} of {'the record' if self.convert is not None else f'field {self.field!r}'} — "
                "write the column again as UTF-8, fix or remove that row",
            )
            return None
        if self.convert is not None:
            return value
        reason, got = ("null_text", "null") if value is None else ("not_text", type(value).__name__)
        self.report(
            ref,
            row,
            reason,
            f"dataset {ref.dataset!r}: shard {ref.uri} row {row} field {self.field!r} must be a string, got {got} "
            f"— clean the data or choose another text field ({FIELD_HINT})",
        )
        return None


def all_skipped(skipped: dict[str, int], share: str, field: str) -> DatasetError:
    """The error of a run (or a rank: ``share``) whose every document was skipped — by the operators alone
    (``dropped``: no policy involved) or by ``on_bad_document="skip"`` too (docs/training.md)."""
    total = sum(skipped.values())
    if set(skipped) == {"dropped"}:  # the user's operators returned None for everything
        return all_dropped(total, share)
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))
    return DatasetError(
        f'on_bad_document="skip" must leave documents to train on, got all {total} documents of {share} '
        f"skipped ({reasons}) — check the text field {field!r} and the data; "
        "Pipeline.stats().skipped_by_shard names the shards"
    )
