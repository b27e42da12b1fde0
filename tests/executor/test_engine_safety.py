"""No run dies of its tokenizer engine: the pattern that crashed kitoken, confined engines, the choice made before the
first batch, clean exits, and the spot check that stops a run on an engine's wrong id (docs/performance.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from demo_grammar import generate_demo_documents
from support.engine_thread_exit import demo_texts, digest

from zephon import Pipeline
from zephon.errors import TokenizerError
from zephon.executor.encode.text import Encoder
from zephon.executor.engines import spot_check
from zephon.executor.engines.base import Engine, TokenIds, encode_timed, from_lists
from zephon.executor.engines.owned import OwnedEngine
from zephon.executor.engines.spot_check import EngineMismatch, SpotCheck
from zephon.executor.engines.vendors import FastokensEngine
from zephon.io import Dataset
from zephon.specs import TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

SUPPORT = Path(__file__).resolve().parents[1] / "support"
#: The demo corpus's grammar (demo_grammar) for children run as scripts, which pytest's pythonpath does not reach.
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def child(args: Sequence[str], cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "ZEPHON_CACHE_DIR": str(cache), **env}
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", *args], capture_output=True, text=True, env=environment, timeout=300
    )


@pytest.mark.skipif(importlib.util.find_spec("kitoken") is None, reason="kitoken is not installed")
def test_kitoken_built_on_a_thread_that_exited_encodes_on_other_threads_without_crashing(cl100k_converted_dir, _isolated_cache):
    """The crash: kitoken built on a thread that then exited (the old preparation thread), called afterwards from
    the main thread and the encoder's pool threads, segfaulted (2 of 3 runs before the fix). Confined to its owner
    thread, every run exits 0, prints nothing on stderr, and gives tokenizers' ids."""
    want = digest(Encoder(TokenizeSpec(tokenizer_id=cl100k_converted_dir), engine="tokenizers"), demo_texts())
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH", "")) if p)
    for _ in range(2):
        done = child([str(SUPPORT / "engine_thread_exit.py"), cl100k_converted_dir, "kitoken"], _isolated_cache, PYTHONPATH=path)
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.split() == ["kitoken", want]


class Recording(Engine):
    """A stand-in engine that records the thread of each build, call and free."""

    name = "recording"
    package = "tokenizers"
    confined = True
    threads: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, config_text: str) -> None:
        super().__init__(config_text)
        Recording.threads.append(("build", threading.current_thread().name))

    def encode(self, texts: Sequence[str]) -> TokenIds:
        Recording.threads.append(("encode", threading.current_thread().name))
        return from_lists([[len(t)] for t in texts])

    def __del__(self) -> None:
        Recording.threads.append(("free", threading.current_thread().name))


def test_a_confined_engine_is_built_called_and_freed_on_its_own_thread() -> None:
    Recording.threads = []
    engine = OwnedEngine(Recording, "{}")
    calls = [threading.Thread(target=engine.encode, args=(["ab", "c"],)) for _ in range(3)]
    for thread in calls:
        thread.start()
    for thread in calls:
        thread.join()
    assert engine.encode(["abc"]).ids.tolist() == [3]
    engine.close()
    owner = "zephon-engine-owner"
    assert Recording.threads == [("build", owner), *[("encode", owner)] * 4, ("free", owner)]
    first = engine._owner.thread
    assert not first.is_alive()
    assert engine.encode(["abcd"]).ids.tolist() == [4]  # closed, called again (a shared engine): a new owner
    assert engine._owner.thread is not first
    engine.close()
    assert not engine._owner.thread.is_alive()


