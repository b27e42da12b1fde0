"""User operators before tokenization: ``map_transform`` (record → record, or None to drop it) and ``map_batch``.

Operators are part of the curriculum: what a model sees depends on them as much as on the plan. So each is
*fingerprinted* — its qualified name, a SHA-256 of its source (of its code object when the source cannot be
read) and an optional ``version`` the user bumps when behaviour changes without the source changing (a
helper it calls, a file it reads) — and the fingerprints go into the encoder's fingerprint (hence the token
count cache, the plan's ``config_hash`` and the state) and by name into plan.json's config and the state, so
a state or an exact plan made with other operators is refused naming them.

They run where records are read (``zephon.executor.read.shard_reader``): on the read-ahead thread during training,
never on the thread that packs and yields batches, and in the count pass when planning, so an exact plan counts
exactly what training will tokenize. A dropped record is counted (``RunStats.skipped["dropped"]``) and, in an
exact plan, has 0 tokens: it is in no sequence.

Start-up check: on the first records an operator sees, it runs twice on copies of the same sample, and — for
``map_batch`` — once more on each half of it; outputs that differ mean a nondeterministic operator (or one
whose output for a record depends on the rest of the batch, which chunk sizes would change), refused with the
operator's name.

Worked example: ``map_transform(lambda r: None if len(r["text"]) < 10 else {**r, "text": r["text"].lower()})``
over records "Hello World, again" and "short" gives ["hello world, again", None]: the second is dropped and
counted, the first tokenized lower-cased.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon.errors import ConfigError, DatasetError, one_line
from zephon.plan.records import ShardRef

#: Records an operator's start-up check runs on.
SAMPLE = 16
KINDS = ("map_transform", "map_batch")


def source_hash(fn: Callable[..., Any]) -> str:
    """SHA-256 of the function's source, or of its code object (bytecode, constants, names) without it — also when
    the file its code names no longer parses at those lines (code run with ``exec`` under a file's name)."""
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError, SyntaxError, tokenize.TokenError):
        code = getattr(fn, "__code__", None)
        if code is None:
            raise ConfigError(
                f"operator must be a Python function or lambda, got {type(fn).__name__} — wrap it in a def"
            ) from None
        text = repr((code.co_code, code.co_consts, code.co_names))
    return hashlib.sha256(text.encode()).hexdigest()


def qualified_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a function (of its type for another callable): how operators and collates are named."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Operator:
    """One user operator: ``kind`` (``map_transform`` or ``map_batch``), the function, its qualified ``name``,
    ``source`` hash and optional ``version``; ``seeded``: ``fn(record, rng)`` gets a NumPy generator derived from
    the plan seed and the record's plan position (record pipelines only, ``zephon.executor.records.transforms``)."""

    kind: str
    fn: Callable[..., Any]
    name: str
    source: str
    version: str | None = None
    seeded: bool = False

    @classmethod
    def of(
        cls, kind: str, fn: Callable[..., Any], version: str | int | None = None, *, seeded: bool = False
    ) -> Operator:
        if kind not in KINDS:
            raise ConfigError(f"operator kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not callable(fn):
            raise ConfigError(f"{kind} must be given a function, got {type(fn).__name__} — pass a def or lambda")
        name = qualified_name(fn)
        if not isinstance(seeded, bool):
            raise ConfigError(f"{kind} seeded must be True or False, got {seeded!r}")
        return cls(
            kind=kind,
            fn=fn,
            name=name,
            source=source_hash(fn),
            version=None if version is None else str(version),
            seeded=seeded,
        )

    @property
    def fingerprint(self) -> str:
        text = f"{self.kind}\0{self.name}\0{self.source}\0{self.version}" + ("\0seeded" if self.seeded else "")
        return hashlib.sha256(text.encode()).hexdigest()

    def describe(self) -> dict[str, str | None]:
        """What plan.json and the state record: kind, name, version and fingerprint (and ``seeded`` when set:
        descriptions of unseeded operators are as they were)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "version": self.version,
            "fingerprint": self.fingerprint,
        }
        if self.seeded:
            out["seeded"] = True
        return out


def dropped_since_planning(where: str) -> DatasetError:
    """The error for a document an exact plan counted and the operators drop now (``where``: dataset, shard,
    row): operators whose output differs between processes, which the start-up check, in one process, cannot see.
    A document they dropped at planning has 0 tokens and is in no sequence, so it is never read."""
    return DatasetError(
        f"{where} must be a document, as when the exact plan counted its tokens, got it dropped by the operators "
        "now — operators must give the same output in every process: make their choices from the record with a "
        "stable hash (hashlib), not Python's hash() of a string, which changes from process to process"
    )


def outputs_digest(kept: list[int], tokens: np.ndarray) -> str:
    """What the operators made of an estimated run's calibration documents — which they kept, and the tokens of
    each kept one — in 16 hex digits: the same in every process while the operators depend on their records only.
    A state carries it (``num_steps.outputs``), so a resume in another process, or the merge of the ranks'
    states, shows a difference the start-up check (one process) cannot see."""
    digest = hashlib.sha256(np.asarray(kept, dtype=np.int64).tobytes())
    digest.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return digest.hexdigest()[:16]


def differing_outputs(other: str) -> ConfigError:
    """The error when ``outputs_digest`` differs from ``other``'s (another process's)."""
    return ConfigError(
        "the map_transform/map_batch operators must make the same documents of the plan's first documents in every "
        f"process, got other documents or token counts than {other} — an operator depends on more than its record "
        "(Python's hash() of a string changes from process to process: use hashlib or zlib.crc32; random without "
        "a seed derived from the record): fix it and start the run afresh"
    )


def resumed_length(known: dict[str, Any], outputs: str | None) -> tuple[int | None, str | None]:
    """From a state's ``num_steps`` (of this plan and ``drop_last``): the run's steps to adopt (None: measure them
    again) and what the operators made of the calibration documents (``operators.outputs_digest``) to expect.
    ``outputs``: what they made in this process, if measured already. The state's outputs, when it has any, are
    compared with this process's — now, or once measured (its steps are not adopted until then)."""
    saved = known.get("outputs")
    if saved is None or saved == outputs:
        return int(known["steps"]), outputs
    if outputs is not None:
        raise differing_outputs("the run this state was saved from")
    return None, saved


