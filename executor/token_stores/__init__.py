"""Readers of token stores: corpora already tokenized by other tools, read natively (NumPy and each format's
index; no megatron-core, litdata, mosaicml-streaming or datatrove).

This is the reader layer (docs/token-stores.md); planning over token stores builds on it. One interface for
every format: :func:`open_token_store` gives a :class:`TokenStore` — its documents, their exact token counts
from the indexes (:meth:`TokenStore.token_counts`), and range reads (:meth:`TokenStore.read` →
:class:`TokenDocuments`). Formats: Megatron-Core ``.idx``/``.bin``, OLMo/Dolma numpy files, datatrove ``.ds``,
litData chunks, Mosaic MDS, Parquet/JSONL ``list<int>`` columns; each from local disk, ``s3://``, ``gs://``,
``az://`` or ``hf://datasets/ORG/NAME[@REVISION]/PATH``.
"""

from zephon.executor.token_stores.opening import ALIASES, FORMATS, detect_format, open_token_store
from zephon.executor.token_stores.store import StorePart, TokenDocuments, TokenStore

__all__ = [
    "ALIASES",
    "FORMATS",
    "StorePart",
    "TokenDocuments",
    "TokenStore",
    "detect_format",
    "open_token_store",
]
