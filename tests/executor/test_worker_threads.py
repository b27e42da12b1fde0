"""What a DataLoader worker runs on: its share of the cores (``zephon.executor.cores.share_cores``), so N workers
on N cores run one tokenizer thread each, and the batches are those of no workers; a tokenizer is serialized once
per process (``tokenizer_config``), not once per encoder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_parquet_dataset

from zephon import Pipeline
from zephon.executor import cores
from zephon.executor.encode import load
from zephon.executor.encode.text import Encoder, tokenizer_threads
from zephon.io import Dataset
from zephon.specs import TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("threads")
    web = write_parquet_dataset(root, "web", [40, 40])
    ws = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web))], mixture=MixtureSpec({"web": 1.0}), seed=5
    )
    return ws.plan(root / "plan")


def test_a_worker_of_two_gets_half_the_cores_and_rayon_as_many_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores, "_workers", [1])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    assert cores.usable_cores() == 5
    cores.share_cores(2)
    assert (cores.usable_cores(), os.environ["RAYON_NUM_THREADS"], tokenizer_threads()) == (2, "2", 2)
    cores.share_cores(8)  # more workers than cores: one each
    assert cores.usable_cores() == 1
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")  # the user's setting stays
    cores.share_cores(2)
    assert (os.environ["RAYON_NUM_THREADS"], tokenizer_threads(), tokenizer_threads(4)) == ("3", 3, 4)


@pytest.mark.parametrize(
    ("affinity", "threads", "expected"),
    [(2, None, "1"), (16, None, "15"), (16, 1, "16"), (1, None, "1"), (3, 2, "2")],
)
def test_fastokens_helpers_leave_the_cores_to_our_calls_unless_the_user_sized_them(
    affinity: int, threads: int | None, expected: str, tokenizer_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An encoder sizes fastokens' threads a call (read by fastokens once a process) so that its helpers and our
    calls at once fill the cores: cores - min(threads, CALLS_AT_ONCE) + 1, at least 1; a user's value stays."""
    from zephon.executor.encode.text import CALLS_AT_ONCE
    from zephon.executor.read.ahead import DEPTH

    assert CALLS_AT_ONCE == DEPTH  # the chunks ready ahead of the caller are the calls that run at once
    monkeypatch.setattr(cores, "_workers", [1])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)))
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    monkeypatch.delenv("FASTOKENS_BPE_THREADS", raising=False)
    monkeypatch.setenv("ZEPHON_TOKENIZER_ENGINE", "tokenizers")  # the rule holds whatever engine is chosen
    Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), threads=threads)
    assert os.environ["FASTOKENS_BPE_THREADS"] == expected
    assert os.environ["ZEPHON_FASTOKENS_SIZED"] == f"{os.getpid()}:{expected}"
    with monkeypatch.context() as m:  # this process's first sizing stands (fastokens reads it once)
        m.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
        Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), threads=threads)
    assert os.environ["FASTOKENS_BPE_THREADS"] == expected
    monkeypatch.setenv("FASTOKENS_BPE_THREADS", "7")  # the user's
    Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), threads=threads)
    assert os.environ["FASTOKENS_BPE_THREADS"] == "7"
    monkeypatch.setenv("ZEPHON_FASTOKENS_SIZED", "1:40")  # ours once, then changed by the user: theirs
    Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), threads=threads)
    assert os.environ["FASTOKENS_BPE_THREADS"] == "7"
    monkeypatch.setenv("FASTOKENS_BPE_THREADS", "40")  # written by another process (a parent): sized again here
    Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), threads=threads)
    assert os.environ["FASTOKENS_BPE_THREADS"] == expected


