"""A dataset that is a token store: a corpus already tokenized (docs/token-stores.md), as the recipe names it.

``Dataset.from_path(name, path, fmt=..., tokenizer=..., tokens_field=..., dtype=..., eos_token_id=...)`` makes a
dataset whose documents are a store's documents: the planner opens the store (its indexes only) and plans its
parts as shards and its documents as rows; the executor reads each document's ids by range. The recipe only
records what the user said; opening, detecting and reading are the store readers' (``zephon.executor.token_stores``,
which the recipe, beside the executor, does not import).

Which paths are token stores (``fmt`` is ``from_path``'s keyword):

* ``fmt="megatron" | "olmo" | "datatrove" | "litdata" | "mds"`` (or an alias: ``numpy``, ``dolma``): always;
* ``fmt="parquet" | "jsonl"`` with ``tokens_field=``: a ``list<int>`` column of ids (without it: raw text);
* ``fmt=None``: a *local* path that only a token store can be — ``PATH.idx`` beside ``PATH.bin`` (Megatron), a
  path ending in ``.idx``, ``.bin``, ``.ds``, ``.npy``, or a folder of no Parquet/JSONL holding ``index.json``
  or such files — is one, its format detected when the plan opens it (but an MDS folder of records — no token
  column, a column that is not ``str``: ``zephon.storage.mds_records`` — is not); any other path is raw text.
  Remote token stores name ``fmt=`` (detecting would cost a listing per dataset, and a raw dataset's path must
  not change meaning).

Example: ``data/web_text_document`` with ``data/web_text_document.idx`` and ``.bin`` beside it →
``TokenStoreSpec(fmt=None)``, opened as ``megatron`` at plan time.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from zephon.checks import is_int
from zephon.errors import ConfigError

__all__ = ["STORE_FORMATS", "TokenStoreSpec", "looks_like_token_store", "selection_refused"]

#: The formats only token stores have (``parquet``/``jsonl`` are token stores only with ``tokens_field``).
STORE_FORMATS = ("megatron", "olmo", "datatrove", "litdata", "mds")
_ALIASES = {"numpy": "olmo", "dolma": "olmo", "npy": "olmo", "mmap": "megatron", "indexed": "megatron"}
_STORE_SUFFIXES = (".idx", ".bin", ".ds", ".npy")


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenStoreSpec:
    """How to open a dataset's token store (``zephon.executor.token_stores.open_token_store``'s options).

    Attributes:
        fmt: the store's format (``STORE_FORMATS``, ``parquet``, ``jsonl``), or None: detected when opened.
        tokenizer: the tokenizer the ids were made with (a Hub id or path, as ``tokenize(tokenizer_id=...)``
            names it); None: the store's own record (datatrove), else the run's tokenizer is trusted.
        tokens_field: the ids' column (MDS, Parquet, JSONL); None: ``input_ids``, else ``tokens``.
        dtype: the ids' dtype where the format does not store it (OLMo files, MDS ``bytes`` columns).
        eos_token_id / bos_token_id: OLMo files without their ``start,end`` sidecar end documents at EOS
            (followed by BOS when both are given).
    """

    fmt: str | None = None
    tokenizer: str | None = None
    tokens_field: str | None = None
    dtype: str | None = None
    eos_token_id: int | None = None
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.fmt is not None:
            fmt = _ALIASES.get(self.fmt, self.fmt)
            if fmt not in (*STORE_FORMATS, "parquet", "jsonl"):
                raise ConfigError(
                    f"fmt must be one of {', '.join((*STORE_FORMATS, 'parquet', 'jsonl'))} or None, got {self.fmt!r} "
                    "— fix fmt="
                )
            object.__setattr__(self, "fmt", fmt)
        if self.fmt in ("parquet", "jsonl") and self.tokens_field is None:
            raise ConfigError(
                f"a {self.fmt} token store must name its ids column, got tokens_field=None — pass "
                'tokens_field="input_ids"'
            )
        for name in ("tokenizer", "tokens_field", "dtype"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name} must be a non-empty string or None, got {value!r}")
        for name in ("eos_token_id", "bos_token_id"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 0):
                raise ConfigError(f"{name} must be an integer ≥ 0 or None, got {value!r} — pass the tokenizer's id")

    def normalized(self) -> dict[str, Any]:
        """The options as plan.json and the config hash record them (every key, None included)."""
        return asdict(self)

    def open_options(self) -> dict[str, Any]:
        """``open_token_store``'s keywords."""
        return {
            "fmt": self.fmt,
            "dtype": self.dtype,
            "eos_token_id": self.eos_token_id,
            "bos_token_id": self.bos_token_id,
            "tokens_field": self.tokens_field,
        }


def looks_like_token_store(path: str) -> bool:
    """Whether a local ``path`` can only be a token store (see the module); never for a glob or a remote path."""
    if "://" in path or any(c in path for c in "*?["):
        return False
    if os.path.isfile(path + ".idx") and os.path.isfile(path + ".bin"):
        return True
    if not os.path.exists(path) and (os.path.isfile(path + ".idx") or os.path.isfile(path + ".bin")):
        return True  # half a Megatron pair: the store's reader names the missing file
    if path.endswith(_STORE_SUFFIXES) and os.path.exists(path):
        return True
    if os.path.isdir(path):
        names = os.listdir(path)
        raw = any(n.endswith((".parquet", ".jsonl", ".jsonl.gz", ".jsonl.zst")) for n in names)
        if raw:
            return False
        if "index.json" in names:  # MDS of images, bytes, numbers: records (zephon.storage.mds_records), not a store
            from zephon.storage.mds_records import is_record_mds

            return not is_record_mds(path)
        return any(n.endswith((".idx", ".ds", ".npy")) for n in names)
    return False


def selection_refused(dataset: str, fmt: str) -> ConfigError:
    """The one-line refusal of a selection by metadata on a store of ids only (``fmt`` in ``STORE_FORMATS``):
    raised by ``Dataset.from_path`` when ``fmt=`` names it, else by the planner once it detects the format."""
    return ConfigError(
        f"dataset {dataset!r}: a selection by metadata (where, metadata/key, order_by, dedup_on) must name columns, "
        f"got a {fmt} token store, which holds only token ids — select the documents before writing the store, or "
        'write them as Parquet/JSONL with a token column beside their metadata (fmt="parquet", tokens_field=...)'
    )
