"""``detect_format`` and ``open_token_store``: a path (local, object store, Hub) to a :class:`TokenStore`.

Detection looks only at the listed file names, plus ``index.json`` for a folder that has one (MDS lists
``shards``, litData ``chunks`` and ``config``); it answers only where the files leave one reading:

=========================  ==============================================================================
``megatron``               ``PATH.idx`` and ``PATH.bin`` (a ``PATH`` ending in ``.idx``/``.bin`` names the pair),
                           or a folder of such pairs
``datatrove``              ``PATH`` ending in ``.ds``, or a folder of ``.ds`` files
``olmo``                   ``PATH`` ending in ``.npy``, or a folder of them (``dtype=`` is still needed)
``mds`` / ``litdata``      a folder with ``index.json``
``parquet`` / ``jsonl``    a ``.parquet`` / ``.jsonl[.gz|.zst]`` file, or a folder of one of them
=========================  ==============================================================================

A folder holding files of two formats is ambiguous: ``detect_format`` returns ``None`` and ``open_token_store``
asks for ``fmt=``. Example: ``detect_format("data/web_text_document")`` → ``"megatron"`` when
``data/web_text_document.idx`` and ``.bin`` exist.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np

from zephon.checks import is_int
from zephon.errors import ConfigError, DatasetError, ZephonError, one_line
from zephon.executor.token_stores.columns import column_fmt, column_parts
from zephon.executor.token_stores.datatrove import datatrove_parts
from zephon.executor.token_stores.files import StoreFiles, list_store_files
from zephon.executor.token_stores.litdata import litdata_parts
from zephon.executor.token_stores.mds import mds_parts
from zephon.executor.token_stores.megatron import megatron_parts, megatron_prefixes
from zephon.executor.token_stores.olmo import olmo_parts
from zephon.executor.token_stores.store import TokenStore
from zephon.specs import StoreCredentials

__all__ = ["ALIASES", "FORMATS", "detect_format", "open_token_store"]

FORMATS = ("megatron", "olmo", "datatrove", "litdata", "mds", "parquet", "jsonl")
#: Other names users give the formats.
ALIASES = {"numpy": "olmo", "dolma": "olmo", "npy": "olmo", "mmap": "megatron", "indexed": "megatron"}


def _listing_path(path: str) -> str:
    """The path to list: a Megatron file names its prefix, a ``.npy`` its stem (so the sidecar is listed)."""
    for suffix in (".idx", ".bin", ".npy"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def _detect(files: StoreFiles, original: str) -> str | None:
    names = files.files
    if original.endswith(".npy"):
        return "olmo"
    if original.endswith((".idx", ".bin")) or ".idx" in names or ".bin" in names:
        return "megatron"  # a Megatron pair, or half of one: its reader names the missing file
    if "" in names:
        if original.endswith(".ds"):
            return "datatrove"
        fmt = column_fmt(original)
        if fmt is not None:
            return fmt.split(".")[0]
        return None
    if "/index.json" in names:
        blob = names["/index.json"]
        try:
            meta = json.loads(bytes(blob.read(0, blob.size)))
        except ValueError:
            return None
        if isinstance(meta, dict) and "shards" in meta:
            return "mds"
        if isinstance(meta, dict) and "chunks" in meta and "config" in meta:
            return "litdata"
        return None
    found = set()
    inside = [s for s in names if s.startswith("/")]
    if megatron_prefixes(files):
        found.add("megatron")
    if any(s.endswith(".ds") for s in inside):
        found.add("datatrove")
    if any(s.endswith(".npy") for s in inside):
        found.add("olmo")
    found.update(f.split(".")[0] for s in inside if (f := column_fmt(s)))
    return found.pop() if len(found) == 1 else None


def detect_format(path: str, *, credentials: Iterable[StoreCredentials] = (), token: str | None = None) -> str | None:
    """The format of the store at ``path`` where its files leave no doubt, else ``None`` (see the module)."""
    return _detect(list_store_files(_listing_path(str(path)), credentials=credentials, token=token), str(path))


def _check_options(dtype: object, eos: object, bos: object, vocab: object) -> np.dtype | None:
    for name, value in (("eos_token_id", eos), ("bos_token_id", bos)):
        if value is not None and (not is_int(value) or value < 0):  # type: ignore[operator]
            raise ConfigError(f"{name} must be an integer ≥ 0 or None, got {value!r} — pass the tokenizer's id")
    if vocab is not None and (not is_int(vocab) or vocab < 1):  # type: ignore[operator]
        raise ConfigError(f"vocab_size must be an integer ≥ 1 or None, got {vocab!r} — pass len(tokenizer)")
    if dtype is None:
        return None
    try:
        out = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError:
        out = None
    if out is None or out.kind not in "iu":
        raise ConfigError(f"dtype must be an integer NumPy dtype such as 'uint16' or 'uint32', got {dtype!r}")
    return out.newbyteorder("<") if out.byteorder == ">" else out


def open_token_store(
    path: str,
    *,
    fmt: str | None = None,
    dtype: object = None,
    eos_token_id: int | None = None,
    bos_token_id: int | None = None,
    tokens_field: str | None = None,
    text_field: str | None = None,
    vocab_size: int | None = None,
    credentials: Iterable[StoreCredentials] = (),
    token: str | None = None,
) -> TokenStore:
    """Open the store at ``path`` (local, ``s3://``/``gs://``/``az://``, ``hf://datasets/ORG/NAME[@REV]/PATH``).

    ``fmt``: one of :data:`FORMATS` (or an alias), detected when ``None`` (:func:`detect_format`). ``dtype``: the
    ids' dtype where the format does not store it (OLMo numpy files; MDS ``bytes`` columns; datatrove files
    without metadata). ``eos_token_id``/``bos_token_id``: OLMo files without a sidecar. ``tokens_field`` /
    ``text_field``: the column of MDS, Parquet and JSONL stores and the text leaf of litData items.
    ``vocab_size``: when given, every read refuses ids ≥ it, naming the file and document. Opening reads
    indexes only (docs/token-stores.md says what each format reads when).
    """
    wanted = _check_options(dtype, eos_token_id, bos_token_id, vocab_size)
    files = list_store_files(_listing_path(str(path)), credentials=tuple(credentials), token=token)
    name = ALIASES.get(fmt, fmt) if fmt else _detect(files, str(path))
    if name is None:
        raise DatasetError(
            f"token store {str(path)!r} must be of a format its files tell, got files "
            f"{sorted(files.files)[:6]} — pass fmt= (one of {', '.join(FORMATS)})"
        )
    if name not in FORMATS:
        raise ConfigError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r} — fix fmt=")
    try:
        return _open(files, name, str(path), wanted, eos_token_id, bos_token_id, tokens_field, text_field, vocab_size)
    except ZephonError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:  # an index of another shape
        raise DatasetError(
            f"token store {str(path)!r} ({name}) must have index files of the layout docs/token-stores.md describes, "
            f"got {type(exc).__name__}: {one_line(exc)} — the index is damaged or written by another tool: write "
            "the store again"
        ) from None


def _open(
    files: StoreFiles,
    name: str,
    path: str,
    wanted: np.dtype | None,
    eos_token_id: int | None,
    bos_token_id: int | None,
    tokens_field: str | None,
    text_field: str | None,
    vocab_size: int | None,
) -> TokenStore:
    """``open_token_store`` of a known format ``name``: its parts read from their indexes."""
    tokenizer: str | None = None
    holds = "tokens"
    if name == "megatron":
        parts: list = megatron_parts(files)
    elif name == "datatrove":
        parts = datatrove_parts(files, wanted)
        tokenizer = parts[0].tokenizer
    elif name == "olmo":
        parts = olmo_parts(files, wanted, eos_token_id, bos_token_id)
    elif name == "litdata":
        holds, _, parts = litdata_parts(files, text_field or "text")
    elif name == "mds":
        parts = mds_parts(files, tokens_field, text_field, wanted)
        holds = parts[0].holds if parts else "tokens"
    else:
        parts = column_parts(files, name, tokens_field)
    store_dtype = parts[0].dtype if parts and holds == "tokens" else None
    return TokenStore(
        format=name,
        path=files.path if name != "olmo" or not path.endswith(".npy") else path,
        holds=holds,  # type: ignore[arg-type]
        dtype=store_dtype,
        parts=parts,
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        eos_token_id=eos_token_id,
        pins=files.pins(),
    )