def test_a_confined_engine_in_a_forked_child_builds_its_own_and_never_touches_the_parents() -> None:
    Recording.threads = []
    engine = OwnedEngine(Recording, "{}")
    engine.encode(["x"])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own owner thread builds a new engine; the parent's object is left alone
        os.close(read)
        Recording.threads = []
        got = engine.encode(["hello"]).ids.tolist()
        os.write(write, json.dumps([got, Recording.threads]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        got, threads = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert got == [5]
    assert threads == [["build", "zephon-engine-owner"], ["encode", "zephon-engine-owner"]]
    engine.close()


def test_the_engine_is_chosen_on_the_calling_thread_before_the_first_batch(tokenizer_dir: str) -> None:
    """No thread prepares an engine in the background: once the encoder exists its engine is chosen."""
    before = {t.ident for t in threading.enumerate()}
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    assert {t.ident for t in threading.enumerate()} == before
    name = encoder._choice.engine.name
    encoder.encode(generate_demo_documents("prose", 3, seed=1))
    assert encoder.engine == name


EXIT_SCRIPT = """
import sys
from zephon import Pipeline
from zephon.demo import demo_dataset_path
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource
ws = StaticMixtureWorkSource(datasets=[Dataset.from_path("demo", demo_dataset_path())],
                             mixture=MixtureSpec({"demo": 1.0}), seed=1, num_documents=300)
p = Pipeline(ws).tokenize(tokenizer_id=sys.argv[1]).pack_flat(max_length=129).batch(microbatch_size=4)
if sys.argv[2] == "error":
    raise SystemExit("stopped early")
it = iter(p)
next(it)
if sys.argv[2] == "break":
    for _ in p:
        break
print("read")
"""


@pytest.mark.parametrize("how", ["error", "one-batch", "break"])
def test_a_process_that_ends_early_exits_cleanly(how: str, tokenizer_dir: str, _isolated_cache: Path) -> None:
    """An early error, a script that reads one batch and leaves its iterator open, a ``break``: the exit code the
    script asks for and nothing else on stderr (before the fix a fastokens preparation thread aborted such
    processes with "FATAL: exception not rethrown", exit 134)."""
    done = child(["-c", EXIT_SCRIPT, tokenizer_dir, how], _isolated_cache)
    if how == "error":
        assert (done.returncode, done.stderr) == (1, "stopped early\n")
    else:
        assert (done.returncode, done.stderr, done.stdout) == (0, "", "read\n")


def test_the_spot_check_picks_a_seeded_sample_of_each_batch() -> None:
    check = SpotCheck(None, fraction=0.25)  # type: ignore[arg-type]
    picked = check.picks(4000, 90_000)
    assert picked.tolist() == SpotCheck(None, fraction=0.25).picks(4000, 90_000).tolist()  # type: ignore[arg-type]
    assert 850 < len(picked) < 1150
    assert check.picks(3999, 90_000).tolist() != picked[picked < 3999].tolist()  # another batch, another draw
    assert check.picks(4000, 90_001).tolist() != picked.tolist()


def test_a_batchs_picks_are_the_seeded_draws_of_its_window_even_when_it_wraps() -> None:
    """A batch of n documents is picked where the window of n draws at its shape's offset is below the fraction,
    the window wrapping past the end of the draws; a batch longer than the draws is drawn for on its own."""
    check = SpotCheck(None)  # type: ignore[arg-type]
    draws = np.random.default_rng(spot_check.SEED).random(spot_check.PERIOD) < spot_check.FRACTION
    wraps = next(t for t in range(10**6) if spot_check._offset(5000, t) > spot_check.PERIOD - 5000)
    for count, tokens in [(1024, 80_000), (1, 7), (5000, wraps), (0, 3)]:
        window = np.roll(draws, -spot_check._offset(count, tokens))[:count]
        assert check.picks(count, tokens).tolist() == np.flatnonzero(window).tolist()
    assert abs(len(check.picks(2**21, 5)) - 2**21 * spot_check.FRACTION) < 300
    assert SpotCheck(None, fraction=1.0).picks(3, 9).tolist() == [0, 1, 2]  # type: ignore[arg-type]


def test_the_spot_check_stays_within_its_cpu_budget(tokenizer_dir: str) -> None:
    """Picks past the budget (a share of the encoding's CPU time so far), or expected to go past it (their characters
    × the check's CPU a character so far), are counted as deferred, not checked; the first pick of a run is checked."""
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), engine="tokenizers")
    check = SpotCheck(encoder.tokenizer, fraction=1.0)
    texts = generate_demo_documents("prose", 20, seed=2)
    got = encoder.ids(texts)
    check.check(texts, got, "fastokens")  # no encoding time yet: the run's first pick is checked, and goes over
    assert (check.documents, check.deferred) == (1, 19) and check.seconds > 0
    check.check(texts, got, "fastokens")
    assert (check.documents, check.deferred) == (1, 39)
    check.encoded(1e6)  # plenty of encoding since: within the budget again
    check.check(texts, got, "fastokens")
    assert (check.documents, check.deferred) == (21, 39)
    short = ["x" * 50, "y" * 200, "z" * 40]
    got = encoder.ids(short)
    check = SpotCheck(encoder.tokenizer, fraction=1.0)
    check.encoded(1.0)  # a budget of 0.02 CPU s, 0.01 spent: room for 100 characters at 100 µs a character
    check.seconds, check.characters, check.documents = 0.01, 100, 1
    check.check(short, got, "fastokens")
    assert (check.documents, check.deferred, check.characters) == (3, 1, 190)  # the 200 characters wait


