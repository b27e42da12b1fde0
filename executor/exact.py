"""Producing the sequences of an exact plan, each one on its own, without producing those before it.

In an exact plan every document's token count is known, so the plan fixes every sequence:

* ``wrap``: sequence ``k`` is tokens ``[k·L, (k+1)·L)`` of the global stream; ``samples.token_offset`` gives
  each document's first token, so the documents of sequence ``k`` are found by a binary search (footer
  statistics pick the row group, then one row group is searched);
* ``best_fit``: ``bins.parquet`` lists, per sequence, the pieces (position, doc_start, length, offset).

Either way a sequence is a list of pieces; the pieces' documents are read, tokenized, checked against the
plan's token counts, and sliced. Recently tokenized documents are kept, because a document often spans
consecutive sequences.

Example, L = 4, documents of 3, 2 and 4 tokens (offsets 0, 3, 5): sequence 1 = stream tokens 4..7 =
doc 1 tokens 1..1 (offset 0), doc 2 tokens 0..2 (offset 1).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from zephon.errors import DatasetError, PlanFormatError
from zephon.executor.pack import PackedRows, make_pieces
from zephon.executor.plan_reader import PlanBundle, RowGroupIndex
from zephon.executor.shard_reader import ShardReader
from zephon.executor.tokenize import Encoder


@dataclass(frozen=True, kw_only=True, slots=True)
class Piece:
    position: int
    doc_start: int
    length: int
    offset: int


class ExactSequences:
    """Sequence ``k`` of an exact plan as a packed row."""

    def __init__(self, plan: PlanBundle, encoder: Encoder, reader: ShardReader, pad_id: int) -> None:
        packing = plan.manifest["packing"]
        self.plan = plan
        self.max_length = int(packing["max_length"])
        self.algorithm = packing["algorithm"]
        self.num_sequences = int(packing["sequences"])
        self.encoder = encoder
        self.reader = reader
        self.pad_id = pad_id
        self.samples = RowGroupIndex(
            plan.sample_files[0], ["dataset_id", "shard_id", "row", "tokens", "token_offset"], key="token_offset"
        )
        self.total_tokens = int(plan.manifest["totals"]["tokens"])
        self.bins = (
            RowGroupIndex(
                plan.path / plan.manifest["files"]["bins"],
                ["sequence", "offset", "position", "doc_start", "length"],
                key="sequence",
            )
            if self.algorithm == "best_fit"
            else None
        )
        self._docs: OrderedDict[int, np.ndarray] = OrderedDict()

    def pieces(self, k: int) -> list[Piece]:
        if not 0 <= k < self.num_sequences:
            raise IndexError(f"sequence must be in [0, {self.num_sequences}), got {k}")
        if self.bins is not None:
            first = self.bins.find("sequence", k - 1) + 1
            last = self.bins.find("sequence", k)
            rows = self.bins.rows(np.arange(first, last + 1))
            return [
                Piece(position=int(p), doc_start=int(s), length=int(n), offset=int(o))
                for p, s, n, o in zip(rows["position"], rows["doc_start"], rows["length"], rows["offset"], strict=True)
            ]
        start, end = k * self.max_length, min((k + 1) * self.max_length, self.total_tokens)
        position = self.samples.find("token_offset", start)
        out = []
        while position < self.samples.num_rows:
            block = np.arange(position, min(position + 64, self.samples.num_rows))
            rows = self.samples.rows(block)
            for pos, doc_offset, doc_tokens in zip(
                block.tolist(), rows["token_offset"].tolist(), rows["tokens"].tolist(), strict=True
            ):
                if doc_offset >= end:
                    return out
                lo, hi = max(start, doc_offset), min(end, doc_offset + doc_tokens)
                if hi > lo:
                    out.append(Piece(position=pos, doc_start=lo - doc_offset, length=hi - lo, offset=lo - start))
            position = int(block[-1]) + 1
        return out

    def _fetch(self, positions: list[int]) -> None:
        missing = sorted({p for p in positions if p not in self._docs})
        if not missing:
            return
        rows = self.samples.rows(np.array(missing, dtype=np.int64))
        texts = self.reader.texts(rows["shard_id"], rows["row"])
        for i, (position, ids) in enumerate(zip(missing, self.encoder.encode(texts), strict=True)):
            if len(ids) != rows["tokens"][i]:
                ref = self.reader.ref(int(rows["shard_id"][i]))
                raise DatasetError(
                    f"dataset {ref.dataset!r}: shard {ref.uri} row {int(rows['row'][i])} (plan position {position}) "
                    f"must have {int(rows['tokens'][i])} tokens as counted at planning, got {len(ids)} — the data "
                    "or tokenizer changed; re-plan"
                )
            self._docs[position] = ids
        while len(self._docs) > 4096:
            self._docs.popitem(last=False)

    def rows(self, ks: list[int]) -> PackedRows:
        """Packed rows of the sequences ``ks`` (in that order)."""
        all_pieces = [self.pieces(k) for k in ks]
        self._fetch([p.position for pieces in all_pieces for p in pieces])
        tokens = np.full((len(ks), self.max_length), self.pad_id, dtype=np.int64)
        starts = np.zeros((len(ks), self.max_length), dtype=bool)
        lengths = np.zeros(len(ks), dtype=np.int64)
        records = []
        for r, pieces in enumerate(all_pieces):
            for p in pieces:
                records.append((r, p.offset, p.position, p.doc_start, p.length))
                doc = self._docs[p.position]
                if p.doc_start + p.length > len(doc):
                    raise PlanFormatError(f"plan piece {p} must lie inside its document of {len(doc)} tokens — re-plan")
                tokens[r, p.offset : p.offset + p.length] = doc[p.doc_start : p.doc_start + p.length]
                starts[r, p.offset] = p.doc_start == 0 or self.algorithm == "best_fit"
                lengths[r] = max(lengths[r], p.offset + p.length)
        return PackedRows(tokens=tokens, doc_start=starts, lengths=lengths, pieces=make_pieces(records))
