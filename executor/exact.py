"""Producing the sequences of an exact plan, each one on its own, without producing those before it.

In an exact plan every document's token count is known, so the plan fixes every sequence:

* ``wrap``: sequence ``k`` is tokens ``[k·L, (k+1)·L)`` of the global stream
  (``zephon.executor.step_arithmetic``); ``samples.token_offset`` gives each document's first token, so the
  documents of sequence ``k`` are found by a binary search (footer statistics pick the row group, then one row
  group is searched);
* ``best_fit`` and ``homogeneous``: ``bins.parquet`` lists, per sequence, the pieces (position, doc_start,
  length, offset).

Either way a sequence is a list of pieces; the pieces' documents are read, tokenized, checked against the
plan's token counts, and sliced. The documents of the previous microbatch are kept, because a document often
spans consecutive sequences (a long one, many microbatches).

Example, L = 4, documents of 3, 2 and 4 tokens (offsets 0, 3, 5): sequence 1 = stream tokens 4..7 =
doc 1 tokens 1..1 (offset 0), doc 2 tokens 0..2 (offset 1).

Everything is computed for a whole chunk of microbatches at once (``rows_many``), in numpy: binary searches for
the sequences' first and last documents, the pieces from ``np.repeat`` over those ranges, and the tokens copied
one span per run of rows where contiguous, else by one gather (``zephon.executor.pack.exact_rows``); Python work
grows with neither the documents nor the microbatches of a chunk.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from zephon.errors import DatasetError, PlanFormatError
from zephon.executor.encode.flags import token_dtype
from zephon.executor.encode.slices import encode_in_slices
from zephon.executor.encode.text import Encoded, Encoder
from zephon.executor.engines.at_document import AtDocument
from zephon.executor.operators import dropped_since_planning
from zephon.executor.pack.exact_rows import cut_rows, split_rows
from zephon.executor.pack.rows import PIECE_DTYPE, PackedRows
from zephon.executor.pack.spans import merge_tail, spread
from zephon.executor.plan_reader import PlanBundle, RowGroupIndex
from zephon.executor.read.shard_reader import ShardReader
from zephon.executor.sorted_sets import isin_sorted, unique_sorted
from zephon.executor.step_arithmetic import sequence_tokens
from zephon.executor.truncations import Truncations

if TYPE_CHECKING:
    from zephon.executor.encode.encoders import ChatEncoder, TextEncoder

#: Documents read and tokenized together when calls step steadily through the sequences, and how many
#: microbatches ahead that may reach (64 bound a window's tokens whatever the document lengths; a call of a
#: chunk of microbatches counts as that many).
READ_AHEAD, MAX_AHEAD_CALLS = 4096, 64
#: Read-ahead windows in flight at once: read one after another on one thread, each then tokenized whole on
#: one of the encoder's threads (several at once), taken back in order.
JOBS = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class Piece:
    position: int
    doc_start: int
    length: int
    offset: int


def _ready(job: Future[Future[Encoded]]) -> bool:
    """The read job and the encode job it started are both finished (or the read failed)."""
    if not job.done():
        return False
    return job.exception() is not None or job.result().done()


def _ranges(first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For inclusive ranges ``[first[i], last[i]]``: every value, and the index ``i`` it came from."""
    counts = np.maximum(last - first + 1, 0)
    owner = np.repeat(np.arange(len(first), dtype=np.int64), counts)
    start_of_owner = np.cumsum(counts) - counts
    return first[owner] + np.arange(int(counts.sum()), dtype=np.int64) - start_of_owner[owner], owner