def expect_outputs(expected: str | None, made: str) -> str:
    """``made`` (``operators.outputs_digest`` of this process's calibration), refused unless it is ``expected``
    (a resumed state's; None: nothing to compare with)."""
    if expected not in (None, made):
        raise differing_outputs("the run this state was saved from")
    return made


def all_dropped(total: int, share: str, *, counted: bool = False) -> DatasetError:
    """The error for operators that dropped (returned None for) every one of ``total`` documents of ``share`` — in
    a run, or (``counted``) when an exact plan counted them."""
    when = " when the exact plan counted them" if counted else ""
    return DatasetError(
        f"the operators must leave documents to train on, got all {total} documents of {share} dropped (returned "
        f"None){when} — check when the map_transform/map_batch functions return None"
    )


def describe(operators: tuple[Operator, ...]) -> list[dict[str, str | None]]:
    return [op.describe() for op in operators]


def names(described: object) -> str:
    """Operators (as ``describe`` lists them) in words: ``map_transform mod.f (v2), map_batch mod.g``."""
    if not described:
        return "none"
    items = described if isinstance(described, list) else []
    parts = []
    for d in items:
        version = f" (version {d.get('version')})" if isinstance(d, dict) and d.get("version") else ""
        parts.append(f"{d.get('kind')} {d.get('name')}{version}" if isinstance(d, dict) else repr(d))
    return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Where:
    """A record's location: its shard and row (and a WebDataset sample's key, which messages name too)."""

    ref: ShardRef
    row: int
    key: str | None = None

    def __str__(self) -> str:
        key = f" key {self.key!r}" if self.key is not None else ""
        return f"dataset {self.ref.dataset!r}: shard {self.ref.uri} row {self.row}{key}"


def _check_count(op: Operator, expected: int, got: Any, first: Where) -> None:
    """A ``map_batch`` output must be a list of one output per input record."""
    if not isinstance(got, list) or len(got) != expected:
        size = len(got) if isinstance(got, list) else type(got).__name__
        raise DatasetError(
            f"{first}: map_batch {op.name} must return a list of {expected} records (one per record, None to drop "
            f"one), got {size} — return one output per input"
        )


