"""Per-token flags carried inside the token ids from encoding to batching: the loss mask and segment starts.

Chat documents have a loss mask (which tokens train), and documents split by ``max_tokens`` have segment starts
inside them (where position ids restart). Rather than a second array beside the ids through every stage that
copies tokens — lanes, the exact plan's document cache, packing, read-ahead — the flags ride in high bits of
the int64 ids, which no vocabulary reaches (ids are < 2**31):

* ``LOSS`` (bit 40): the token counts toward the loss;
* ``SEGMENT`` (bit 41): a new segment starts at this token (a piece of a split document).

Invariant: every stage between ``Encoder.encode_flat`` and ``Batch`` moves ids without reading them (they check
only sizes), so a flagged id arrives at its row and column exactly as its plain id would; ``untag`` then
clears the bits before anyone sees the tokens. Padding is never flagged: its loss mask is 0. Encoders that
produce no flags (the documented API's text tokenization) skip ``untag`` entirely, so their hot path is unchanged.

Example: ids [7, 8, 9] with mask [0, 1, 1] are carried as [7, 8 | LOSS, 9 | LOSS]; ``untag`` gives back
tokens [7, 8, 9] and loss mask [False, True, True].
"""

from __future__ import annotations

import numpy as np

LOSS = np.int64(1 << 40)
SEGMENT = np.int64(1 << 41)
_ID_BITS = np.int64((1 << 40) - 1)


def tag(ids: np.ndarray, loss: np.ndarray | None = None, segment: np.ndarray | None = None) -> np.ndarray:
    """``ids`` (int64) with ``LOSS`` set where ``loss`` and ``SEGMENT`` where ``segment`` (bool arrays)."""
    out = ids.astype(np.int64, copy=True)
    if loss is not None:
        out[loss] |= LOSS
    if segment is not None:
        out[segment] |= SEGMENT
    return out


def untag(tokens: np.ndarray, doc_start: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plain tokens, document starts including segment starts, and the loss mask (bool) of flagged rows."""
    loss = (tokens & LOSS) != 0
    starts = doc_start | ((tokens & SEGMENT) != 0)
    return tokens & _ID_BITS, starts, loss
