"""Checking a provenance log (``zephon.executor.provenance_log``) against its plan: ``zephon audit PLAN --log DIR``.

The log says what the ranks actually yielded, piece by piece. The check recomputes, from the plan alone,
what they should have yielded and reports every difference:

1. Every log file is for this plan (``config_hash``) and one ``max_length`` / ``global_batch`` / lanes.
2. A piece logged twice (a step re-run after a crash) must be identical; different content for the same
   (sequence, offset) is a mismatch.
3. Sequence ``j`` belongs to step ``j // G``; its pieces tile the row from column 0 without gaps or
   overlaps and never pass ``max_length``.
4. Exact plans: the pieces of every logged sequence equal the planned ones — wrap: the documents whose
   token ranges ``[token_offset, token_offset + tokens)`` overlap ``[j·L, (j+1)·L)``; best fit: ``bins.parquet``.
5. Estimated plans: each logged document belongs to the lane of its sequence (its deal ≡ ``j`` mod lanes: the
   plan's fixed lanes or the run's global batch), and within a
   lane consecutive rows continue the same document or start the lane's next document at token 0 — no
   document skipped, repeated or reordered. Documents the skip policy left out (``skipped-*.parquet`` beside
   the log, with their reason) are not expected in their lane, are counted by reason, and must not appear
   in the log; exact plans refuse the skip policy, so any skipped document there is a mismatch.

6. Record pipelines (``zephon.unit: records`` in the files' metadata, docs/records.md): every piece is one whole
   record — ``sequence`` equal to ``position`` (row ``j`` of the run is plan position ``j``), offset 0, length 1 —
   and records the skip policy or an operator left out are listed beside the log, never in it;
   ``tokens_by_dataset`` then counts records.
7. Packed record runs (``zephon.unit: rows``, ``Pipeline.pack_samples``): a piece is one whole record of plan row
   ``sequence`` (its ``offset`` its place among the row's logged records); every logged (row, position) pair
   must be one of bins.parquet's, in the row's planned order, and no planned member may be missing unless the
   skip policy or an operator left it out (listed beside the log).

Example: an exact wrap plan with L = 4 and documents of 3 and 5 tokens (offsets 0 and 3) plans sequence 1
as [(offset 0, position 1, doc_start 1, length 3)]; a log row (0, 1, 0, 3) is reported as a mismatch.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import PlanFormatError
from zephon.executor.step_arithmetic import lane_of, lane_row, sequence_tokens, step_of
from zephon.plan.bundle import CheckedBundle, open_bundle
from zephon.plan.format import deal_column

_KEYS = ("sequence", "offset", "position", "doc_start", "length")


@dataclass(frozen=True, kw_only=True, slots=True)
class LogCheck:
    """The outcome of a log check: counts, realized tokens per dataset, and the first mismatches."""

    files: int
    sequences: int
    pieces: int
    steps: tuple[int, int] | None
    tokens_by_dataset: dict[str, int]
    #: Documents the skip policy left out, by reason (each plan position counted once).
    skipped: dict[str, int] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    mismatch_count: int = 0
    #: What ``tokens_by_dataset`` counts: ``"tokens"``, or ``"records"`` for a record pipeline's log.
    unit: str = "tokens"

    @property
    def ok(self) -> bool:
        return self.mismatch_count == 0


class _Findings:
    def __init__(self, limit: int = 20) -> None:
        self.items: list[str] = []
        self.count = 0
        self.limit = limit

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.items) < self.limit:
            self.items.append(message)


def _load(log_dir: Path) -> tuple[pa.Table, list[dict[str, str]]]:
    files = sorted(log_dir.glob("rank-*.parquet"))
    if not files:
        raise PlanFormatError(
            f"log directory must hold rank-*.parquet files, got none in {log_dir} — pass the "
            "directory given to Pipeline.options(provenance_dir=...)"
        )
    tables, metas = [], []
    for f in files:
        table = pq.read_table(f)
        metas.append({k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()})
        tables.append(table.replace_schema_metadata(None))
    return pa.concat_tables(tables), metas


def _load_skipped(log_dir: Path, plan_hash: str, found: _Findings) -> dict[int, str]:
    """Plan position → reason of every document a rank's skip policy left out (``skipped-*.parquet``)."""
    out: dict[int, str] = {}
    for f in sorted(log_dir.glob("skipped-rank-*.parquet")):
        table = pq.read_table(f)
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        if meta.get("zephon.plan") != plan_hash:
            found.add(f"{f.name} must be for plan {plan_hash[:12]}, got {str(meta.get('zephon.plan'))[:12]}")
        rows = zip(table.column("position").to_pylist(), table.column("reason").to_pylist(), strict=True)
        out.update((int(position), str(reason)) for position, reason in rows)
    return out


