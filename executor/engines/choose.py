"""Choosing the engine for one tokenizer: the fastest candidate verified to give ``tokenizers``' ids.

Candidates, fastest first: ``fastokens``, ``gigatoken``, ``tiktoken``, ``kitoken``, then ``tokenizers``
itself (the reference, always there). ``EngineChoice`` walks them in that order, on the calling thread, before
anything is encoded:

1. the first candidate that is installed, loads this tokenizer.json, and gives the reference's ids on every
   probe (``zephon.executor.engines.verify.probes``: named tricky texts plus seeded fuzz strings) is taken. A
   cached approval skips the probes, so with a warm cache the choice costs one load. A crash-prone candidate
   (kitoken) with no cached verdict is first loaded and probed in a trial process
   (``zephon.executor.engines.trial``): a native crash there refuses it, never the run;
2. the run's first batch (``settle``: its first 32 documents, each cut to 2,048 characters) checks the engine
   on the run's own documents before any of its ids are used; a candidate that differs is refused and the next
   ones are checked on the probes plus that sample. The first that agrees encodes the rest of the run, and a
   seeded spot check keeps comparing it with ``tokenizers`` as the run goes
   (``zephon.executor.engines.spot_check``).

Nothing runs in the background: the choice is made before the first batch, so no thread is inside an engine's
native code while the interpreter exits (an early error, Ctrl-C, a one-batch script). An engine class marked
``confined`` (kitoken: its objects crashed runs when called on threads other than the one that built them,
after that one had exited) is built, called and freed on one thread of its own
(``zephon.executor.engines.owned``); the others are shared between the run's threads, as their libraries allow.

Each refused candidate keeps its reason (``refused``: name → reason), which ``Pipeline.stats()`` reports.

Verdicts are cached under ``$ZEPHON_CACHE_DIR/tokenizer-engines/verdicts``, one JSON file per (tokenizer.json
content, engine, engine version, ``VERDICT_VERSION``). A cached refusal is final: the candidate once gave other
ids than ``tokenizers`` for this exact tokenizer and version (or crashed), so it is not tried again. A cached
approval skips the probes (the same probe texts on the same tokenizer content and engine version give the same
ids: both engines are deterministic functions of them) but never the run's own sample, which is checked on
every start — so a document the probes did not foresee still sends the run to the next engine. An engine
whose library refuses to load this tokenizer.json (``EngineUnavailable.lasting``: its own error on this content
at this version — fastokens on a tiktoken-derived BPE, "unsupported model type", after 0.8 s of parsing) is
cached as a refusal too, so a later start does not parse the file again; one that is not installed, or whose
load ran out of memory, is skipped and not cached.

``ZEPHON_TOKENIZER_ENGINE=NAME`` forces one candidate: it is used only if it passes the same checks, else
the run stops with a one-line ``TokenizerError``; ``tokenizers`` always passes; ``auto`` is the default.
The engine is an execution setting: the ids, and so the plan's tokenizer fingerprint, are the same with any.

Example (DeepSeek V4's tokenizer.json, fastokens not installed): gigatoken loads it, matches on the probes
and on the first 32 documents → ``engine.name == "gigatoken"``, ``refused == {"fastokens": "fastokens is not
installed (pip install 'zephon[fast]')"}``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from tokenizers import Tokenizer

from zephon.errors import ConfigError, StorageError, TokenizerError
from zephon.executor.engines.base import Engine, EngineUnavailable
from zephon.executor.engines.builders import build, crash_prone
from zephon.executor.engines.hf import TokenizersEngine
from zephon.executor.engines.trial import run_trial
from zephon.executor.engines.verify import disagreement, probe_texts

log = logging.getLogger(__name__)

#: ``ZEPHON_TOKENIZER_ENGINE``: ``auto`` (default) or one engine's name.
ENGINE_ENV = "ZEPHON_TOKENIZER_ENGINE"
#: Candidate engines, fastest first (measured on real vendor tokenizers: docs/performance.md).
CANDIDATES = ("fastokens", "gigatoken", "tiktoken", "kitoken", "tokenizers")
#: Bump when what a verdict checks changes (the probes, the comparison): older verdicts are not read.
VERDICT_VERSION = 2
#: First-batch check: at most this many documents, each cut to this many characters.
SAMPLE_DOCS, SAMPLE_CHARS = 32, 2048


#: Engines built in this process, by (tokenizer content, engine, EOS text): planning and the executor in one
#: process (``Pipeline(work_source)``) load a large tokenizer.json into an engine once, not twice.
_BUILT: dict[tuple[str, str, str | None], Engine] = {}


#: The tokenizer contents each engine has loaded in this process (a crash-prone engine loads one: ``_next``).
_HELD: dict[str, set[str]] = {}


def engine_setting(value: str | None) -> str:
    """The engine setting (``auto`` or a candidate), checked."""
    choice = (value or "auto").strip().lower()
    if choice != "auto" and choice not in CANDIDATES:
        raise ConfigError(
            f'{ENGINE_ENV} must be "auto" or one of {", ".join(CANDIDATES)}, got {choice!r} — fix or unset it'
        )
    return choice


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


class VerdictCache:
    """Cached verdicts for one tokenizer.json content (see the module docstring)."""

    def __init__(self, config_text: str) -> None:
        self.content = hashlib.sha256(config_text.encode("utf-8", "surrogatepass")).hexdigest()

    def _file(self, name: str, package: str) -> Path:
        from zephon.storage.files import cache_dir

        key = f"{VERDICT_VERSION}\0{self.content}\0{name}\0{_version(package)}"
        return cache_dir() / "tokenizer-engines" / "verdicts" / f"{hashlib.sha256(key.encode()).hexdigest()}.json"

    def get(self, name: str, package: str) -> tuple[bool, str] | None:
        """(approved, reason) or None when there is no readable verdict."""
        try:
            data = json.loads(self._file(name, package).read_text(encoding="utf-8"))
            return bool(data["ok"]), str(data.get("reason", ""))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, name: str, package: str, ok: bool, reason: str = "") -> None:
        """Record a verdict all or nothing; a cache that cannot be written is skipped."""
        from zephon.storage.files import write_atomic

        text = json.dumps({"engine": name, "version": _version(package), "ok": ok, "reason": reason})
        try:
            write_atomic(self._file(name, package), lambda tmp: tmp.write_text(text, encoding="utf-8"), "verdicts")
        except StorageError as exc:
            log.debug("tokenizer-engine verdict not cached: %s", exc)


def _sample_names(sample: Sequence[str]) -> list[str]:
    return [f"document {i} of the first batch" for i in range(len(sample))]


def _cut(texts: Sequence[str]) -> list[str]:
    return [t[:SAMPLE_CHARS] for t in texts[:SAMPLE_DOCS]]


class EngineChoice:
    """The engine encoding for one tokenizer, and why faster candidates were refused (chosen on construction,
    on the calling thread; checked once more on the run's first documents by ``settle``)."""

    def __init__(
        self, tokenizer: Tokenizer, config_text: str, *, eos_text: str | None = None, setting: str | None = None
    ) -> None:
        self.reference = tokenizer
        self.config_text = config_text
        self.setting = engine_setting(setting)
        self.forced = self.setting != "auto"
        self.cache = VerdictCache(config_text)
        self.eos_text = eos_text
        self._fallback = TokenizersEngine(config_text, tokenizer)
        #: refused candidates: name → reason
        self.refused: dict[str, str] = {}
        self._left = [self.setting] if self.forced else list(CANDIDATES)
        #: whether the run's first documents have been checked (``settle``)
        self.settled = False
        self._engine = self._next(None)  # a forced engine that fails its checks is refused here, in one line

    @property
    def engine(self) -> Engine:
        """The chosen engine."""
        return self._engine

    @property
    def name(self) -> str:
        return self._engine.name

    @property
    def fallback(self) -> TokenizersEngine:
        """The ``tokenizers`` engine (for a batch another engine refuses)."""
        return self._fallback

    def refuse_running(self, reason: str) -> None:
        """The engine in use gave other ids than ``tokenizers`` on a document of the run (the spot check): its
        refusal is cached, so the next run chooses another engine; this run stops (the caller raises)."""
        engine = self._engine
        if engine is not self._fallback:
            self._refuse(engine.name, reason, engine.package, stop_forced=False)  # the caller raises the mismatch

    def _refuse(self, name: str, reason: str, package: str | None, *, stop_forced: bool = True) -> None:
        """Record the refusal (cached when ``package`` is given); the engine built for it is closed and not kept
        in memory. A forced engine's refusal stops the run in one line (``stop_forced``)."""
        self.refused[name] = reason
        built = _BUILT.pop((self.cache.content, name, self.eos_text), None)
        if built is not None:
            built.close()
        if package is not None:
            self.cache.put(name, package, False, reason)
        if self.forced and stop_forced:
            raise TokenizerError(
                f"{ENGINE_ENV}={name} must give the same ids as tokenizers for this tokenizer, got: {reason} — "
                f"unset {ENGINE_ENV} (the fastest exact engine is picked) or set it to tokenizers"
            )

    def _next(self, sample: list[str] | None) -> Engine:
        """The first remaining candidate that passes its checks (``sample``: the run's documents, if known).

        A crash-prone candidate (``Engine.crash_prone``) with no cached verdict is loaded and probed in a trial
        process first (``zephon.executor.engines.trial``), so that a native crash refuses it instead of ending
        the run."""
        while self._left:
            name = self._left.pop(0)
            if name == "tokenizers":
                return self._fallback
            package = name
            cached = self.cache.get(name, package)
            if cached is not None and not cached[0]:
                self._refuse(name, cached[1], None)
                continue
            key = (self.cache.content, name, self.eos_text)
            probe = cached is None
            loaded: Engine | EngineUnavailable | None = _BUILT.get(key)
            held = _HELD.setdefault(name, set())
            isolate = loaded is None and crash_prone(name)
            if isolate and held - {self.cache.content}:
                # kitoken's loader crashed a process that had loaded another tokenizer before (a trial process,
                # fresh, cannot show that): one tokenizer per process for a crash-prone engine
                self._refuse(name, f"{name} already holds another tokenizer in this process", None)
                continue
            if isolate and cached is None:

                def load_here(name: str = name) -> Engine | EngineUnavailable:
                    try:  # while the trial process probes: it loaded the engine without crashing
                        return build(name, self.config_text, self.eos_text)
                    except EngineUnavailable as exc:
                        return exc

                trial, loaded = run_trial(name, self.config_text, self.eos_text, load_here)
                if not trial.ok:
                    self._refuse(name, trial.reason, package if trial.cacheable else None)
                    continue
                probe = not trial.cacheable  # no trial process could run: probe in-process
            try:
                if isinstance(loaded, EngineUnavailable):
                    raise loaded
                engine = loaded or build(name, self.config_text, self.eos_text)
            except EngineUnavailable as exc:
                self._refuse(name, str(exc), package if exc.lasting else None)
                continue
            _BUILT[key] = engine
            held.add(self.cache.content)
            texts, names = probe_texts(self.reference) if probe else ([], [])
            if sample:
                texts += sample
                names += _sample_names(sample)
            reason = disagreement(engine, self.reference, texts, names) if texts else None
            if reason is not None:
                self._refuse(name, reason, package)
                continue
            if cached is None:
                self.cache.put(name, package, True)
            return engine
        return self._fallback

    def _checked(self, engine: Engine, sample: list[str]) -> Engine:
        """``engine`` if it gives the reference's ids on the run's documents, else the next candidate that does."""
        if engine is self._fallback:
            return engine
        reason = disagreement(engine, self.reference, sample, _sample_names(sample))
        if reason is None:
            return engine
        self._refuse(engine.name, reason, engine.package)
        return self._next(sample)

    def settle(self, texts: Sequence[str]) -> None:
        """Check the engine on the run's first documents, once, before their ids are used; on a difference the
        candidate is refused and the next ones are tried."""
        if self.settled:
            return
        self.settled = True
        engine, self._engine = self._engine, self._fallback  # a forced refusal below leaves no unchecked engine
        self._engine = self._checked(engine, _cut(texts))
