"""Datasets of the recipe (exported by ``zephon.io``).

``Dataset.from_path(name, path)`` accepts a local directory, a glob or a single file of Parquet or JSONL
shards (see ``zephon.storage.local``), an ``hf://`` dataset path (see ``zephon.storage.hub.paths``), which
is pinned to its commit here, so every later step reads the same files, or an object-store path (``s3://``,
``gs://``, ``az://``; ``zephon.storage.objects``), whose objects are pinned by ETag (and version id) here.
Shards are listed when the dataset is created, so a wrong path fails at once; rows are counted when a plan is
made (``Dataset.shards()``): Parquet from footers (range requests for remote shards), JSONL from one scan.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from zephon.errors import ConfigError, DatasetError
from zephon.keywords import known_keywords
from zephon.plan.records import ShardInfo
from zephon.recipe.computed_cost import ComputedCost
from zephon.recipe.selection import Selection
from zephon.recipe.token_store import STORE_FORMATS, TokenStoreSpec, looks_like_token_store, selection_refused
from zephon.specs import StoreOptions
from zephon.storage.local import SourceFile, discover_local_files
from zephon.storage.objects.paths import SCHEMES as OBJECT_SCHEMES
from zephon.storage.scan import scan_shard

#: A URL scheme at the start of a path (``s3://``, ``gs://``, ``https://``, ...).
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Dataset:
    """A named collection of shards.

    Attributes:
        name: the dataset's name in mixtures and plans (letters, digits, ``_ . -``).
        path: the path as the user gave it.
        files: the shards found, sorted by path.
    """

    name: str
    path: str
    files: tuple[SourceFile, ...]
    #: The form that reads the same files again: for hf:// the path pinned to its commit, else ``path``.
    pinned: str = ""
    #: Which rows the plan reads and in what order (``where``, sidecar ``metadata``, ``order_by``, ``dedup_on``);
    #: None reads every row (``zephon.recipe.selection``).
    selection: Selection | None = None
    #: A token store's options (``zephon.recipe.token_store``): its parts are the shards, found when the plan
    #: opens it (``files`` is empty); None for raw text.
    token_store: TokenStoreSpec | None = None
    #: A sample's cost: a DuckDB expression over its columns (and its sidecar's), evaluated at plan time
    #: (``zephon.planner.costs``), or a ``ComputedCost``: a function the planner's computed pass calls on each
    #: sample (``zephon.planner.counts.computed``; docs/records.md); None: no cost.
    cost: str | ComputedCost | None = None

    def __post_init__(self) -> None:
        if isinstance(self.cost, ComputedCost):
            return
        if self.cost is not None and (not isinstance(self.cost, str) or not self.cost.strip()):
            raise ConfigError(
                f"dataset {self.name!r}: cost must be a non-empty DuckDB expression, got {self.cost!r} — write e.g. "
                'cost="text_tokens + ceil(width / 14.0) * ceil(height / 14.0)", cost=zephon.records.computed_cost('
                '"mypkg.costs:image_cost"), or leave it out'
            )

    @classmethod
    @known_keywords
    def from_path(
        cls,
        name: str,
        path: str | Path,
        *,
        where: str | None = None,
        metadata: str | Path | None = None,
        key: str | None = None,
        order_by: str | None = None,
        order_window: int = 1024,
        dedup_on: str | None = None,
        io_options: StoreOptions | None = None,
        fmt: str | None = None,
        tokenizer: str | None = None,
        tokens_field: str | None = None,
        dtype: str | None = None,
        eos_token_id: int | None = None,
        bos_token_id: int | None = None,
        cost: str | ComputedCost | None = None,
    ) -> Dataset:
        """Create a dataset from a local directory, glob or file, an ``hf://`` dataset path, or an object-store
        path (``s3://``, ``gs://``/``gcs://``, ``az://``/``abfs://``: an object, a prefix or a glob).

        ``where``, ``metadata``/``key``, ``order_by``/``order_window`` and ``dedup_on`` select and order its
        documents by metadata at plan time (``zephon.recipe.selection``; docs/curricula.md).
        ``io_options``: its ``credentials`` replace the environment's for the prefixes they name, for this
        listing and every later read of this process (``zephon.storage.objects.stores``).

        ``fmt``, ``tokenizer``, ``tokens_field``, ``dtype``, ``eos_token_id``, ``bos_token_id``: a token store,
        a corpus already tokenized (``zephon.recipe.token_store``; docs/token-stores.md): ``fmt`` is one of
        ``megatron``, ``olmo``, ``datatrove``, ``litdata``, ``mds``, or ``parquet``/``jsonl`` with
        ``tokens_field``; a local path only a store can be is one without ``fmt``.

        ``cost``: each sample's cost, a DuckDB expression over its columns or its sidecar's (``metadata``/``key``),
        evaluated at plan time for cost mixtures, ``num_cost`` budgets and ``Pipeline.pack_samples``
        (docs/records.md#costs-and-packing-samples); or ``zephon.records.computed_cost("mod:fn")``, a function
        of each sample called by a planning pass (``zephon.recipe.computed_cost``)."""
        dataset = cls._made(
            name, path, where, metadata, key, order_by, order_window, dedup_on, io_options,
            (fmt, tokenizer, tokens_field, dtype, eos_token_id, bos_token_id),
        )  # fmt: skip
        if cost is None:
            return dataset
        if dataset.token_store is not None:
            raise ConfigError(
                f"dataset {name!r}: cost= must describe records (samples read whole), got a token store — a store's "
                "documents cost their tokens; drop cost="
            )
        return replace(dataset, cost=cost)

    @classmethod
    def _made(
        cls,
        name: str,
        path: str | Path,
        where: str | None,
        metadata: str | Path | None,
        key: str | None,
        order_by: str | None,
        order_window: int,
        dedup_on: str | None,
        io_options: StoreOptions | None,
        store_options: tuple[str | None, str | None, str | None, str | None, int | None, int | None],
    ) -> Dataset:
        fmt, tokenizer, tokens_field, dtype, eos_token_id, bos_token_id = store_options
        if not isinstance(path, str | os.PathLike) or not str(path).strip():
            raise ConfigError(
                f"dataset {name!r}: path must be a non-empty string or pathlib.Path, got {path!r} — pass where its "
                "shards are: a directory, a glob, one file, or an hf://, s3://, gs:// or az:// path"
            )
        store = None
        if fmt is not None and fmt in ("parquet", "jsonl") and tokens_field is None:
            fmt = None  # raw text of that format: the shards' own names say it
        if fmt is not None or tokens_field is not None or looks_like_token_store(str(path)):
            store = TokenStoreSpec(
                fmt=fmt,
                tokenizer=tokenizer,
                tokens_field=tokens_field,
                dtype=dtype,
                eos_token_id=eos_token_id,
                bos_token_id=bos_token_id,
            )
        elif any(v is not None for v in (tokenizer, dtype, eos_token_id, bos_token_id)):
            raise ConfigError(
                f"dataset {name!r}: tokenizer=, dtype=, eos_token_id= and bos_token_id= must describe a token store, "
                f"got raw text at {str(path)!r} — pass fmt= (one of {', '.join(STORE_FORMATS)}, or parquet/jsonl "
                "with tokens_field=) or drop them"
            )
        selection = Selection(
            dataset=str(name),
            where=where,
            metadata=str(metadata) if metadata is not None else None,
            key=key,
            order_by=order_by,
            order_window=order_window,
            dedup_on=dedup_on,
        )
        if store is not None:
            return cls._token_store(name, path, store, selection if selection.active else None, io_options)
        return cls._from_path(name, path, selection if selection.active else None, io_options)

    @classmethod
    def _token_store(
        cls,
        name: str,
        path: str | Path,
        store: TokenStoreSpec,
        selection: Selection | None,
        io_options: StoreOptions | None,
    ) -> Dataset:
        if not isinstance(name, str) or not _NAME.match(name):
            return cls._from_path(name, path, selection, io_options)  # the one message for a bad name
        # A selection (where, metadata/key, order_by, dedup_on) is evaluated at plan time on the store's columns:
        # Parquet/JSONL token stores have them; a format of ids only is refused here when named, else when the
        # plan detects it (zephon.planner.selection.stores, the same message).
        if selection is not None and store.fmt in STORE_FORMATS:
            raise selection_refused(name, store.fmt)
        text = str(path)
        scheme = _SCHEME.match(text)
        if scheme and scheme.group(1).lower() in OBJECT_SCHEMES and io_options is not None:
            from zephon.storage.objects.stores import register_credentials

            register_credentials(io_options.credentials)
        pinned = text if scheme else os.path.abspath(text)  # a run from another directory opens the same store
        return cls(name=name, path=text, files=(), pinned=pinned, token_store=store, selection=selection)

    @classmethod
    def _from_path(
        cls, name: str, path: str | Path, selection: Selection | None, io_options: StoreOptions | None = None
    ) -> Dataset:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(
                f"dataset name must be letters, digits, '_', '.' or '-' (not starting with a symbol), "
                f"got {name!r} — rename it"
            )
        text = str(path)
        scheme = _SCHEME.match(text)
        if scheme and scheme.group(1).lower() in OBJECT_SCHEMES:
            from zephon.storage.objects.listing import discover_objects
            from zephon.storage.objects.stores import register_credentials

            credentials = io_options.credentials if io_options is not None else ()
            register_credentials(credentials)
            files = discover_objects(name, text, credentials)
            return cls(name=name, path=text, files=files, pinned=text, selection=selection)
        if scheme and scheme.group(1).lower() != "hf":
            raise DatasetError(
                f"dataset {name!r}: path must be a local path, glob or file, an hf:// dataset path or an object-store "
                f"path (s3://, gs://, az://), got {scheme.group(1)}:// in {text!r} — {scheme.group(1)}:// is not "
                "supported by this version: copy the shards to a local or mounted directory or an object store"
            )
        if text.startswith("hf://"):
            from zephon.storage.hub.client import resolve_hf_dataset
            from zephon.storage.hub.mds import mds_split
            from zephon.storage.remote import remote_uri

            resolved = resolve_hf_dataset(text)
            files = tuple(
                SourceFile(uri=remote_uri(f), format=f.format, size=f.size, remote=f, entry=f.entry)
                for f in mds_split(resolved.files)  # an MDS split: the shards its index.json lists
            )
            return cls(name=name, path=text, files=files, pinned=str(resolved.pinned), selection=selection)
        return cls(name=name, path=text, files=discover_local_files(name, text), pinned=text, selection=selection)

    def shards(self) -> tuple[ShardInfo, ...]:
        """Scan every shard's metadata (Parquet footers; JSONL row index, cached); a token store's parts are
        scanned by the planner (``zephon.planner.counts.stores``)."""
        if self.token_store is not None:
            raise ConfigError(f"dataset {self.name!r} is a token store, got Dataset.shards() — plan it instead")
        return tuple(scan_shard(self.name, f) for f in self.files)
