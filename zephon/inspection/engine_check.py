"""Every installed tokenizer engine against ``tokenizers``, over whole datasets (``zephon engines check``).

The executor runs a tokenizer on the fastest engine verified to give ``tokenizers``' ids — verified on probe
texts and on each run's first documents, never on every document (docs/performance.md). This check reads every
document of every shard of the datasets (a dataset's ``where``/selection is not applied; ``limit`` stops after
that many documents in all), encodes each with ``tokenizers`` (``add_special_tokens=False``, as the engines
do) and with every candidate engine, and guarantees:

* every document read is compared on every engine that loaded, id for id (a text ``tokenizers`` refuses, a
  lone surrogate, must be refused by the engine too);
* each engine runs in a process of its own (``zephon.inspection.engine_worker``): a native crash (a signal)
  becomes that engine's result, ``crashed (SIGSEGV)``, and the check goes on with the others;
* tokens/s are measured the same way for all, on one thread each, on the same texts: an engine's time is
  compared with ``tokenizers``' time on exactly the batches that engine encoded;
* the verdict is cached where ``EngineChoice`` reads it (``VerdictCache``, keyed by tokenizer content and
  engine version): an engine that differs on any document, crashes, or fails a probe is cached as refused;
  one that agrees on every document **and** on the probes is cached as approved (a cached approval lets a
  run skip the probes, so it is never given without them). A refusal cached before is final and is kept.
  An engine whose library refuses to load this tokenizer.json (``EngineUnavailable.lasting``) is reported
  ``unavailable`` and cached as refused, as a run caches it; one that is not installed is reported and not cached.

Example: the demo tokenizer (GPT-2 style) over a dataset whose row 6 of ``web/a.parquet`` is ``"print(\\n'stdout')"``:
after the newline GPT-2's pre-tokenizer takes ``'s`` as a contraction (ids ``[.., 199, 7, 83, 84, ..]``), kitoken
does not (``[.., 199, 7, 329, ..]``), so kitoken's result is ``status="differs"``, ``differing=1``,
``first=Difference(dataset="web", shard=".../web/a.parquet", row=6, position=6, excerpt="stdout')", ...)``,
verdict ``refused`` (cached); fastokens, gigatoken and tiktoken agree on every document and on the probes and are
cached as approved.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from zephon.errors import TokenizerError
from zephon.executor.engines.builders import engine_classes
from zephon.executor.engines.choose import CANDIDATES, VerdictCache
from zephon.executor.read.shard_reader import ShardReader, planning_cache
from zephon.inspection.engine_worker import EncodedBatch, EngineDied, EngineProcess
from zephon.recipe.dataset import Dataset
from zephon.storage.progress import progress_bar

__all__ = ["Difference", "EngineCheck", "EngineResult", "check_engines"]

#: A batch sent to the engines holds at most this many documents, or about this many characters.
BATCH_DOCUMENTS, BATCH_CHARS = 512, 2_000_000
#: Ids shown on each side of the first difference.
SHOWN_IDS = 8


@dataclass(frozen=True, kw_only=True, slots=True)
class Difference:
    """The first document an engine encodes differently: where it is, the first token position that differs,
    both engines' ids from there (``got`` None: the engine raised on it), and the text from that token on."""

    dataset: str
    shard: str
    row: int
    position: int
    expected: tuple[int, ...] | None
    got: tuple[int, ...] | None
    excerpt: str


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineResult:
    """One engine's result. ``status``: ``agrees``, ``differs``, ``fails probes``, ``crashed`` or
    ``unavailable``; ``reason`` says why for every status but ``agrees``; ``verdict``: ``approved``,
    ``refused`` (cached) or ``not cached``."""

    engine: str
    version: str | None
    status: str
    documents: int = 0
    differing: int = 0
    first: Difference | None = None
    tokens_per_s: float | None = None
    reference_tokens_per_s: float | None = None
    verdict: str = "not cached"
    reason: str = ""

    @property
    def ok(self) -> bool:
        """Agrees, or could not load (nothing to disagree with)."""
        return self.status in ("agrees", "unavailable")


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineCheck:
    """What ``check_engines`` found: documents and tokens read, ``tokenizers``' tokens/s, one result per engine."""

    tokenizer: str
    documents: int
    tokens: int
    reference_tokens_per_s: float | None
    engines: tuple[EngineResult, ...]

    @property
    def ok(self) -> bool:
        """Every engine that loaded agrees (the command's exit status 0)."""
        return all(e.ok for e in self.engines)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Batch:
    dataset: str
    shard: str
    first_row: int
    texts: list[str]


@dataclass(kw_only=True, slots=True)
class _Running:
    """One engine's tallies while the datasets are read."""

    process: EngineProcess
    version: str
    documents: int = 0
    differing: int = 0
    tokens: int = 0
    seconds: float = 0.0
    reference_seconds: float = 0.0
    first: Difference | None = None
    died: str | None = None
    where: str = ""
    #: why the engine fails a probe (asked once every document is read), else None
    probes: str | None = None


