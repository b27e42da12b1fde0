"""The record beside each prefix ``zephon tokenize`` writes: ``PREFIX.zephon.json`` — what made the store.

A prefix's ``.bin``/``.idx`` are Megatron's and say nothing of where their ids came from; the record does, so a
rerun can tell a finished store of the same input from anything else (``zephon.planner.tokenize.prefixes``):

* ``complete: false`` — written just before the ``.bin``/``.idx`` are renamed into place: it *claims* them (a
  kill between the renames leaves files a rerun knows to be its own);
* ``complete: true`` — written last, atomically: the store is finished, made from ``shard_fingerprint`` (the
  shard's content, ``zephon.storage.scan``) read through ``field`` and encoded by the tokenizer whose ids the
  ``tokenizer_fingerprint`` names (tokenizer.json and the special tokens added; never the engine), in ``dtype``;
  ``idx_sha256`` and ``bin_bytes`` pin the two files.

The record holds no time, host or process, so it is byte-identical for any number of workers. Example::

    {"bin_bytes": 2046, "complete": true, "dataset": "prose", "documents": 300, "dtype": "uint16",
     "field": "text", "format": "zephon-tokenize", "idx_sha256": "9c1…", "rows": 300,
     "shard": "/data/demo/prose-00000.parquet", "shard_fingerprint": "pq:…", "tokenizer": "gpt2",
     "tokenizer_fingerprint": "4f2…", "tokens": 1023, "version": 1}
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from zephon.errors import DatasetError

__all__ = ["FORMAT", "RECORD_SUFFIX", "VERSION", "StoreRecord", "read_record", "record_bytes"]

RECORD_SUFFIX = ".zephon.json"
FORMAT = "zephon-tokenize"
VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreRecord:
    """One prefix's record (see the module docstring)."""

    complete: bool
    dataset: str
    shard: str
    shard_fingerprint: str
    rows: int
    field: str
    tokenizer: str
    tokenizer_fingerprint: str
    dtype: str
    documents: int
    tokens: int
    idx_sha256: str = ""
    #: Documents ``max_tokens`` cut (``long_documents: truncate``) and the tokens cut from them: never silent.
    truncated: int = 0
    truncated_tokens: int = 0
    bin_bytes: int = 0
    format: str = FORMAT
    version: int = VERSION

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def record_bytes(record: StoreRecord) -> bytes:
    """The record as written: sorted keys, one line, a final newline (the same bytes for the same store)."""
    return (json.dumps(record.to_dict(), sort_keys=True, ensure_ascii=False) + "\n").encode()


def read_record(path: Path) -> StoreRecord | None:
    """The record at ``path``; None when it is not one ``zephon tokenize`` wrote (not JSON, another format).
    A record of another version is refused in one line (a newer Zephon wrote it)."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    if data.get("version") != VERSION:
        raise DatasetError(
            f"{path} must be a zephon tokenize record of version {VERSION}, got version {data.get('version')!r} — "
            "a newer Zephon wrote it; tokenize into another -o, or upgrade Zephon"
        )
    names = {f.name for f in dataclasses.fields(StoreRecord)}
    try:
        return StoreRecord(**{k: v for k, v in data.items() if k in names})
    except TypeError:
        return None