def check_log(plan_dir: str | Path, log_dir: str | Path) -> LogCheck:
    """Compare the provenance log in ``log_dir`` with the plan in ``plan_dir`` (see the module docstring)."""
    plan_dir, log_dir = Path(plan_dir), Path(log_dir)
    bundle = open_bundle(plan_dir)
    manifest = bundle.manifest
    table, metas = _load(log_dir)
    found = _Findings()
    for key in ("zephon.plan", "zephon.max_length", "zephon.global_batch", "zephon.lanes"):
        values = {m.get(key) for m in metas}
        if len(values) != 1:
            found.add(f"log files must agree on {key}, got {sorted(map(str, values))}")
    if metas[0].get("zephon.plan") != manifest.config_hash:
        found.add(f"log must be for plan {manifest.config_hash[:12]}, got {str(metas[0].get('zephon.plan'))[:12]}")
    width = int(metas[0]["zephon.max_length"])
    global_batch = int(metas[0]["zephon.global_batch"])

    cols = {name: table.column(name).to_numpy() for name in table.column_names}
    order = np.lexsort((cols["offset"], cols["sequence"]))
    cols = {k: v[order] for k, v in cols.items()}
    # 2. duplicates must agree
    rows = np.stack([cols[k] for k in _KEYS], axis=1)
    _, first = np.unique(rows, axis=0, return_index=True)
    keep = np.sort(first)
    cols = {k: v[keep] for k, v in cols.items()}
    seq, off, pos, start, length = (cols[k] for k in _KEYS)
    pairs = seq * (width + 1) + off
    dup = np.flatnonzero(np.diff(pairs) == 0) if len(pairs) > 1 else np.array([], dtype=np.int64)
    for i in dup[:5]:
        found.add(f"sequence {seq[i]} offset {off[i]} was logged with different contents (a re-run yielded other data)")
    found.count += max(0, len(dup) - 5)
    # 3. steps and tiling
    step = step_of(seq, global_batch)
    bad_step = np.flatnonzero(cols["step"] != step)
    for i in bad_step[:5]:
        found.add(f"sequence {seq[i]} must be in step {step[i]}, got step {cols['step'][i]}")
    found.count += max(0, len(bad_step) - 5)
    new_seq = np.ones(len(seq), dtype=bool)
    new_seq[1:] = seq[1:] != seq[:-1]
    expected_off = np.where(new_seq, 0, np.concatenate(([0], off[:-1] + length[:-1])))
    gaps = np.flatnonzero(off != expected_off)
    for i in gaps[:5]:
        found.add(f"sequence {seq[i]} must continue at column {expected_off[i]}, got a piece at {off[i]}")
    over = np.flatnonzero(off + length > width)
    for i in over[:5]:
        found.add(f"sequence {seq[i]} must fit in {width} tokens, got a piece ending at {off[i] + length[i]}")

    skipped = _load_skipped(log_dir, manifest.config_hash, found)
    if skipped:
        lost = np.fromiter(skipped, dtype=np.int64, count=len(skipped))
        yielded = np.flatnonzero(np.isin(pos, lost))
        for i in yielded[:5]:
            found.add(f"position {pos[i]} was skipped ({skipped[int(pos[i])]}), got its tokens in sequence {seq[i]}")
        found.count += max(0, len(yielded) - 5)
    samples = pa.concat_tables([f.read() for f in bundle.samples]).to_pydict()
    samples["deal"] = samples.get(deal_column(manifest.format_version))  # format 1: the lane, its deal mod lanes
    unit = metas[0].get("zephon.unit", "tokens")
    if unit == "records":
        _check_records(len(samples["dataset_id"]), seq, pos, start, length, found)
    elif unit == "rows":
        _check_rows(bundle, seq, pos, start, length, found, skipped=set(skipped))
    elif manifest.exact:
        if skipped:
            found.add(f"an exact plan must not skip documents (it refuses the skip policy), got {len(skipped)} skipped")
        _check_exact(bundle, samples, seq, off, pos, start, length, width, found)
    else:
        lanes = manifest.lanes if manifest.lanes is not None else global_batch
        _check_lanes(lanes, samples, seq, pos, start, length, found, skipped=set(skipped))

    names = manifest.dataset_names
    ds = np.asarray(samples["dataset_id"])[pos] if len(pos) else np.array([], dtype=np.int64)
    tokens = np.bincount(ds, weights=length, minlength=len(names)) if len(pos) else np.zeros(len(names))
    steps = (int(cols["step"].min()), int(cols["step"].max())) if len(seq) else None
    return LogCheck(
        files=len(metas),
        sequences=len(np.unique(seq)),
        pieces=len(seq),
        steps=steps,
        tokens_by_dataset={n: int(t) for n, t in zip(names, tokens, strict=True)},
        skipped=dict(sorted(Counter(skipped.values()).items())),
        mismatches=found.items,
        mismatch_count=found.count,
        unit=unit,
    )


