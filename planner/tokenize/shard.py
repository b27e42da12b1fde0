"""One shard tokenized into one Megatron prefix: read as training reads it, encoded as training encodes it.

The shard's texts come from the executor's ``ShardReader`` (``iter_shard``: every row in order, a row group or
4 096 JSONL rows at a time; a bad document raises, naming its row) and are encoded by the run's encoder
(``encode_flat``: BOS by the tokenizer's convention, the text, one EOS — or what the ``special_tokens`` setting
says), so the store's document ``i`` is exactly the ids shard row ``i`` becomes in training. The ids stream into
:class:`~zephon.executor.token_stores.megatron_writer.MegatronWriter`'s temporaries; then, in this order:

1. the targets are checked to be absent (the driver cleared what was ours: ``prefixes.resume_state``);
2. the record ``PREFIX.zephon.json`` is written with ``complete: false`` (it claims the targets);
3. ``.bin`` then ``.idx`` are renamed into place;
4. the record is rewritten with ``complete: true`` (atomically): the store is finished.

A kill before 2 leaves temporaries only (swept by the next run); between 2 and 4 an incomplete record the next
run knows to clear. Memory: one row group's texts and ids, plus 8 bytes of length per document.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zephon.errors import ConfigError, DatasetError, StorageError
from zephon.executor.encode.encoders import AnyEncoder, carries_flags, converter_of
from zephon.executor.engines.at_document import AtDocument
from zephon.executor.read.shard_reader import ShardReader, planning_cache
from zephon.executor.token_stores.megatron_writer import MegatronWriter, temporary_path
from zephon.plan.records import ShardRef
from zephon.planner.tokenize.prefixes import prefix_files
from zephon.planner.tokenize.records import StoreRecord, record_bytes
from zephon.storage.files import atomic_file

__all__ = ["ShardTask", "check_encoder", "write_shard_store"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardTask:
    """One shard to write: its record in the scan and the prefix its store goes to."""

    ref: ShardRef
    prefix: str


def check_encoder(encoder: AnyEncoder) -> None:
    """Refuse encoders whose output a Megatron store cannot hold: chat (a loss mask per token) and split long
    documents (segment flags inside the ids)."""
    spec = getattr(encoder, "spec", None)
    if spec is not None and spec.chat is not None:
        raise ConfigError(
            "zephon tokenize must write plain token ids, got a chat tokenizer setting (its loss mask has no place in "
            "a Megatron .bin/.idx) — tokenize chat data at run time with tokenize_chat"
        )
    if carries_flags(encoder):
        raise ConfigError(
            "zephon tokenize must write plain token ids, got long_documents: split (its pieces carry segment flags a "
            "Megatron .bin/.idx cannot hold) — use long_documents: truncate, or no max_tokens"
        )


def _write_record(path: Path, record: StoreRecord) -> None:
    with atomic_file(path, "the zephon tokenize record", "or choose another -o", temporary=temporary_path(path)) as t:
        t.write_bytes(record_bytes(record))


def write_shard_store(
    task: ShardTask,
    encoder: AnyEncoder,
    dtype: np.dtype,
    *,
    split: bool = True,
    on_rows: Callable[[int], None] | None = None,
) -> StoreRecord:
    """Tokenize ``task.ref`` into ``task.prefix`` (see the module docstring); returns the finished record.
    ``split=False`` encodes on this thread alone (one shard per worker process); ``on_rows(n)`` after each batch."""
    ref, prefix = task.ref, Path(task.prefix)
    spec = encoder.spec
    reader = ShardReader([ref], spec.field, capacity=1, cache=planning_cache(), convert=converter_of(encoder))
    with MegatronWriter(prefix, dtype) as writer:
        first = 0  # the shard's row of the batch's first text
        truncated = [0, 0]  # documents max_tokens cut, tokens cut from them
        for values in reader.iter_shard(ref.shard_id):
            if any(v is None for v in values):  # only a user operator drops a record; none run here
                row = first + next(i for i, v in enumerate(values) if v is None)
                raise DatasetError(f"dataset {ref.dataset!r}: shard {ref.uri} row {row} must be a document, got none")
            try:
                encoded = encoder.encode_flat(values, split=split)
            except AtDocument as exc:  # the spot check or a lone surrogate: name the document
                raise exc.located(ref, first + exc.index) from None
            writer.add(encoded.ids, encoded.sizes, where=f"dataset {ref.dataset!r}: shard {ref.uri} rows {first}..")
            if encoded.cut is not None:
                truncated[0] += int(np.count_nonzero(encoded.cut))
                truncated[1] += int(encoded.cut.sum())
            first += len(values)
            if on_rows is not None:
                on_rows(len(values))
        if writer.documents != ref.rows:
            raise DatasetError(
                f"dataset {ref.dataset!r}: shard {ref.uri} must have the {ref.rows} rows it was scanned with, got "
                f"{writer.documents} — it changed while tokenized; run zephon tokenize again"
            )
        index = writer.finish()
        record = StoreRecord(
            complete=False,
            dataset=ref.dataset,
            shard=ref.uri,
            shard_fingerprint=ref.fingerprint,
            rows=ref.rows,
            field=spec.field,
            tokenizer=spec.tokenizer_id,
            tokenizer_fingerprint=encoder.fingerprint,
            dtype=str(np.dtype(dtype)),
            documents=writer.documents,
            tokens=writer.tokens,
            idx_sha256=hashlib.sha256(index).hexdigest(),
            truncated=truncated[0],
            truncated_tokens=truncated[1],
            bin_bytes=writer.tokens * np.dtype(dtype).itemsize,
        )
        bin_, idx, record_path = prefix_files(prefix)
        taken = next((p for p in (bin_, idx, record_path) if p.exists() or p.is_symlink()), None)
        if taken is not None:
            raise StorageError(
                f"{taken} must not be there for zephon tokenize to write {prefix}, got a file put there while it "
                "tokenized — nothing was replaced; move it away and run zephon tokenize again, or choose another -o"
            )
        _write_record(record_path, record)
        writer.commit()
    finished = StoreRecord(**{**record.to_dict(), "complete": True})
    _write_record(record_path, finished)
    return finished