class ExactSequences:
    """Sequence ``k`` of an exact plan as a packed row."""

    def __init__(
        self,
        plan: PlanBundle,
        encoder: Encoder | TextEncoder | ChatEncoder,
        reader: ShardReader,
        pad_id: int,
        *,
        background: bool = False,
        truncations: Truncations | None = None,
    ) -> None:
        packing = plan.manifest.exact_packing()
        self.truncations = truncations  # the documents max_tokens cut, held until handed out (runner's stats)
        self.plan = plan
        self.max_length = packing.max_length
        self.algorithm = packing.algorithm
        self.num_sequences = packing.sequences
        self.encoder = encoder
        self.reader = reader
        self.pad_id = pad_id
        self.samples = RowGroupIndex(plan.checked.samples, ["dataset_id", "shard_id", "row", "tokens", "token_offset"])
        assert plan.manifest.totals.tokens is not None  # read_manifest requires it of exact plans
        self.total_tokens = plan.manifest.totals.tokens
        self.bins = (
            RowGroupIndex(
                [plan.checked.bins],  # type: ignore[list-item]  # read_manifest requires it of best-fit plans
                ["sequence", "offset", "position", "doc_start", "length"],
            )
            if self.algorithm != "wrap"  # best_fit and homogeneous plans list their rows' pieces
            else None
        )
        empty = np.empty(0, dtype=np.int64)
        #: Tokenized documents: sorted positions, start and size of each in the token array, the array (of the
        #: encoder's token dtype: int32 ids, or ids with flags beside them, ``zephon.executor.encode.flags``).
        self._cache: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = (
            empty, empty, empty, np.empty(0, dtype=token_dtype(encoder))
        )  # fmt: skip
        #: The dataset of each cached document (parallel to ``_cache[0]``): the provenance the stats count by.
        self._datasets = np.empty(0, dtype=np.int16)
        self._prev: np.ndarray | None = None  # the sequences of the previous call
        self._stride: tuple[int, int] | None = None  # steady stride of the calls, and the calls read ahead
        self._microbatches = 1  # microbatches in the current call (rows_many)
        #: Read ahead on a thread (``zephon.executor.read.ahead``); the sequences of the last call covered.
        self.background = background
        self._reach: np.ndarray | None = None
        #: Windows in flight, oldest first (at most ``JOBS``): positions, their samples rows, and the read job
        #: whose result is the encode job.
        self._jobs: list[tuple[np.ndarray, dict[str, np.ndarray], Future[Future[Encoded]]]] = []
        self._read_pool: ThreadPoolExecutor | None = None
        self._encode_pool: ThreadPoolExecutor | None = None

    def _pieces(self, ks: np.ndarray) -> np.ndarray:
        """The pieces of sequences ``ks`` (``PIECE_DTYPE``; ``row`` = index into ``ks``), in row order."""
        if len(ks) and (ks.min() < 0 or ks.max() >= self.num_sequences):
            bad = int(ks[(ks < 0) | (ks >= self.num_sequences)][0])
            raise IndexError(f"sequence must be in [0, {self.num_sequences}), got {bad}")
        if self.bins is not None:
            first = self.bins.find_many("sequence", ks - 1) + 1
            last = self.bins.find_many("sequence", ks)
            index, row = _ranges(first, last)
            cols = self.bins.rows(index)
            out = np.empty(len(index), dtype=PIECE_DTYPE)
            out["row"], out["offset"], out["position"] = row, cols["offset"], cols["position"]
            out["doc_start"], out["length"] = cols["doc_start"], cols["length"]
            return out
        start, end = sequence_tokens(ks, ks + 1, self.max_length)
        end = np.minimum(end, self.total_tokens)
        first = self.samples.find_many("token_offset", start)
        last = self.samples.find_many("token_offset", end - 1)
        position, row = _ranges(first, last)
        cols = self.samples.rows(position)
        doc_offset, doc_tokens = cols["token_offset"], cols["tokens"]
        lo = np.maximum(start[row], doc_offset)
        hi = np.minimum(end[row], doc_offset + doc_tokens)
        keep = hi > lo
        out = np.empty(int(keep.sum()), dtype=PIECE_DTYPE)
        out["row"], out["position"] = row[keep], position[keep]
        out["offset"] = (lo - start[row])[keep]
        out["doc_start"] = (lo - doc_offset)[keep]
        out["length"] = (hi - lo)[keep]
        return out

    def pieces(self, k: int) -> list[Piece]:
        """The pieces of sequence ``k``."""
        return [
            Piece(position=int(position), doc_start=int(doc_start), length=int(length), offset=int(offset))
            for _, offset, position, doc_start, length in self._pieces(np.array([k], dtype=np.int64)).tolist()
        ]

    def _upcoming(self, ks: np.ndarray, needed: int) -> np.ndarray:
        """Positions the next calls will likely need, when calls step through the sequences at a steady
        stride (one rank, one DataLoader worker): read ahead so that each read is about ``READ_AHEAD``
        documents, not one microbatch's — Parquet reads and tokenizer calls have a fixed cost per call."""
        prev, self._prev = self._prev, ks
        self._stride = None if prev is None else self._steady(prev, ks, needed)
        if self._stride is None:
            return np.empty(0, dtype=np.int64)
        step, calls = self._stride
        self._reach = ks + step * calls
        return self._positions_of(ks, step, 1, calls)

    def _steady(self, ks: np.ndarray, then: np.ndarray, needed: int) -> tuple[int, int] | None:
        """The stride from call ``ks`` to call ``then`` (the same number of sequences, each one step further on)
        and how many calls to read ahead at it (about ``READ_AHEAD`` documents, ``needed`` a call, at most
        ``MAX_AHEAD_CALLS`` microbatches); None when the calls do not step steadily."""
        if len(ks) != len(then) or not len(ks):
            return None
        step = then - ks
        if step[0] <= 0 or np.any(step != step[0]):
            return None
        most = max(1, MAX_AHEAD_CALLS // self._microbatches)
        return int(step[0]), int(min(most, max(1, -(-READ_AHEAD // max(needed, 1)))))

    def _positions_of(self, ks: np.ndarray, step: int, first: int, last: int) -> np.ndarray:
        """The documents of calls ``first..last`` after ``ks`` at this stride (sorted, unique)."""
        ahead = (ks[None, :] + step * np.arange(first, last + 1)[:, None]).ravel()
        ahead = ahead[ahead < self.num_sequences]
        return unique_sorted(self._pieces(ahead)["position"]) if len(ahead) else np.empty(0, dtype=np.int64)

    def _fetch(
        self, ks: np.ndarray, positions: np.ndarray, upcoming: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The document cache, holding at least ``positions`` (sorted, unique): positions, start and size of
        each document in the token array, and the array. Missing documents are read and tokenized in one
        batch, with those the next calls will need (``_upcoming``), and their counts checked against the
        plan; documents before ``positions`` are dropped (a document spanning several sequences, or several
        microbatches, is tokenized once). With ``background``, the documents of the calls after those are
        read and tokenized on a thread meanwhile (``_schedule``; ``upcoming``: the next call's sequences, where
        the caller knows them: ``_expect``)."""
        while self._jobs and (_ready(self._jobs[0][2]) or not isin_sorted(positions, self._cache[0]).all()):
            if not self._collect(positions):
                break
        cached = self._cache[0]
        missing = positions[~isin_sorted(positions, cached)]
        if len(missing):
            ahead = self._upcoming(ks, len(positions))
            want = np.union1d(missing, ahead[~isin_sorted(ahead, cached)])
            rows = self.samples.rows(want)
            encoded = self._encode(rows["shard_id"], rows["row"], split=True)
            self._merge(positions, want, rows, encoded)
        else:
            self._prev = ks
        if self.background:
            if upcoming is not None and self._stride is None:
                self._expect(ks, upcoming, len(positions))
            self._schedule(ks)
        return self._cache

    def _expect(self, ks: np.ndarray, upcoming: np.ndarray, needed: int) -> None:
        """The next call's sequences, told by the caller (``exact_microbatches``) while the calls so far show no
        steady stride — a run's first calls: one microbatch alone, then a chunk of them, each of which read its
        documents inline (two chunks' reading and tokenizing on the caller's thread, ~0.35 CPU s of a 24 M-token
        plan's ~0.9). The same number of sequences at one step from this call's: that step is the stride from
        now on, and windows are scheduled from this call on (``_schedule``); else the next call's documents are
        read ahead as one window. Either way only which thread reads, and when, changes: never the rows."""
        self._stride = self._steady(ks, upcoming, needed)
        if self._stride is not None:
            self._reach = ks  # no call after this one covered yet
            return
        if len(self._jobs) < JOBS and len(upcoming):
            self._submit(self._unread(unique_sorted(self._pieces(upcoming)["position"])))

    def _unread(self, want: np.ndarray) -> np.ndarray:
        """``want`` (sorted, unique positions) less those cached or in a window in flight."""
        want = want[~isin_sorted(want, self._cache[0])]
        for pending, _, _ in self._jobs:  # each job: (its positions, their samples rows, the read)
            want = want[~isin_sorted(want, pending)]  # pending: a window's positions, sorted and unique
        return want

    def _encode(self, shard_ids: np.ndarray, row_ids: np.ndarray, *, split: bool, texts: list | None = None) -> Encoded:
        """The documents at (shard, row), read (unless ``texts`` are given) and encoded; an error about one
        document (``AtDocument``) names its dataset, shard and row."""
        docs = texts if texts is not None else self.reader.texts(shard_ids, row_ids)
        # no skip policy in an exact plan: only an operator drops a document (found by identity: a store's are arrays)
        dropped = next((i for i, doc in enumerate(docs) if doc is None), None) if isinstance(docs, list) else None
        if dropped is not None:
            ref = self.reader.ref(int(shard_ids[dropped]))
            raise dropped_since_planning(f"dataset {ref.dataset!r}: shard {ref.uri} row {int(row_ids[dropped])}")
        try:
            return encode_in_slices(self.encoder, docs, split=split)
        except AtDocument as exc:
            i = exc.index
            raise exc.located(self.reader.ref(int(shard_ids[i])), int(row_ids[i])) from None

    def _schedule(self, ks: np.ndarray) -> None:
        """Keep up to ``JOBS`` windows ahead: start reading the calls after those already covered
        (``_reach``), window after window, while at most ``JOBS - 1`` windows of covered calls are left and
        fewer than ``JOBS`` jobs are in flight. A read thread reads a window, hands its texts to an encode
        thread and reads the next, so the encoder's threads are busy while the next window is decoded (with a
        new window only when one was left, both encode threads finished together and waited for the read:
        ~0.93 of raw tiktoken on 2 cores, against ~1.0 now). Until ``_collect`` has taken every job, only
        these threads use the reader and the encoder."""
        while self._schedule_one(ks):
            pass

    def _schedule_one(self, ks: np.ndarray) -> bool:
        """Schedule the next window if there is room; True when ``_reach`` moved on (so try the next)."""
        if len(self._jobs) >= JOBS or self._stride is None or self._reach is None:
            return False
        step, calls = self._stride
        if len(self._reach) != len(ks) or (int(self._reach[0]) - int(ks[0])) // step > calls * (JOBS - 1):
            return False
        want = self._unread(self._positions_of(self._reach, step, 1, calls))
        self._reach = self._reach + step * calls
        self._submit(want)
        return True

    def _submit(self, want: np.ndarray) -> None:
        """Read and tokenize the documents ``want`` (sorted, unique, not cached or pending) as one window: read on
        the read-ahead thread, tokenized on an encode thread, taken back in order by ``_collect``."""
        if not len(want):
            return
        rows = self.samples.rows(want)  # here: the row-group index is not thread-safe
        if self._read_pool is None or self._encode_pool is None:
            self._read_pool = ThreadPoolExecutor(1, thread_name_prefix="zephon-read-ahead")
            self._encode_pool = ThreadPoolExecutor(self.encoder.threads, thread_name_prefix="zephon-encode")
        shard_ids, row_ids, encode_pool = rows["shard_id"], rows["row"], self._encode_pool

        def read() -> Future[Encoded]:
            texts = self.reader.texts(shard_ids, row_ids)
            return encode_pool.submit(self._encode, shard_ids, row_ids, split=False, texts=texts)

        self._jobs.append((want, rows, self._read_pool.submit(read)))

    def _collect(self, positions: np.ndarray) -> bool:
        """Wait for the oldest read-ahead job and add its documents to the cache; True when it succeeded. A job
        that failed is dropped with every later one (read-ahead stops): the documents are read again when
        needed, which raises the same error at the same point as without read-ahead."""
        want, rows, job = self._jobs.pop(0)
        try:
            encoded = job.result().result()
        except Exception:
            self._reach = None
            for _, _, later in self._jobs:  # let them finish: the caller is about to use the reader itself
                with contextlib.suppress(Exception):
                    later.result().result()
            self._jobs.clear()
            return False
        self._merge(positions, want, rows, encoded)
        return True

    def close(self) -> None:
        """Stop reading ahead (waits for the jobs in flight)."""
        for pool in (self._read_pool, self._encode_pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._read_pool = self._encode_pool = None
        self._jobs.clear()

    def _merge(self, positions: np.ndarray, want: np.ndarray, rows: dict[str, np.ndarray], encoded: Encoded) -> None:
        """Add the documents ``want`` (rows ``rows`` of the samples table, tokenized: ``encoded``) to the cache,
        after checking their token counts against the plan, and drop cached documents before ``positions``."""
        cached, base, size, tokens = self._cache
        new_size = encoded.sizes
        wrong = np.flatnonzero(new_size != rows["tokens"])
        if len(wrong):
            i = int(wrong[0])
            ref = self.reader.ref(int(rows["shard_id"][i]))
            raise DatasetError(
                f"dataset {ref.dataset!r}: shard {ref.uri} row {int(rows['row'][i])} (plan position "
                f"{int(want[i])}) must have {int(rows['tokens'][i])} tokens as counted at planning, got "
                f"{int(new_size[i])} — the data, the tokenizer or an operator's output changed; re-plan"
            )
        if self.truncations is not None:
            self.truncations.drop_before(int(positions[0]))  # as the cache does (below)
            self.truncations.add(want, rows["dataset_id"], encoded.cut)
        keep = np.flatnonzero((cached >= positions[0]) & ~isin_sorted(cached, want))
        if len(keep) > 8 * READ_AHEAD:  # calls jumped around: keep what this call needs
            keep = keep[isin_sorted(cached[keep], positions)]
        merged = np.concatenate([cached[keep], want])
        sizes = np.concatenate([size[keep], new_size])
        tail = merge_tail(keep, base, size, tokens, cached, want, encoded.ids, new_size)  # steady: appended
        if tail is not None:
            (out, starts), order = tail, np.arange(len(merged))
        else:  # documents interleave (calls jumped around): gather by index (zephon.executor.pack.spans)
            order = np.argsort(merged, kind="stable")
            starts = np.empty(len(merged), dtype=np.int64)
            starts[order] = np.cumsum(sizes[order]) - sizes[order]
            out = np.empty(int(sizes.sum()), dtype=tokens.dtype)
            old = slice(0, len(keep))
            out[spread(starts[old], sizes[old])] = tokens[spread(base[keep], sizes[old])]
            new = slice(len(keep), None)
            out[spread(starts[new], sizes[new])] = encoded.ids
        self._cache = (merged[order], starts[order], sizes[order], out)
        self._datasets = np.concatenate([self._datasets[keep], rows["dataset_id"].astype(np.int16, copy=False)])[order]

    def rows(self, ks: list[int]) -> PackedRows:
        """Packed rows of the sequences ``ks`` (in that order)."""
        return self.rows_many([np.asarray(ks, dtype=np.int64)])[0][0]

    def rows_many(
        self, chunk: list[np.ndarray], upcoming: np.ndarray | None = None
    ) -> list[tuple[PackedRows, np.ndarray]]:
        """For each microbatch's sequences in ``chunk`` (each non-empty, in order): its packed rows and the dataset
        of each of their pieces — found, fetched and cut for the whole chunk at once (``pack.exact_rows``).
        ``upcoming``: the sequences of the next call, when the caller knows them (read ahead: ``_expect``)."""
        ks_array = np.concatenate(chunk) if len(chunk) > 1 else chunk[0]
        self._microbatches = len(chunk)
        pieces = self._pieces(ks_array)
        cached, base, sizes, source = self._fetch(ks_array, unique_sorted(pieces["position"]), upcoming)
        doc = np.searchsorted(cached, pieces["position"])
        doc_start = pieces["doc_start"].astype(np.int64)
        outside = np.flatnonzero(doc_start + pieces["length"] > sizes[doc])
        if len(outside):
            i = int(outside[0])
            raise PlanFormatError(
                f"plan piece {pieces[i]} must lie inside its document of {int(sizes[doc[i]])} tokens — re-plan"
            )
        packed = cut_rows(
            pieces, base[doc] + doc_start, source, rows=len(ks_array), width=self.max_length, pad_id=self.pad_id,
            starts_all=self.algorithm == "best_fit",
        )  # fmt: skip
        return split_rows(packed, self._datasets[doc], [len(ks) for ks in chunk])