class OperatorChain:
    """Runs the operators over a list of records, in order; see the module docstring.

    State: whether the start-up check has run (``checked``).
    """

    def __init__(self, operators: tuple[Operator, ...]) -> None:
        self.operators = operators
        self.checked = False

    def run(
        self,
        records: list[Any],
        where: list[Where],
        *,
        report: Callable[[Where, str, str], None],
        drop: Callable[[Where], None],
        positions: list[int] | None = None,
    ) -> list[Any]:
        """The records after every operator; None for dropped (``drop``) or failed (``report``) ones.
        ``positions``: each record's plan position (record pipelines: seeded operators draw from it)."""
        if not self.checked and any(r is not None for r in records):
            self._check(records, where, positions)
            self.checked = True
        values = list(records)
        at = positions if positions is not None else [0] * len(records)
        for k, op in enumerate(self.operators):
            if op.kind == "map_transform":
                values = [
                    self._one(op, k, v, w, p, report, drop) if v is not None else None
                    for v, w, p in zip(values, where, at, strict=True)
                ]
            else:
                values = self._batch(op, values, where, drop)
        return values

    def _call(self, op: Operator, k: int, record: Any, position: int) -> Any:
        """One ``map_transform`` call (a record pipeline's seeded operators also get their generator)."""
        return op.fn(record)

    def _one(
        self, op: Operator, k: int, record: Any, where: Where, position: int, report: Callable, drop: Callable
    ) -> Any:
        try:
            out = self._call(op, k, record, position)
        except Exception as exc:  # the user's function: anything
            report(
                where,
                "operator_error",
                f"{where}: map_transform {op.name} must return a record or None, got "
                f"{type(exc).__name__}: {one_line(exc)} — fix the function",
            )
            return None
        if out is None:
            drop(where)
        elif not isinstance(out, dict):
            report(
                where,
                "operator_error",
                f"{where}: map_transform {op.name} must return a dict or None, got "
                f"{type(out).__name__} — return the record",
            )
            return None
        return out

    def _batch(self, op: Operator, values: list[Any], where: list[Where], drop: Callable) -> list[Any]:
        live = [i for i, v in enumerate(values) if v is not None]
        if not live:
            return values
        first = where[live[0]]
        try:
            got = op.fn([values[i] for i in live])
        except Exception as exc:
            raise DatasetError(
                f"{first} and the {len(live) - 1} records after it: map_batch {op.name} must return a list of "
                f"records, got {type(exc).__name__}: {one_line(exc)} — fix the function"
            ) from exc
        _check_count(op, len(live), got, first)
        out = list(values)
        for i, v in zip(live, got, strict=True):
            if v is not None and not isinstance(v, dict):
                raise DatasetError(
                    f"{where[i]}: map_batch {op.name} must return dicts or None, got "
                    f"{type(v).__name__} — return records"
                )
            if v is None:
                drop(where[i])
            out[i] = v
        return out

    def _runs(self, op: Operator, k: int, sample: list[Any], positions: list[int], first: Where) -> list[Any]:
        """Operator ``k``'s outputs for copies of ``sample``, twice (``map_batch``: also on its two halves): the
        start-up check compares them. A failure propagates (the run itself reports it with the record's location);
        a ``map_batch`` call that does not give one output per input is that ``DatasetError``, at ``first``."""
        if op.kind == "map_transform":
            return [
                [self._call(op, k, copy.deepcopy(r), p) for r, p in zip(sample, positions, strict=True)]
                for _ in range(2)
            ]
        half = len(sample) // 2
        calls = [sample, sample, sample[:half], sample[half:]] if half else [sample, sample]
        outs = []
        for records in calls:  # each call one output per input, before any comparison (a miscount is no randomness)
            outs.append(op.fn(copy.deepcopy(records)))
            _check_count(op, len(records), outs[-1], first)
        return outs[:2] + ([outs[2] + outs[3]] if half else [])

    def _check(self, records: list[Any], where: list[Where], positions: list[int] | None = None) -> None:
        """Run each operator twice on a sample (map_batch: also on its halves); refuse one whose outputs differ."""
        idx = [i for i, r in enumerate(records) if r is not None][:SAMPLE]
        sample = [records[i] for i in idx]
        at = [where[i] for i in idx]  # where each sample record came from, through the chain
        for k, op in enumerate(self.operators):
            try:
                runs = self._runs(op, k, sample, [0] * len(sample), at[0])
            except DatasetError:
                raise  # a map_batch that miscounts: said as such, not as randomness
            except Exception:
                return  # the run itself reports the failure with the record's location
            if any(run != runs[0] for run in runs[1:]):
                bad = next(
                    (
                        j
                        for j in range(len(sample))
                        if any(len(run) > j and len(runs[0]) > j and run[j] != runs[0][j] for run in runs[1:])
                    ),
                    0,
                )
                raise ConfigError(
                    f"{op.kind} {op.name} must be deterministic (the plan, every resume and every rank depend on "
                    f"it), got different outputs for the same input at {at[bad]} — derive any randomness "
                    "from the record (e.g. a hash of its text), not from global state"
                    + (", and make each output depend on its own record only" if op.kind == "map_batch" else "")
                )
            kept = [j for j, r in enumerate(runs[0]) if r is not None]  # the next operator's input
            sample, at = [runs[0][j] for j in kept], [at[j] for j in kept]
