"""Choosing the engine for one tokenizer: the fastest candidate verified to give ``tokenizers``' ids.

Candidates, fastest first: ``fastokens``, ``gigatoken``, ``tiktoken``, ``kitoken``, then ``tokenizers``
itself (the reference, always there). ``EngineChoice`` walks them in that order:

1. from construction on, a background thread looks for the first candidate that is installed, loads this
   tokenizer.json, and gives the reference's ids on every probe (``zephon.executor.engines.verify.probes``:
   named tricky texts plus seeded fuzz strings). A crash-prone candidate (kitoken) with no cached verdict is
   first loaded and probed in a trial process (``zephon.executor.engines.trial``): a native crash there
   refuses it, never the run;
2. the caller goes on (opens the plan, reads the first documents). Its first batch (``settle``: the first 32
   documents, each cut to 2,048 characters) is the check on the run's own documents: if the candidate is
   ready it is checked there and then; if it is still being prepared, ``tokenizers`` encodes that batch (the
   same ids by definition; a large batch, such as a calibration's, waits instead: ``Encoder``) and the
   preparing thread checks the candidate on that sample when it is ready, then hands it over (``current``).
   A candidate that differs on the sample is refused and the next ones are checked on the probes plus that
   sample; the first that agrees is used for the rest of the run. ``engine`` waits for the choice;
   ``current`` never waits.

Each refused candidate keeps its reason (``refused``: name → reason), which ``Pipeline.stats()`` reports.

Verdicts are cached under ``$ZEPHON_CACHE_DIR/tokenizer-engines/verdicts``, one JSON file per (tokenizer.json
content, engine, engine version, ``VERDICT_VERSION``). A cached refusal is final: the candidate once gave other
ids than ``tokenizers`` for this exact tokenizer and version, so it is not tried again. A cached approval
skips the probes (the same probe texts on the same tokenizer content and engine version give the same ids:
both engines are deterministic functions of them) but never the run's own sample, which is checked on
every start — so a document the probes did not foresee still sends the run to the next engine. An engine
that is not installed, or that cannot load the tokenizer here, is skipped and not cached.

``ZEPHON_TOKENIZER_ENGINE=NAME`` forces one candidate: it is used only if it passes the same checks, else
the run stops with a one-line ``TokenizerError``; ``tokenizers`` always passes; ``auto`` is the default.
The engine is an execution setting: the ids, and so the plan's tokenizer fingerprint, are the same with any.

Example (DeepSeek V4's tokenizer.json, fastokens not installed): gigatoken loads it, matches on the probes
and on the first 32 documents → ``engine == "gigatoken"``, ``refused == {"fastokens": "fastokens is not
installed (pip install 'zephon[fast]')"}``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from importlib import metadata
from pathlib import Path

from tokenizers import Tokenizer

from zephon.errors import ConfigError, StorageError, TokenizerError
from zephon.executor.engines.base import Engine, EngineUnavailable
from zephon.executor.engines.builders import builders, crash_prone
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


#: Engines being prepared on a thread. A fork (a DataLoader worker) waits for them first: a child forked while
#: the thread held a lock (an import, a Rust mutex) would wait for it forever.
_PREPARING: set[Future[None]] = set()


def _finish_preparing() -> None:
    wait(list(_PREPARING))


os.register_at_fork(before=_finish_preparing)


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
    """The engine encoding for one tokenizer, and why faster candidates were refused."""

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
        #: whether the run's first documents have been handed to ``settle``
        self.settled = False
        self._lock = threading.Lock()  # settle and the preparing thread decide who checks the sample
        self._sample: list[str] | None = None  # the first batch's documents, cut (``settle``)
        self._final = threading.Event()  # set when the engine has been checked on the sample (or no check is due)
        #: the candidate found (None: tokenizers encodes while one is prepared); checked on the sample once seen
        self._engine: Engine | None = None
        self._future: Future[None] | None = None
        if self.forced:  # refused at once, with one line
            self._engine = self._next(None)
        else:  # found on a thread while the caller goes on; tokenizers encodes until it is ready
            from zephon.storage.files import cache_dir

            self._future = Future()
            _PREPARING.add(self._future)
            args = (self._future, cache_dir())
            threading.Thread(target=self._prepare, args=args, name="zephon-engine", daemon=True).start()

    def _prepare(self, future: Future[None], cache: Path) -> None:
        from zephon.storage.files import cache_dir_pinned

        # This thread may outlive the call that started it: what it caches goes to the cache that call saw.
        with cache_dir_pinned(cache):
            try:
                engine = self._next(None)
                with self._lock:
                    sample = self._sample
                    if sample is None:  # before the first batch: settle() checks it on the run's documents
                        self._engine = engine
                if sample is not None:  # the first batch went by on tokenizers: check the candidate on it here
                    engine = self._checked(engine, sample)
                    with self._lock:
                        self._engine = engine
                    self._final.set()
                future.set_result(None)
            except BaseException as exc:  # handed to whoever asks for the engine
                future.set_exception(exc)
                self._final.set()
            finally:
                _PREPARING.discard(future)

    def wait(self) -> None:
        """Wait until the engine is chosen: prepared and, once the run's documents were seen, checked on them."""
        future = self._future
        if future is not None:
            future.result()
        if self.settled:
            self._final.wait()

    @property
    def chosen(self) -> bool:
        """Whether the engine is chosen for good: checked on the run's documents (``engine`` would not wait)."""
        return self.settled and self._final.is_set()

    @property
    def engine(self) -> Engine:
        """The chosen engine (waits for it: ``wait``)."""
        self.wait()
        return self.current

    @property
    def current(self) -> Engine:
        """The engine to encode with now, without waiting: ``tokenizers`` until a faster candidate is ready and
        checked (the ids are the same either way)."""
        engine = self._engine
        return engine if engine is not None else self._fallback

    @property
    def name(self) -> str:
        return self.engine.name

    def __getstate__(self) -> dict[str, object]:
        self.wait()  # the engine prepared on a thread, before the state is taken
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_final", "_future")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._final = threading.Event()
        self._final.set()
        self._future = None

    @property
    def fallback(self) -> TokenizersEngine:
        """The ``tokenizers`` engine (for a batch another engine refuses)."""
        return self._fallback

    def _refuse(self, name: str, reason: str, package: str | None) -> None:
        self.refused[name] = reason
        _BUILT.pop((self.cache.content, name, self.eos_text), None)  # a refused engine is not kept in memory
        if package is not None:
            self.cache.put(name, package, False, reason)
        if self.forced:
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
            build = builders(self.eos_text)[name]
            package = "tiktoken" if name == "tiktoken" else name
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

                def load_here(build: Callable[[str], Engine] = build) -> Engine | EngineUnavailable:
                    try:  # while the trial process probes: it loaded the engine without crashing
                        return build(self.config_text)
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
                engine = loaded or build(self.config_text)
            except EngineUnavailable as exc:
                self._refuse(name, str(exc), None)
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
        try:
            self._refuse(engine.name, reason, engine.package)
        finally:
            self._engine = None  # never used again, even if a forced refusal raises
        return self._next(sample)

    def settle(self, texts: Sequence[str]) -> None:
        """Check the engine on the run's first documents, once. If the candidate is still being prepared, the
        preparing thread checks it when ready, and ``tokenizers`` encodes meanwhile; on a difference the
        candidate is refused and the next ones are tried."""
        with self._lock:
            if self.settled:
                return
            self._sample = _cut(texts)
            self.settled = True
            if self._engine is None and self._future is not None and not self._future.done():
                return  # the preparing thread checks the sample
            if self._engine is not None:
                self._engine = self._checked(self._engine, self._sample)
        self._final.set()