@pytest.mark.parametrize(("inherited", "kept"), [({"ZEPHON_FASTOKENS_SIZED": "1:40"}, False), ({}, True)])
def test_a_process_started_from_ours_sizes_fastokens_for_its_own_cores(
    inherited: dict[str, str], kept: bool, tokenizer_dir: str
) -> None:
    """A spawned DataLoader worker inherits its parent's environment: the 40 threads a call Zephon sized on the
    parent's machine are sized again for the worker's cores; 40 set by the user are kept."""
    code = (
        "import os; from zephon.executor.encode.text import Encoder; from zephon.specs import TokenizeSpec; "
        f"Encoder(TokenizeSpec(tokenizer_id={tokenizer_dir!r}), threads=1); print(os.environ['FASTOKENS_BPE_THREADS'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "ZEPHON_FASTOKENS_SIZED"}  # only what the case inherits
    env.update({"FASTOKENS_BPE_THREADS": "40", "ZEPHON_TOKENIZER_ENGINE": "tokenizers", **inherited})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ("40" if kept else str(len(os.sched_getaffinity(0))))  # 1 call: cores - 1 + 1


def test_two_workers_each_run_on_their_share_of_the_cores_with_the_batches_of_none(
    plan: Path, tokenizer_dir: str, tmp_path: Path
) -> None:
    seen = tmp_path / "seen"
    seen.mkdir()

    def note(record: dict) -> dict:  # what the process that reads this record runs on (a side note, same output)
        from zephon.executor.cores import usable_cores

        (seen / str(os.getpid())).write_text(json.dumps([usable_cores(), os.environ.get("RAYON_NUM_THREADS")]))
        return record

    def pipe() -> Pipeline:
        return (
            Pipeline.from_plan(plan)
            .map_transform(note)
            .tokenize(tokenizer_id=tokenizer_dir)
            .pack_flat(max_length=33)
            .batch(microbatch_size=4)
        )

    expected = [t["labels"].tolist() for t in pipe().dataloader()]
    main = os.getpid()
    got = [t["labels"].tolist() for t in pipe().dataloader(num_workers=2, multiprocessing_context="fork")]
    assert got == expected
    workers = {int(p.name): json.loads(p.read_text()) for p in seen.iterdir() if int(p.name) != main}
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    rayon = os.environ.get("RAYON_NUM_THREADS", str(share))
    assert len(workers) == 2 and all(v == [share, rayon] for v in workers.values()), workers
    assert cores.usable_cores() == len(os.sched_getaffinity(0))  # the loader's own process keeps every core


def test_a_tokenizer_is_serialized_once_for_every_encoder_of_it(tokenizer_dir: str) -> None:
    first = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    kept = dict(load._CONFIGS)
    second = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir, add_bos=True))
    assert first.tokenizer is second.tokenizer and kept == load._CONFIGS
    assert load.tokenizer_config(first.tokenizer) is kept[id(first.tokenizer)][1]
    assert load.tokenizer_config(first.tokenizer) == first.tokenizer.to_str()
    assert first.fingerprint != second.fingerprint  # the specials still count


@pytest.mark.parametrize("worker", ["counts", "tokenize", "ray"])
@pytest.mark.parametrize(("inherited", "expected"), [({"ZEPHON_FASTOKENS_SIZED": "1:40"}, "1"), ({}, "40")])
def test_a_planning_worker_encodes_on_one_thread(
    worker: str, inherited: dict[str, str], expected: str, tokenizer_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count pass's (local and Ray) and ``zephon tokenize``'s worker processes each encode on one thread:
    Rayon's pool at 1 and fastokens' threads a call at 1 — the 40 their parent sized for its cores sized again (it
    would give each of N workers 40), the user's 40 kept."""
    import importlib
    import io
    from dataclasses import asdict

    if worker == "ray":  # a Ray worker process's encoder (the function its tasks call; no cluster needed)
        from zephon.planner.counts import ray_pass

        monkeypatch.setattr(ray_pass, "_ENCODERS", {})
        main = lambda: ray_pass.worker_encoder(asdict(TokenizeSpec(tokenizer_id=tokenizer_dir)))  # noqa: E731
    else:
        main = importlib.import_module(f"zephon.planner.{worker}.worker").main
    spec = asdict(TokenizeSpec(tokenizer_id=tokenizer_dir))
    job = {"tokenize": spec, "tasks": [], "single_thread": True, "dtype": "uint32"}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(job)))
    monkeypatch.setenv("RAYON_NUM_THREADS", "8")
    monkeypatch.setenv("FASTOKENS_BPE_THREADS", "40")
    monkeypatch.delenv("ZEPHON_FASTOKENS_SIZED", raising=False)
    for name, value in inherited.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ZEPHON_TOKENIZER_ENGINE", "tokenizers")
    main()  # no tasks: the encoder is made, nothing is read
    assert (os.environ["RAYON_NUM_THREADS"], os.environ["FASTOKENS_BPE_THREADS"]) == ("1", expected)
