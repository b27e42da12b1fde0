"""What is in step N: the documents of one global batch, with a preview of their text.

``show_step(plan_dir, n, batch_size=B)`` resolves the plan's sequences (``zephon.inspection.steps``), seeks to
sequences ``[n·B, (n+1)·B)`` without scanning the plan — positions are row numbers, token offsets and bin
sequences are sorted and found through Parquet row-group statistics — and reads the first characters of
each document from its shard (one row group per shard, with ``zephon.executor.read.shard_reader``). A chat plan's
documents are previewed turn by turn, ``role: content`` per line (``zephon.inspection.chat_preview``).

Worked example: an exact wrap plan with ``L = 257`` and ``B = 4`` has 1028 tokens per step. Step 3 is stream
tokens ``[3084, 4112)``: the document straddling token 3084 (found in the one row group whose minimum
``token_offset`` is the largest ≤ 3084), every document after it that starts before 4112, and for each the
tokens it has inside the step (``in_step``): the first and last are usually cut.

A document that spans two steps is listed in both; its preview is the start of the document, not of the
part inside the step. Shard URIs are shortened to their path below the shards' common directory.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon.checks import is_int
from zephon.errors import ConfigError
from zephon.executor.step_arithmetic import step_sequences
from zephon.inspection.steps import StepSeeker, resolve_layout
from zephon.plan.bundle import open_bundle
from zephon.plan.manifest import Manifest

__all__ = ["PREVIEW_CHARS", "ShowRow", "StepView", "preview", "short_uris", "show_step"]

#: Characters of text shown per document.
PREVIEW_CHARS = 60


@dataclass(frozen=True, kw_only=True, slots=True)
class ShowRow:
    """One document of a step."""

    position: int
    dataset: str
    #: Absolute shard URI and its short form (path below the shards' common directory).
    uri: str
    shard: str
    row: int
    epoch: int
    #: The document's tokens, and how many of them are in this step (``None`` for plans without tokens).
    tokens: int | None
    tokens_in_step: int | None
    #: The first ``PREVIEW_CHARS`` characters, newlines as ``⏎``; ``None`` when text was not read.
    text: str | None
    #: The document's phase (``plan.json`` ``phases``); ``None`` for a plan without phases.
    phase: int | None = None
    #: Metadata columns asked for (``columns=``), by name (``zephon.inspection.metadata``); empty otherwise.
    metadata: Mapping[str, object] = dataclass_field(default_factory=dict)
    #: Plans packed into planned rows (best fit, ``pack_samples``): the row (sequence) holding the document.
    sequence: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class StepView:
    """The documents of step ``step``, in plan order."""

    step: int
    steps: int
    batch_size: int
    first_sequence: int
    #: Last sequence of the step (inclusive; the plan's last step may be short).
    last_sequence: int
    sequences: int
    #: How sequences are defined for this plan, e.g. ``exact wrap, 257 tokens per sequence``.
    sequences_are: str
    rows: tuple[ShowRow, ...]
    #: True for a record plan with costs: ``tokens`` are the samples' costs, rows ordered by sequence.
    costs: bool = False

    @property
    def tokens(self) -> int | None:
        """Tokens in the step, or ``None`` for plans without tokens."""
        if not self.rows or self.rows[0].tokens_in_step is None:
            return None if self.rows else 0
        return sum(r.tokens_in_step or 0 for r in self.rows)


def show_step(
    plan_dir: str | os.PathLike[str],
    step: int,
    *,
    batch_size: int | None = None,
    max_length: int | None = None,
    text: bool = True,
    field: str | None = None,
    columns: Sequence[str] = (),
) -> StepView:
    """The documents of step ``step`` (0-based) of global batches of ``batch_size`` sequences.

    ``field`` is the shard column to preview (default: the plan's tokenizer field, else ``text``); with
    ``text=False`` no shard is opened. ``columns``: metadata columns of selected datasets to show per document
    (their own columns or their sidecar's; docs/curricula.md).
    """
    bundle = open_bundle(plan_dir)
    manifest = bundle.manifest
    layout = resolve_layout(manifest, batch_size=batch_size, max_length=max_length)
    steps = layout.require_steps()
    if not is_int(step) or not 0 <= step < steps:
        raise ConfigError(
            f"step must be an integer in 0..{steps - 1} (the plan has {steps} steps of {layout.batch_size} "
            f"sequences), got {step!r} — pass a step in range"
        )
    assert layout.batch_size is not None and layout.sequences is not None
    first, end = step_sequences(step, layout.batch_size)
    end = min(end, layout.sequences)  # the last step may be partial
    docs = StepSeeker(bundle, layout).documents(first, end)

    shards = bundle.shards.read()
    short = short_uris(shards.column("uri").to_pylist())
    wanted = shards.filter(
        pc.is_in(shards.column("shard_id"), value_set=pa.array(np.unique(docs.shard_id), pa.int32()))
    )
    uri_of = dict(zip(wanted.column("shard_id").to_pylist(), wanted.column("uri").to_pylist(), strict=True))
    names = {d.id: d.name for d in manifest.datasets}
    starts = [p.first_position for p in manifest.phases]
    texts: list[str | None] = [None] * len(docs)
    if text and len(docs) and (field is not None or layout.tokens != "cost"):  # records: a text only when named
        texts = list(_previews(wanted, docs.shard_id, docs.row, field or _field(manifest), manifest.datasets))
    meta: dict[str, list[object]] = {}
    if columns and len(docs):
        from zephon.inspection.metadata import metadata_values

        meta = metadata_values(bundle, docs.shard_id, docs.row, list(columns))
    rows = tuple(
        ShowRow(
            position=int(docs.position[i]),
            dataset=names.get(int(docs.dataset_id[i]), str(docs.dataset_id[i])),
            uri=uri_of[int(docs.shard_id[i])],
            shard=short[uri_of[int(docs.shard_id[i])]],
            row=int(docs.row[i]),
            epoch=int(docs.epoch[i]),
            tokens=None if docs.tokens is None else int(docs.tokens[i]),
            tokens_in_step=None if docs.tokens_in_range is None else int(docs.tokens_in_range[i]),
            text=texts[i],
            phase=bisect.bisect_right(starts, int(docs.position[i])) - 1 if starts else None,
            metadata={n: meta[n][i] for n in meta},
            sequence=None if docs.sequence is None else int(docs.sequence[i]),
        )
        for i in range(len(docs))
    )
    if layout.tokens == "cost" and docs.sequence is not None:  # a packed step: its rows, each with its members
        rows = tuple(sorted(rows, key=lambda r: (r.sequence, r.position)))
    return StepView(
        step=step,
        steps=steps,
        batch_size=layout.batch_size,
        first_sequence=first,
        last_sequence=end - 1,
        sequences=layout.sequences,
        sequences_are=layout.describe(),
        rows=rows,
        costs=layout.tokens == "cost",
    )


def preview(text: str, chars: int = PREVIEW_CHARS) -> str:
    """The first ``chars`` characters, line breaks as ``⏎`` and tabs as spaces; ``…`` marks a cut."""
    head = text[: 2 * chars + 2]  # enough characters even if every "\r\n" collapses to one
    flat = head.replace("\r\n", "⏎").replace("\n", "⏎").replace("\r", "⏎").replace("\t", " ")
    return flat if len(flat) <= chars and len(head) == len(text) else flat[:chars] + "…"


def short_uris(uris: Sequence[str]) -> dict[str, str]:
    """Each URI relative to the common directory of all of them (``data/a/x.parquet`` → ``a/x.parquet``)."""
    if not uris:
        return {}
    try:
        base = os.path.commonpath([os.path.dirname(u) for u in uris])
    except ValueError:  # a mix of absolute and relative paths, or of drives
        return {u: os.path.basename(u) for u in uris}
    return {u: os.path.relpath(u, base) if base else u for u in uris}


def _field(manifest: Manifest) -> str:
    return (manifest.tokenizer.field if manifest.tokenizer is not None else "") or "text"


def _previews(shards, shard_ids: np.ndarray, rows: np.ndarray, field: str, datasets: Sequence[Any]) -> list[str]:
    # Imported here: the executor's reader is only needed when text is shown.
    from zephon.executor.read.shard_reader import ShardReader, planning_cache
    from zephon.executor.token_stores.shards import PlanStores
    from zephon.inspection.chat_preview import holds_records, record_reader
    from zephon.plan.records import shard_refs
    from zephon.storage.objects.paths import is_object_uri
    from zephon.storage.remote import is_remote_uri

    refs = shard_refs(shards)
    # Remote (hf://, object-store) shards are read through the planner's shard cache ($ZEPHON_CACHE_DIR/shards),
    # made only then: a read-only command over local shards creates nothing. A token store's documents are shown
    # as their ids. Record mode for chat columns: a conversation is shown turn by turn (chat_preview).
    remote = any(is_remote_uri(r.uri) or is_object_uri(r.uri) for r in refs)
    convert = record_reader(field) if holds_records(refs, field) else None
    stores = PlanStores(datasets)
    cache = planning_cache() if remote else None
    reader = ShardReader(refs, field, capacity=len(refs), cache=cache, convert=convert, stores=stores or None)
    try:
        return [preview(t) if isinstance(t, str) else ids_preview(t) for t in reader.texts(shard_ids, rows)]
    finally:
        reader.close()


def ids_preview(ids: np.ndarray, chars: int = PREVIEW_CHARS) -> str:
    """A token store document's ids as ``zephon show`` previews them: ``ids 1 17 23 2`` (``…`` marks a cut)."""
    plain = ids["id"] if ids.dtype.names else ids  # a store with a loss mask: its ids' flags beside them
    return preview("ids " + " ".join(map(str, plain[:chars].tolist())), chars)