def _check_records(documents: int, seq, pos, start, length, found: _Findings) -> None:
    """A record run's pieces: one whole record each, at its own plan position (see the module docstring)."""
    bad = np.flatnonzero((seq != pos) | (start != 0) | (length != 1) | (pos >= documents) | (pos < 0))
    for i in bad[:5]:
        found.add(
            f"sequence {seq[i]} must hold the one record at plan position {seq[i]}, got position {pos[i]} "
            f"(doc_start {start[i]}, length {length[i]})"
        )
    found.count += max(0, len(bad) - 5)


def _check_rows(bundle: CheckedBundle, seq, pos, start, length, found: _Findings, *, skipped: set[int]) -> None:
    """A packed record run's pieces: each logged row holds its planned members, in order, but those left out."""
    if bundle.bins is None:
        found.add("a log of packed rows must be checked against a plan with bins.parquet, got a plan without")
        return
    bins = bundle.bins.read(["sequence", "position"]).to_pydict()
    wanted = set(np.unique(seq).tolist())
    planned: dict[int, list[int]] = {}
    for s, p in zip(bins["sequence"], bins["position"], strict=True):
        if s in wanted and p not in skipped:
            planned.setdefault(s, []).append(p)
    logged: dict[int, list[int]] = {}
    for i, (s, p) in enumerate(zip(seq.tolist(), pos.tolist(), strict=True)):
        if start[i] != 0 or length[i] != 1:
            found.add(f"row {s} must hold whole records (doc_start 0, length 1), got {start[i]}, {length[i]} at {p}")
        logged.setdefault(s, []).append(p)
    for s, got in logged.items():
        if got != planned.get(s, []):
            found.add(f"row {s} must hold the planned records {planned.get(s, [])}, got {got}")


def _check_exact(bundle: CheckedBundle, samples, seq, off, pos, start, length, width, found: _Findings) -> None:
    packing = bundle.manifest.exact_packing()
    logged = set(zip(seq.tolist(), off.tolist(), pos.tolist(), start.tolist(), length.tolist(), strict=True))
    planned: set[tuple[int, int, int, int, int]] = set()
    sequences = np.unique(seq)
    if packing.algorithm != "wrap":
        assert bundle.bins is not None  # read_manifest requires bins of a best-fit or homogeneous plan
        bins = bundle.bins.read().to_pydict()
        wanted = set(sequences.tolist())
        for row in zip(
            bins["sequence"], bins["offset"], bins["position"], bins["doc_start"], bins["length"], strict=True
        ):
            if row[0] in wanted:
                planned.add(tuple(row))
    else:
        offsets = np.asarray(samples["token_offset"], dtype=np.int64)
        tokens = np.asarray(samples["tokens"], dtype=np.int64)
        for j in sequences.tolist():
            lo, hi = sequence_tokens(j, j + 1, width)
            first = max(0, int(np.searchsorted(offsets, lo, side="right")) - 1)
            p = first
            while p < len(offsets) and offsets[p] < hi:
                a, b = max(lo, offsets[p]), min(hi, offsets[p] + tokens[p])
                if b > a:
                    planned.add((j, int(a - lo), p, int(a - offsets[p]), int(b - a)))
                p += 1
    for piece in sorted(logged - planned)[:10]:
        found.add(
            f"sequence {piece[0]}: logged piece (offset {piece[1]}, position {piece[2]}, doc_start {piece[3]}, "
            f"length {piece[4]}) is not in the plan"
        )
    for piece in sorted(planned - logged)[:10]:
        found.add(
            f"sequence {piece[0]}: planned piece (offset {piece[1]}, position {piece[2]}, doc_start {piece[3]}, "
            f"length {piece[4]}) was not yielded"
        )
    found.count += max(0, len(logged - planned) - 10) + max(0, len(planned - logged) - 10)


