"""One tokenizer engine in a process of its own, fed batches of texts by ``zephon engines check``.

The candidate engines are native libraries; one that crashes (kitoken 0.11.1 has segfaulted a process) must
cost its own verdict, never the check of the others. So every engine — ``tokenizers``, the reference, too, so
that all are timed the same way — runs in a child (``python -m zephon.inspection.engine_worker``) that loads it
on its main thread and encodes each batch on that one thread (``RAYON_NUM_THREADS=1``).

Protocol: pickled messages on the child's standard input and on a copy of its standard output (the child points
its file descriptor 1 at standard error first, so an engine that prints cannot garble a reply):

* parent → child: ``{"engine", "config", "eos"}``; child → parent: ``{"loaded": version}`` or
  ``{"unavailable": reason}`` (not installed, or it refuses this tokenizer);
* parent → child: a list of texts; child → parent: ``EncodedBatch`` (the ids of every text, None where the engine
  raised on that text alone, and the seconds the encoding took);
* parent → child: ``None``; child → parent: why the engine fails a probe (``verify.probe_texts``), or None.

A child that dies (a signal, an exit without its reply) makes ``EngineProcess`` raise ``EngineDied`` with the
signal's name: ``"crashed (SIGSEGV)"``. Example: a kitoken that segfaults on its first batch → ``EngineDied("crashed
(SIGSEGV)")`` in the parent, which records it as kitoken's verdict and goes on with the other engines.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

__all__ = ["EncodedBatch", "EngineDied", "EngineProcess"]


@dataclass(frozen=True, kw_only=True, slots=True)
class EncodedBatch:
    """One batch as an engine encoded it: ``ids`` of every text in order, ``sizes`` per text (0 where it raised),
    ``raised`` (bool per text: the engine refused that text alone), ``seconds`` spent encoding."""

    ids: np.ndarray
    sizes: np.ndarray
    raised: np.ndarray
    seconds: float


class EngineDied(Exception):
    """The engine's process ended without answering: the message is the verdict (``"crashed (SIGSEGV)"``)."""


class EngineProcess:
    """The parent's end: start the child, load the engine (``load``), encode batches, run the probes, close."""

    def __init__(self, engine: str, config_text: str, eos_text: str | None) -> None:
        self.engine = engine
        self._request = {"engine": engine, "config": config_text, "eos": eos_text}
        self._errors: IO[str] = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by close()); anonymous: nothing is left on disk
        env = {**os.environ, "RAYON_NUM_THREADS": "1"}
        self._child = subprocess.Popen(
            [sys.executable, "-m", "zephon.inspection.engine_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            env=env,
        )

    def _ask(self, message: object) -> Any:
        child = self._child
        assert child.stdin is not None and child.stdout is not None
        try:
            pickle.dump(message, child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            child.stdin.flush()
            return pickle.load(child.stdout)
        except (BrokenPipeError, EOFError, pickle.UnpicklingError) as exc:
            raise EngineDied(self._death()) from exc

    def _death(self) -> str:
        try:
            code = self._child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._child.kill()
            return "stopped answering"
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            return f"crashed ({name})"
        self._errors.seek(0)
        last = (self._errors.read().strip().splitlines() or ["no output"])[-1][:160]
        return f"failed (exit {code}: {last})"

    def load(self) -> tuple[str | None, str | None, bool]:
        """(the engine package's version, None, False) once loaded, or (None, why it cannot run this tokenizer,
        whether that is lasting: ``EngineUnavailable.lasting``)."""
        answer = self._ask(self._request)
        if "unavailable" in answer:
            return None, str(answer["unavailable"]), bool(answer.get("lasting", False))
        return str(answer["loaded"]), None, False

    def encode(self, texts: list[str]) -> EncodedBatch:
        answer: EncodedBatch = self._ask(texts)
        return answer

    def probes(self) -> str | None:
        """Why the engine fails a probe of ``zephon.executor.engines.verify``, or None (the child then exits)."""
        reason: str | None = self._ask(None)
        return reason

    def close(self) -> None:
        """End the child (if it still runs) and release its pipes."""
        child = self._child
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        self._errors.close()


def _encode(engine: Any, texts: list[str]) -> EncodedBatch:
    """The ids of ``texts``; a batch the engine raises on is encoded text by text, a text it raises on alone
    marked in ``raised`` (``tokenizers`` refuses a lone surrogate; whether the engine refuses the same texts
    is compared by the parent)."""
    start = time.perf_counter()
    try:
        got = engine.encode(texts)
        ids, sizes, raised = got.ids, got.sizes.astype(np.int64), np.zeros(len(texts), bool)
    except Exception:
        parts, sizes, raised = [], np.zeros(len(texts), np.int64), np.zeros(len(texts), bool)
        for i, text in enumerate(texts):
            try:
                one = engine.encode([text]).ids
            except Exception:
                raised[i] = True
                continue
            parts.append(np.asarray(one, np.int64))
            sizes[i] = len(one)
        ids = np.concatenate(parts) if parts else np.empty(0, np.int64)
    seconds = time.perf_counter() - start
    return EncodedBatch(ids=np.asarray(ids, np.int64), sizes=sizes, raised=raised, seconds=seconds)


def _main() -> None:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what an engine prints goes to standard error, never into a reply
    requests = sys.stdin.buffer

    def reply(message: object) -> None:
        pickle.dump(message, replies, protocol=pickle.HIGHEST_PROTOCOL)
        replies.flush()

    from importlib import metadata

    from tokenizers import Tokenizer

    from zephon.executor.engines.base import EngineUnavailable
    from zephon.executor.engines.builders import builders
    from zephon.executor.engines.hf import TokenizersEngine
    from zephon.executor.engines.verify import disagreement, probe_texts

    request = pickle.load(requests)
    name, config = request["engine"], request["config"]
    try:
        engine = TokenizersEngine(config) if name == "tokenizers" else builders(request["eos"])[name](config)
    except EngineUnavailable as exc:
        reply({"unavailable": str(exc), "lasting": exc.lasting})
        return
    reply({"loaded": metadata.version(engine.package)})
    while (texts := pickle.load(requests)) is not None:
        reply(_encode(engine, texts))
    reference = Tokenizer.from_str(config)
    reply(disagreement(engine, reference, *probe_texts(reference)) if name != "tokenizers" else None)


if __name__ == "__main__":  # run as the module itself, so that what it pickles names zephon.inspection.engine_worker
    from zephon.inspection.engine_worker import _main as main

    main()