class Waits(Engine):
    """An engine whose call waits (a loaded machine's stretched wall time) without using CPU."""

    name, package = "waits", "zephon"

    def encode(self, texts: Sequence[str]) -> TokenIds:
        threading.Event().wait(0.02)
        return from_lists([[len(t)] for t in texts])


def test_the_budget_counts_the_engines_cpu_time_not_its_wall_time(tokenizer_dir: str) -> None:
    """Before, the encoding's share was its wall time times its slices: 20 ms of waiting on 2 slices counted
    40 ms. Now each slice's thread CPU is summed, on the pool's threads and on a confined engine's owner thread."""
    pool = ThreadPoolExecutor(1)
    got, cpu = encode_timed(Waits("{}"), ["a"] * 16, 2, pool)
    assert got.ids.tolist() == [1] * 16 and 0 <= cpu < 0.01
    owned = OwnedEngine(Waits, "{}")
    got, cpu = owned.encode_cpu(["ab", "c"])
    assert got.ids.tolist() == [2, 1] and 0 <= cpu < 0.01
    owned.close()
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), engine="tokenizers")
    texts = generate_demo_documents("prose", 40, seed=4)
    spent = time.thread_time()
    got, cpu = encode_timed(encoder._choice.engine, texts, 1, None)
    assert 0 < cpu <= time.thread_time() - spent  # on this thread: its own clock
    pool.shutdown()


class OneWrongId(FastokensEngine):
    """fastokens, with one id changed in documents holding a marker (an engine that disagrees deep in a run)."""

    def encode(self, texts: Sequence[str]) -> TokenIds:
        got = super().encode(texts)
        ids, ends = got.ids.astype(np.int64), np.cumsum(got.sizes)
        for i, text in enumerate(texts):
            if "Zanzibar" in text and got.sizes[i]:
                ids[ends[i] - 1] += 1
        return TokenIds(ids, got.sizes)


@pytest.mark.skipif(importlib.util.find_spec("fastokens") is None, reason="fastokens is not installed")
def test_an_engine_that_differs_deep_in_the_run_stops_it_in_one_line_and_is_refused_next_time(
    tokenizer_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon.executor.engines import builders, choose

    texts = generate_demo_documents("prose", 200, seed=3)
    texts[150] = "A voyage to Zanzibar. " + texts[150]
    (tmp_path / "web").mkdir()
    pq.write_table(pa.table({"text": texts}), tmp_path / "web" / "part-0.parquet", row_group_size=50)
    classes = builders.engine_classes()
    monkeypatch.setattr(builders, "engine_classes", lambda: {**classes, "fastokens": OneWrongId})
    monkeypatch.setattr(choose, "_BUILT", {})  # no real fastokens built by an earlier test
    monkeypatch.setattr(spot_check, "FRACTION", 1.0)  # check every document: the marker's is found for sure
    monkeypatch.setattr(spot_check, "BUDGET", float("inf"))

    def pipeline() -> Pipeline:
        ws = StaticMixtureWorkSource(
            datasets=[Dataset.from_path("web", str(tmp_path / "web"))], mixture=MixtureSpec({"web": 1.0}), seed=0
        )
        return Pipeline(ws).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=65).batch(microbatch_size=2)

    shard = tmp_path / "web" / "part-0.parquet"
    with pytest.raises(EngineMismatch) as caught:
        list(pipeline())
    message = str(caught.value)
    assert "\n" not in message and isinstance(caught.value, TokenizerError)
    assert message.startswith(
        f"tokenizer engine fastokens must give tokenizers' ids, got other ids for dataset 'web': shard {shard} row 150 ("
    )
    assert "fastokens is refused for this tokenizer from now on" in message
    again = pipeline()
    list(again)  # the refusal was cached: the next run chooses another engine and completes
    assert again.stats().tokenizer_engine != "fastokens"
    detail = re.search(r"\((\d+ tokens against \d+, first difference at token \d+)\)", message)
    assert detail is not None
    assert again.stats().refused_engines["fastokens"] == detail.group(1)


def test_a_damaged_tokenizer_json_is_one_line(tmp_path: Path, tokenizer_dir: str) -> None:
    """A truncated tokenizer.json: tokenizers raises a bare ``Exception``; the user gets one line naming the file."""
    (tmp_path / "tokenizer.json").write_bytes((Path(tokenizer_dir) / "tokenizer.json").read_bytes()[:500])
    with pytest.raises(TokenizerError) as caught:
        Encoder(TokenizeSpec(tokenizer_id=str(tmp_path)))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'tokenizer.json'} must be a tokenizer.json that tokenizers can load, got: ")
    assert message.endswith("— restore the file, or save the tokenizer again with save_pretrained()")