def _check_lanes(lanes: int, samples, seq, pos, start, length, found: _Findings, *, skipped: set[int]) -> None:
    plan_lane = np.asarray(samples["deal"], dtype=np.int64) % lanes
    lane_of_seq, row_of = lane_of(seq, lanes), lane_row(seq, lanes)
    wrong = np.flatnonzero(plan_lane[pos] != lane_of_seq)
    for i in wrong[:5]:
        found.add(
            f"position {pos[i]} belongs to lane {plan_lane[pos[i]]}, got it in sequence {seq[i]} (lane "
            f"{lane_of_seq[i]})"
        )
    found.count += max(0, len(wrong) - 5)
    # Within a lane, row k+1 follows row k: same document continued, or the lane's next document from token 0.
    next_in_lane = np.full(len(plan_lane), -1, dtype=np.int64)
    lost = np.array(sorted(skipped), dtype=np.int64)
    members = np.flatnonzero(~np.isin(np.arange(len(plan_lane)), lost))  # a skipped document has no tokens
    members = members[np.argsort(plan_lane[members], kind="stable")]  # by lane, plan order within a lane
    same = plan_lane[members[:-1]] == plan_lane[members[1:]]
    next_in_lane[members[:-1][same]] = members[1:][same]
    order = np.lexsort((np.arange(len(seq)), row_of, lane_of_seq))
    for a, b in zip(order[:-1].tolist(), order[1:].tolist(), strict=True):
        if lane_of_seq[a] != lane_of_seq[b] or row_of[b] - row_of[a] > 1:
            continue  # another lane, or rows not both logged
        if pos[b] == pos[a]:
            if start[b] != start[a] + length[a]:
                found.add(
                    f"position {pos[b]} in sequence {seq[b]} must continue at token {start[a] + length[a]}, "
                    f"got {start[b]}"
                )
        elif pos[b] != next_in_lane[pos[a]] or start[b] != 0:
            found.add(
                f"lane {lane_of_seq[b]}: after position {pos[a]} the next document is {next_in_lane[pos[a]]} from "
                f"token 0, got position {pos[b]} from token {start[b]} (sequence {seq[b]})"
            )


def log_summary(check: LogCheck) -> list[str]:
    """Lines ``zephon audit --log`` prints."""
    span = f"steps {check.steps[0]}..{check.steps[1]}" if check.steps else "no steps"
    lines = [f"log: {check.files} file(s), {check.sequences} sequences, {check.pieces} pieces, {span}"]
    total = sum(check.tokens_by_dataset.values()) or 1
    for name, tokens in check.tokens_by_dataset.items():
        lines.append(f"  {name}  {check.unit} {tokens}  share {tokens / total:.4f}")
    if check.skipped:
        reasons = ", ".join(f"{reason} {n}" for reason, n in check.skipped.items())
        what = "records" if check.unit == "records" else "documents"
        lines.append(f"  skipped by the skip policy: {sum(check.skipped.values())} {what} ({reasons})")
    lines += [f"MISMATCH {m}" for m in check.mismatches]
    if check.mismatch_count > len(check.mismatches):
        lines.append(f"… and {check.mismatch_count - len(check.mismatches)} more mismatches")
    lines.append("ok: the log matches the plan" if check.ok else f"FAIL: {check.mismatch_count} mismatches")
    return lines


def log_json(check: LogCheck) -> str:
    return json.dumps(
        {
            "ok": check.ok,
            "files": check.files,
            "sequences": check.sequences,
            "pieces": check.pieces,
            "steps": check.steps,
            "tokens_by_dataset": check.tokens_by_dataset,
            "skipped": check.skipped,
            "mismatch_count": check.mismatch_count,
            "mismatches": check.mismatches,
            **({"unit": check.unit} if check.unit != "tokens" else {}),  # text logs' JSON as it was
        },
        indent=2,
    )