def _batches(datasets: Sequence[Dataset], text_field: str, limit: int | None) -> tuple[int, Iterator[_Batch]]:
    """How many documents will be read, and their batches: every shard in order, every row in order."""
    shards = [(d, d.shards()) for d in datasets]
    total = sum(s.rows for _, infos in shards for s in infos)
    total = total if limit is None else min(total, limit)

    def read() -> Iterator[_Batch]:
        left = total
        for dataset_id, (dataset, infos) in enumerate(shards):
            for shard_id, info in enumerate(infos):
                ref = info.placed(shard_id=shard_id, dataset_id=dataset_id, dataset=dataset.name)
                reader = ShardReader([ref], text_field, capacity=1, cache=planning_cache())
                row = 0
                for chunk in reader.iter_shard(shard_id):
                    texts = [t for t in chunk if t is not None][:left]
                    start = 0
                    while start < len(texts):  # cut a row group into batches of bounded size
                        end, chars = start, 0
                        while end < len(texts) and end - start < BATCH_DOCUMENTS and chars < BATCH_CHARS:
                            chars += len(texts[end])
                            end += 1
                        part = texts[start:end]
                        yield _Batch(dataset=dataset.name, shard=info.uri, first_row=row + start, texts=part)
                        start = end
                    row += len(texts)
                    left -= len(texts)
                    if left <= 0:
                        return

    return total, read()


def _differing(expected: EncodedBatch, got: EncodedBatch) -> list[tuple[int, int]]:
    """(text index, first differing token position) of every text whose ids differ."""
    if (
        np.array_equal(expected.sizes, got.sizes)
        and np.array_equal(expected.raised, got.raised)
        and np.array_equal(expected.ids, got.ids)
    ):
        return []
    # Only on a difference: a loop over the batch's texts to find which (the equal case above is one compare).
    out = []
    a_ends, b_ends = np.cumsum(expected.sizes), np.cumsum(got.sizes)
    for i in range(len(expected.sizes)):
        if expected.raised[i] or got.raised[i]:
            if expected.raised[i] != got.raised[i]:
                out.append((i, 0))
            continue
        a = expected.ids[a_ends[i] - expected.sizes[i] : a_ends[i]]
        b = got.ids[b_ends[i] - got.sizes[i] : b_ends[i]]
        if len(a) != len(b) or not np.array_equal(a, b):
            n = min(len(a), len(b))
            unequal = np.flatnonzero(a[:n] != b[:n])
            out.append((i, int(unequal[0]) if len(unequal) else n))
    return out


def _ids_at(batch: EncodedBatch, i: int, position: int) -> tuple[int, ...] | None:
    if batch.raised[i]:
        return None
    end = int(np.cumsum(batch.sizes)[i])
    ids = batch.ids[end - int(batch.sizes[i]) : end]
    return tuple(int(x) for x in ids[position : position + SHOWN_IDS])


def _difference(
    batch: _Batch, i: int, position: int, expected: EncodedBatch, got: EncodedBatch, tokenizer: Tokenizer
) -> Difference:
    text = batch.texts[i]
    try:  # the character where the first differing token starts (the reference's offsets)
        offsets = tokenizer.encode(text, add_special_tokens=False).offsets
        start = offsets[position][0] if position < len(offsets) else len(text)
    except Exception:  # a text tokenizers refuses: from its start
        start = 0
    return Difference(
        dataset=batch.dataset,
        shard=batch.shard,
        row=batch.first_row + i,
        position=position,
        expected=_ids_at(expected, i, position),
        got=_ids_at(got, i, position),
        excerpt=text[start : start + 40],
    )


