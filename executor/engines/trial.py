"""A candidate engine's first load and probes, in a process of their own: a native crash costs a verdict, not
the run.

The candidate engines are native libraries. One that crashes while loading a tokenizer.json it does not
support (a segmentation fault, an abort) would take the training process with it — no ``except`` catches a
signal. So the first time a candidate meets a tokenizer (no cached verdict for this tokenizer content and
engine version, ``zephon.executor.engines.choose.VerdictCache``), it is loaded and probed in a child process
(``python -m zephon.executor.engines.trial``, the tokenizer.json on its standard input):

* the child prints one JSON line — ``{"ok": true}``, ``{"ok": false, "reason": ...}`` (its ids differ on a
  probe), or ``{"unavailable": ..., "lasting": ...}`` (not installed, or it refuses to load this tokenizer:
  lasting, and cached like a refusal, when its library refused the content — ``EngineUnavailable.lasting``);
* a child killed by a signal, or one that exits without its line, refuses the candidate with the signal or the
  exit status in the reason (cached like any refusal: the same bytes crash the same library again);
* a child that has not answered within ``TRIAL_SECONDS`` is killed and the candidate refused.

The child says ``{"loaded": true}`` as soon as the engine is loaded (the part that crashes), so the run loads its
own copy while the child probes, and the two loads do not add up.

Only then does the run load the candidate itself; later runs read the verdict from the cache and start no
child. Example: kitoken crashing on a Unigram tokenizer → ``refused == {"kitoken": "it crashed (SIGSEGV) loading
or probing this tokenizer in a trial process"}``, and the run goes on with the next candidate.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: A trial that has not answered by then (loading a large tokenizer.json takes seconds) is refused.
TRIAL_SECONDS = 180.0


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialVerdict:
    """What a trial found: ``ok``; else ``reason``; ``cacheable`` False when the engine is just not usable
    here (not installed, out of memory), which, as in-process, is not cached."""

    ok: bool
    reason: str = ""
    cacheable: bool = True


def run_trial(
    engine: str, config_text: str, eos_text: str | None, while_probing: Callable[[], T] | None = None
) -> tuple[TrialVerdict, T | None]:
    """Load ``engine`` on the tokenizer.json text and check it on the probes, in a child process. Once the child
    has loaded it (the crash-prone part), ``while_probing`` runs here while the child probes — the caller loads
    its own copy meanwhile — and its result is returned with the verdict (None if the child never loaded it)."""
    request = json.dumps({"engine": engine, "config": config_text, "eos": eos_text}, ensure_ascii=True)
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    with tempfile.TemporaryFile(mode="w+") as errors:  # anonymous: nothing is left on disk
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "zephon.executor.engines.trial"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env=env,
            )
        except OSError as exc:  # no process could be started: decide in-process, as before trials existed
            return TrialVerdict(ok=True, reason=f"no trial process ({exc.strerror})", cacheable=False), None
        expired = threading.Event()
        timer = threading.Timer(TRIAL_SECONDS, lambda: (expired.set(), child.kill()))
        timer.start()
        try:
            assert child.stdin is not None and child.stdout is not None
            try:
                child.stdin.write(request)
                child.stdin.close()
            except BrokenPipeError:
                pass  # the child ended early: its exit status says why
            answer, result = None, None
            for line in child.stdout:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # an engine's own output
                if message == {"loaded": True}:
                    if while_probing is not None:
                        result = while_probing()
                elif isinstance(message, dict):
                    answer = message
            code = child.wait()
        finally:
            timer.cancel()
        if expired.is_set() and answer is None:
            reason = f"its trial process did not answer within {TRIAL_SECONDS:.0f} s"
            return TrialVerdict(ok=False, reason=reason), result
        if code < 0 and answer is None:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else "a signal"
            reason = f"it crashed ({name}) loading or probing this tokenizer in a trial process"
            return TrialVerdict(ok=False, reason=reason), result
        if answer is None:
            errors.seek(0)
            last = (errors.read().strip().splitlines() or ["no output"])[-1][:160]
            return TrialVerdict(ok=False, reason=f"its trial process failed (exit {code}: {last})"), result
    if "unavailable" in answer:
        lasting = bool(answer.get("lasting", False))
        return TrialVerdict(ok=False, reason=str(answer["unavailable"]), cacheable=lasting), result
    return TrialVerdict(ok=bool(answer["ok"]), reason=str(answer.get("reason", ""))), result


def _main() -> None:
    from tokenizers import Tokenizer

    from zephon.executor.engines.base import EngineUnavailable
    from zephon.executor.engines.builders import builders
    from zephon.executor.engines.verify import disagreement, probe_texts

    request = json.loads(sys.stdin.read())
    config = request["config"]
    try:
        engine = builders(request["eos"])[request["engine"]](config)
    except EngineUnavailable as exc:
        print(json.dumps({"unavailable": str(exc), "lasting": exc.lasting}))
        return
    print(json.dumps({"loaded": True}), flush=True)  # the parent may load its own copy now
    reference = Tokenizer.from_str(config)
    reason = disagreement(engine, reference, *probe_texts(reference))
    print(json.dumps({"ok": reason is None, "reason": reason or ""}))


if __name__ == "__main__":
    _main()
