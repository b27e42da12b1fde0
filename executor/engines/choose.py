"""Choosing the engine for one tokenizer: the fastest candidate verified to give ``tokenizers``' ids.

Candidates, fastest first: ``fastokens``, ``gigatoken``, ``tiktoken``, ``kitoken``, then ``tokenizers``
itself (the reference, always there). ``EngineChoice`` walks them in that order:

1. from construction on, a background thread looks for the first candidate that is installed, loads this
   tokenizer.json, and gives the reference's ids on every probe (``zephon.executor.engines.verify.probes``);
   the caller goes on (opens the plan, reads the first documents) and waits for it at its first batch —
   loading a large tokenizer.json takes fastokens about a second, as long as reading the first texts;
2. on the first batch of the run's own documents (``settle``: its first 32 documents, each cut to 2,048
   characters) the engine is checked again; if it differs there, it is refused and the next candidates are
   checked on the probes plus that sample; the first that agrees is used for the rest of the run.

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
from zephon.executor.engines.hf import TokenizersEngine
from zephon.executor.engines.verify import disagreement, probes

log = logging.getLogger(__name__)

#: ``ZEPHON_TOKENIZER_ENGINE``: ``auto`` (default) or one engine's name.
ENGINE_ENV = "ZEPHON_TOKENIZER_ENGINE"
#: Candidate engines, fastest first (measured on real vendor tokenizers: docs/performance.md).
CANDIDATES = ("fastokens", "gigatoken", "tiktoken", "kitoken", "tokenizers")
#: Bump when what a verdict checks changes (the probes, the comparison): older verdicts are not read.
VERDICT_VERSION = 1
#: First-batch check: at most this many documents, each cut to this many characters.
SAMPLE_DOCS, SAMPLE_CHARS = 32, 2048


#: Engines built in this process, by (tokenizer content, engine, EOS text): planning and the executor in one
#: process (``Pipeline(work_source)``) load a large tokenizer.json into an engine once, not twice.
_BUILT: dict[tuple[str, str, str | None], Engine] = {}


#: Engines being prepared on a thread. A fork (a DataLoader worker) waits for them first: a child forked while
#: the thread held a lock (an import, a Rust mutex) would wait for it forever.
_PREPARING: set[Future[Engine]] = set()


def _finish_preparing() -> None:
    wait(list(_PREPARING))


os.register_at_fork(before=_finish_preparing)


def _builders(eos_text: str | None) -> dict[str, Callable[[str], Engine]]:
    from zephon.executor.engines.tiktoken import TiktokenEngine
    from zephon.executor.engines.vendors import FastokensEngine, GigatokenEngine, KitokenEngine

    return {
        "fastokens": FastokensEngine,
        "gigatoken": GigatokenEngine,
        "tiktoken": lambda config: TiktokenEngine(config, eos_text),
        "kitoken": KitokenEngine,
    }


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
        #: whether the engine has been checked on the run's own documents
        self.settled = False
        self._lock = threading.Lock()  # the first batches of several threads: one checks, the others wait
        self._engine: Engine | None = None
        self._future: Future[Engine] | None = None
        if self.forced:  # refused at once, with one line
            self._engine = self._next(None)
        else:  # built and probed on a thread while the caller goes on (opens the plan, reads the first texts)
            self._future = Future()
            _PREPARING.add(self._future)
            threading.Thread(target=self._prepare, args=(self._future,), name="zephon-engine", daemon=True).start()

    def _prepare(self, future: Future[Engine]) -> None:
        try:
            future.set_result(self._next(None))
        except BaseException as exc:  # handed to the caller, who waits for the engine
            future.set_exception(exc)
        finally:
            _PREPARING.discard(future)

    @property
    def engine(self) -> Engine:
        """The engine (waits for the one being prepared)."""
        if self._engine is None:
            assert self._future is not None
            self._engine = self._future.result()
            self._future = None
        return self._engine

    @engine.setter
    def engine(self, value: Engine) -> None:
        self._engine = value

    @property
    def name(self) -> str:
        return self.engine.name

    def __getstate__(self) -> dict[str, object]:
        self.engine  # noqa: B018 - the engine prepared on a thread, before the state is taken
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

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
        """The first remaining candidate that passes its checks (``sample``: the run's documents, if known)."""
        while self._left:
            name = self._left.pop(0)
            if name == "tokenizers":
                return self._fallback
            build = _builders(self.eos_text)[name]
            package = "tiktoken" if name == "tiktoken" else name
            cached = self.cache.get(name, package)
            if cached is not None and not cached[0]:
                self._refuse(name, cached[1], None)
                continue
            key = (self.cache.content, name, self.eos_text)
            try:
                engine = _BUILT.get(key) or build(self.config_text)
            except EngineUnavailable as exc:
                self._refuse(name, str(exc), None)
                continue
            _BUILT[key] = engine
            texts, names = [], []
            if cached is None:
                for probe_name, text in probes(self.reference):
                    texts.append(text)
                    names.append(f"the {probe_name} probe")
            if sample:
                texts += sample
                names += [f"document {i} of the first batch" for i in range(len(sample))]
            reason = disagreement(engine, self.reference, texts, names) if texts else None
            if reason is not None:
                self._refuse(name, reason, package)
                continue
            if cached is None:
                self.cache.put(name, package, True)
            return engine
        return self._fallback

    def settle(self, texts: Sequence[str]) -> None:
        """Check the engine on the run's first documents (once; other threads wait); on a difference, refuse
        it and move on."""
        with self._lock:
            if self.settled:
                return
            if self.engine is not self._fallback:
                sample = _cut(texts)
                names = [f"document {i} of the first batch" for i in range(len(sample))]
                reason = disagreement(self.engine, self.reference, sample, names)
                if reason is not None:
                    try:
                        self._refuse(self.engine.name, reason, self.engine.package)
                    finally:
                        self.engine = self._fallback
                    self.engine = self._next(sample)
            self.settled = True
