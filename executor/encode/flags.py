"""Token ids as int32 from encoding to batching, with per-token flags beside them: the loss mask, segment starts.

Ids travel as ``ID`` (int32: every real vocabulary is < 2**31 ids) through every stage that copies tokens —
lanes, the exact plan's document cache, packing, read-ahead — half the bytes of int64. ``to_training`` widens
them to int64 once, as it writes ``input_ids`` and ``labels`` (``zephon.executor.batch``).

Chat documents have a loss mask (which tokens train), and documents split by ``max_tokens`` have segment starts
inside them (where position ids restart). Their encoders produce ``FLAGGED`` tokens: a record of the int32 id
and a uint8 of flags beside it (5 bytes a token, packed), so the stages move ids and flags with the same single
copy and never read either:

* ``LOSS`` (bit 0 of ``flags``): the token counts toward the loss;
* ``SEGMENT`` (bit 1): a new segment starts at this token (a piece of a split document).

Invariant: every stage between ``Encoder.encode_flat`` and ``Batch`` moves tokens without reading them (they
check only sizes), in arrays of the dtype the encoder gives (``token_dtype``), so a token arrives at its row
and column with its flags; ``untag`` then splits the records into plain ids, segment starts and the loss mask.
Padding is never flagged: its loss mask is 0. Encoders that produce no flags (the documented API's text
tokenization) give plain int32 ids and skip ``untag`` entirely.

Example: ids [7, 8, 9] with mask [0, 1, 1] are carried as records (7, 0), (8, LOSS), (9, LOSS); ``untag`` gives
back ids [7, 8, 9] (int32) and loss mask [False, True, True].
"""

from __future__ import annotations

import numpy as np

from zephon.errors import DatasetError

#: Plain token ids.
ID = np.dtype(np.int32)
#: Ids with their flags beside them (chat, split documents).
FLAGGED = np.dtype([("id", np.int32), ("flags", np.uint8)])
LOSS = np.uint8(1)
SEGMENT = np.uint8(2)
#: The largest id ``ID`` holds.
MAX_ID = int(np.iinfo(np.int32).max)


def token_dtype(encoder: object) -> np.dtype:
    """The dtype an encoder's tokens travel in: ``FLAGGED`` when it sets flags, else ``ID``."""
    return FLAGGED if bool(getattr(encoder, "flags", False)) else ID


def as_ids(ids: np.ndarray, what: str = "token ids") -> np.ndarray:
    """``ids`` as ``ID`` (no copy when they already are); ids past ``MAX_ID`` are refused, never wrapped."""
    if ids.dtype == ID or ids.dtype == FLAGGED:
        return ids
    if ids.size and ids.dtype.itemsize >= 4 and (int(ids.max()) > MAX_ID or int(ids.min()) < 0):
        bad = int(ids.max()) if int(ids.max()) > MAX_ID else int(ids.min())
        raise DatasetError(f"{what} must be in [0, {MAX_ID}] to travel as int32, got {bad} — check the store's vocab")
    return ids.astype(ID)


def tag(ids: np.ndarray, loss: np.ndarray | None = None, segment: np.ndarray | None = None) -> np.ndarray:
    """``ids`` (plain or ``FLAGGED``) as ``FLAGGED`` records with ``LOSS`` set where ``loss`` and ``SEGMENT`` where
    ``segment`` (bool arrays)."""
    out = np.zeros(ids.shape, dtype=FLAGGED)
    if ids.dtype == FLAGGED:
        out[...] = ids
    else:
        out["id"] = ids
    if loss is not None:
        out["flags"][loss] |= LOSS
    if segment is not None:
        out["flags"][segment] |= SEGMENT
    return out


def training(ids: np.ndarray) -> np.ndarray:
    """Stored ids as ``FLAGGED`` records that all train (``LOSS`` set): a token store's documents in a run whose
    ids carry flags. Ids already ``FLAGGED`` (a store's own loss mask) are kept as they are."""
    if ids.dtype == FLAGGED:
        return ids
    return tag(ids, loss=np.ones(ids.shape, dtype=bool))


def filled(shape: int | tuple[int, ...], pad_id: int, dtype: np.dtype) -> np.ndarray:
    """An array of ``pad_id`` tokens (no flags) of ``dtype`` (``ID`` or ``FLAGGED``)."""
    if dtype == FLAGGED:
        out = np.zeros(shape, dtype=FLAGGED)
        out["id"] = pad_id
        return out
    return np.full(shape, pad_id, dtype=dtype)


def join(parts: list[np.ndarray]) -> np.ndarray:
    """``parts`` end to end; plain parts become ``FLAGGED`` (no flags) when any part is."""
    if any(p.dtype == FLAGGED for p in parts):
        parts = [p if p.dtype == FLAGGED else tag(p) for p in parts]
        return np.concatenate(parts) if parts else np.empty(0, dtype=FLAGGED)
    return np.concatenate([as_ids(p) for p in parts]) if parts else np.empty(0, dtype=ID)


def plain(tokens: np.ndarray) -> np.ndarray:
    """The ids of ``tokens`` (plain or ``FLAGGED``), as a contiguous ``ID`` array."""
    return np.ascontiguousarray(tokens["id"]) if tokens.dtype == FLAGGED else tokens


def untag(
    tokens: np.ndarray, doc_start: np.ndarray, masks_loss: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Plain ids (contiguous int32), document starts including segment starts, and the loss mask (bool) of
    ``FLAGGED`` rows — None when the encoder does not mask the loss (``masks_loss`` False: a text run whose ids
    are flagged only for segments, ``long_documents="split"``; its ``LOSS`` bits are never set, and a mask of
    them would train on nothing)."""
    flags = tokens["flags"]
    return plain(tokens), doc_start | ((flags & SEGMENT) != 0), (flags & LOSS) != 0 if masks_loss else None