def check_engines(
    datasets: Sequence[Dataset],
    tokenizer_id: str,
    *,
    text_field: str = "text",
    limit: int | None = None,
    engines: Sequence[str] | None = None,
    progress: bool | None = None,
) -> EngineCheck:
    """Compare ``engines`` (default: every candidate but ``tokenizers``) with ``tokenizers`` on every document of
    ``datasets`` (at most ``limit``), cache their verdicts and report (see the module docstring)."""
    from zephon.executor.encode.text import Encoder
    from zephon.specs import TokenizeSpec

    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise TokenizerError(f"limit must be an integer ≥ 1 or None, got {limit!r} — pass e.g. limit=2000")
    names = list(engines) if engines is not None else [c for c in CANDIDATES if c != "tokenizers"]
    unknown = [n for n in names if n not in engine_classes()]
    if unknown:
        raise TokenizerError(
            f"engines must be among {', '.join(engine_classes())}, got {', '.join(map(repr, unknown))} — fix the names"
        )
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_id, field=text_field), engine="tokenizers")
    tokenizer = encoder.tokenizer
    config = tokenizer.to_str()  # what EngineChoice keys verdicts by, and what the engines load
    verdicts = VerdictCache(config)  # one hash of the whole tokenizer.json for every engine's verdict
    eos = tokenizer.id_to_token(encoder.eos_id)
    total, batches = _batches(datasets, text_field, limit)

    reference = EngineProcess("tokenizers", config, eos)
    processes = {name: EngineProcess(name, config, eos) for name in names}
    results: dict[str, EngineResult] = {}
    running: dict[str, _Running] = {}
    try:
        try:
            reference.load()
        except EngineDied as exc:
            raise TokenizerError(f"tokenizers must load this tokenizer, got: it {exc} — check {tokenizer_id}") from exc
        for name, process in processes.items():
            try:
                version, unavailable, lasting = process.load()
            except EngineDied as exc:
                results[name] = EngineResult(engine=name, version=None, status="crashed", reason=f"{exc} loading it")
                continue
            if unavailable is not None or version is None:
                verdict = "not cached"
                if lasting and unavailable:
                    verdicts.put(name, engine_classes()[name].package, False, unavailable)
                    verdict = "refused"
                results[name] = EngineResult(
                    engine=name, version=None, status="unavailable", reason=unavailable or "", verdict=verdict
                )
                continue
            running[name] = _Running(process=process, version=version)
        documents = tokens = 0
        reference_seconds = 0.0
        with progress_bar(total=total, desc="checking engines", unit="doc", progress=progress) as bar:
            for batch in batches:
                try:
                    expected = reference.encode(batch.texts)
                except EngineDied as exc:
                    raise TokenizerError(
                        f"tokenizers must encode every document, got: it {exc} on dataset {batch.dataset!r}, shard "
                        f"{batch.shard}, rows from {batch.first_row} — check that shard"
                    ) from exc
                batch_tokens = int(expected.sizes.sum())
                documents, tokens = documents + len(batch.texts), tokens + batch_tokens
                reference_seconds += expected.seconds
                for run in running.values():
                    if run.died is not None:
                        continue
                    try:
                        got = run.process.encode(batch.texts)
                    except EngineDied as exc:
                        run.died = str(exc)
                        run.where = f"dataset {batch.dataset!r}, shard {batch.shard}, rows from {batch.first_row}"
                        continue
                    run.documents += len(batch.texts)
                    run.tokens += batch_tokens
                    run.seconds += got.seconds
                    run.reference_seconds += expected.seconds
                    found = _differing(expected, got)
                    if found and run.first is None:
                        run.first = _difference(batch, *found[0], expected, got, tokenizer)
                    run.differing += len(found)
                bar.update(len(batch.texts))
        for name, run in running.items():
            if run.died is None:
                try:
                    run.probes = run.process.probes()
                except EngineDied as exc:
                    run.died, run.where = str(exc), "the probes"
            results[name] = _verdict(name, run, verdicts)
    finally:
        for process in (reference, *processes.values()):
            process.close()
    return EngineCheck(
        tokenizer=tokenizer_id,
        documents=documents,
        tokens=tokens,
        reference_tokens_per_s=tokens / reference_seconds if reference_seconds > 0 else None,
        engines=tuple(results[n] for n in names),
    )


def _verdict(name: str, run: _Running, cache: VerdictCache) -> EngineResult:
    """The engine's result, its verdict cached as ``EngineChoice`` reads it (see the module docstring)."""
    package = engine_classes()[name].package
    rate = run.tokens / run.seconds if run.seconds > 0 else None
    reference_rate = run.tokens / run.reference_seconds if run.reference_seconds > 0 else None
    common = {
        "engine": name,
        "version": run.version,
        "documents": run.documents,
        "differing": run.differing,
        "first": run.first,
        "tokens_per_s": rate,
        "reference_tokens_per_s": reference_rate,
    }
    if run.died is not None:
        status, reason = "crashed", f"it {run.died} in zephon engines check, on {run.where}"
    elif run.first is not None:
        f = run.first
        status = "differs"
        reason = (
            f"ids differ from tokenizers on {run.differing} of {run.documents} documents in zephon engines check, "
            f"first on dataset {f.dataset!r}, shard {f.shard}, row {f.row}, token {f.position}"
        )
    elif run.probes is not None:
        status, reason = "fails probes", run.probes
    else:
        earlier = cache.get(name, package)
        if earlier is not None and not earlier[0]:  # a refusal is final for this tokenizer and engine version
            return EngineResult(**common, status="agrees", verdict="refused", reason=f"refused before: {earlier[1]}")
        cache.put(name, package, True)
        return EngineResult(**common, status="agrees", verdict="approved")
    cache.put(name, package, False, reason)
    return EngineResult(**common, status=status, verdict="refused", reason=reason)
