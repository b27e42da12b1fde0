"""A DataLoader worker of ``Pipeline.dataloader()`` that dies or stops answering, and an iteration that fails
(``zephon.loader_failures``): the error comes promptly, in one line where the loader raises it, no worker is left
alive, and iterating again resumes right after the last batch handed out — never the plan's first batches again;
and what the loader says of an epoch (``len``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from support.demo_plans import texts_plan

from zephon import Pipeline
from zephon.errors import DatasetError, WorkerLost
from zephon.executor.pack import calibration
from zephon.loader_failures import lost_message, worker_loss

MAX_LENGTH = 33


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("failures")
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    return texts_plan(root / "web", [f"doc {r} " + "word " * (r % 11) for r in range(3000)], root / "plan")


def pipeline(plan: Path, tokenizer_dir: str) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .options(read_chunk=16)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=2, global_batch_size=4)
    )


def key(tensors: dict[str, Any]) -> bytes:
    return b"".join(tensors[k].numpy().tobytes() for k in sorted(tensors) if torch.is_tensor(tensors[k]))


def children() -> set[int]:
    """This process's child processes (from /proc)."""
    me, found = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.add(int(entry))
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (a zombie or a reaped process is not)."""
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.add(pid)
    return running


@pytest.fixture(scope="module")
def reference(plan, tokenizer_dir) -> list[bytes]:
    return [key(batch.to_training()) for batch in pipeline(plan, tokenizer_dir)]


def test_a_silent_worker_times_out_promptly_in_one_line_and_a_retry_resumes(plan, tokenizer_dir, reference) -> None:
    """Workers stopped (SIGSTOP, as a hung network read): with ``timeout=2`` the error came 20 s late and the
    interpreter then hung at exit joining them; now ``WorkerLost`` comes within the timeout and a moment, every
    worker is gone, and iterating again gives exactly the batches after the last one handed out."""
    loader = pipeline(plan, tokenizer_dir).dataloader(num_workers=2, timeout=2)
    before = children()
    got: list[bytes] = []
    workers: set[int] = set()
    stopped, raised = 0.0, None
    try:
        for tensors in loader:
            got.append(key(tensors))
            if len(got) == 3:
                workers = children() - before
                assert len(workers) == 2
                for pid in workers:
                    os.kill(pid, signal.SIGSTOP)
                stopped = time.monotonic()
    except WorkerLost as exc:
        raised = exc
    finally:
        for pid in alive(workers):
            os.kill(pid, signal.SIGKILL)
    assert raised is not None, "the stopped workers must time the loader out"
    assert time.monotonic() - stopped < 2 + 6  # the timeout and the pieces already sent, not 5 s a worker more
    message = str(raised)
    assert "\n" not in message and message.startswith("DataLoader timed out after 2 seconds: the run stands before step")
    assert "iterate the loader again" in message and "timeout=" in message
    assert not alive(workers), "no worker of the failed iteration is left running"
    assert got == reference[: len(got)]
    rest = [key(tensors) for tensors in loader]  # the retry: new workers, after the last batch handed out
    assert got + rest == reference


def test_a_worker_killed_while_training_runs_is_raised_by_the_loader_and_resumed(plan, tokenizer_dir, reference):
    """A worker killed by SIGKILL (the out-of-memory killer) while the training step runs: torch's SIGCHLD handler
    raised its ``RuntimeError`` in the training step's own code (that batch was never trained on, and the loader saw
    only its iteration closed, as by a ``break``: the next iteration started at the plan's start), or in the loader
    between taking a batch and handing it out (the state counted a batch never handed out: a retry skipped it).
    The loader now notes the signal and raises ``WorkerLost`` at its next fetch, and the retry resumes after the
    last batch handed out."""
    loader = pipeline(plan, tokenizer_dir).dataloader(num_workers=2)
    before = children()
    got: list[bytes] = []
    stepped = 0
    with pytest.raises(WorkerLost, match=r"^DataLoader worker \(pid"):
        for tensors in loader:
            got.append(key(tensors))
            if len(got) == 4:
                os.kill(min(children() - before), signal.SIGKILL)
                time.sleep(0.5)  # "the training step": the worker's death arrives meanwhile, and is not raised here
            stepped += 1
    assert stepped == len(got)  # every batch handed out was trained on, the fourth included
    assert 4 <= len(got) < len(reference) and got == reference[: len(got)]
    rest = [key(tensors) for tensors in loader]
    assert got + rest == reference


def batches_of(plan: Path, tokenizer_dir: str, workers: int | None) -> Any:
    """The pipeline itself (``workers`` None), or its ``dataloader(num_workers=workers)``."""
    pipe = pipeline(plan, tokenizer_dir)
    if workers is None:
        return _Dicts(pipe)
    return pipe.dataloader(num_workers=workers)


class _Dicts:
    """A pipeline's iterations as training dicts."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe

    def __iter__(self) -> Any:
        return (batch.to_training() for batch in self.pipe)


@pytest.mark.parametrize("workers", [None, 0, 2])
def test_an_iteration_that_failed_is_resumed_not_restarted(tmp_path, tokenizer_dir, workers, monkeypatch) -> None:
    """A bad document under ``on_bad_document="raise"``: the retry raised it again only after handing out every
    batch before it a second time (from the plan's start); it now raises it at once, where the run stands —
    iterating the pipeline or its loader. A ``break`` keeps its epochs: the next iteration starts at the plan's
    start."""
    monkeypatch.setattr(calibration, "CALIBRATION_UNITS", 0)  # else the calibration reads this small plan whole
    texts = [None if r == 2400 else f"doc {r} " + "word " * (r % 9) for r in range(2600)]
    bad = texts_plan(tmp_path / "web", texts, tmp_path / "plan")
    loader = batches_of(bad, tokenizer_dir, workers)
    first: list[bytes] = []
    with pytest.raises(DatasetError, match="row 2400") as error:
        for tensors in loader:
            first.append(key(tensors))
    assert len(first) > 10
    again: list[bytes] = []
    with pytest.raises(DatasetError) as raised:
        for tensors in loader:
            again.append(key(tensors))
    assert again == [] and str(raised.value) == str(error.value)
    fresh = batches_of(bad, tokenizer_dir, workers)
    for tensors in fresh:
        assert key(tensors) == first[0]
        break
    assert key(next(iter(fresh))) == first[0]  # after a break: the plan's start again


def test_torchs_words_for_a_lost_worker_become_one_line_with_where_and_how() -> None:
    killed = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    assert worker_loss(killed) == "DataLoader worker (pid 4242) is killed by signal: Killed."
    assert worker_loss(RuntimeError("DataLoader worker (pid(s) 7, 8) exited unexpectedly")) is not None
    assert worker_loss(RuntimeError("CUDA out of memory")) is None and worker_loss(ValueError("x")) is None
    line = lost_message(worker_loss(killed) or "", {"step": 48, "microbatch": 1})
    assert line.startswith("DataLoader worker (pid 4242) is killed by signal: Killed: the run stands before step 48 "
                           "microbatch 1, every batch before it handed out — iterate the loader again")  # fmt: skip
    assert "it resumes there" in line and "out of memory" in line
    assert "before its first batch" in lost_message("DataLoader timed out after 3 seconds", None)


@pytest.mark.parametrize("bad_row", [2100, 2251, 2400, 2590])  # past the calibration's 2,048
def test_the_state_after_an_error_is_the_state_after_the_last_batch(tmp_path, tokenizer_dir, bad_row, monkeypatch):
    """A bad document's error is raised for the first microbatch that would hold it, which is never handed out:
    ``state_dict()`` then said that microbatch was (one more step or microbatch) and put its lane's cursor past the
    bad document — a checkpoint taken after catching the error, or a retry from it, skipped them silently. It is
    now the state after the last batch handed out, wherever in a block of microbatches the error falls."""
    monkeypatch.setattr(calibration, "CALIBRATION_UNITS", 0)
    texts = [None if r == bad_row else f"doc {r} " + "word " * (r % 9) for r in range(2600)]
    pipe = pipeline(texts_plan(tmp_path / "web", texts, tmp_path / "plan"), tokenizer_dir)
    last = None
    with pytest.raises(DatasetError, match=f"row {bad_row} "):
        for _ in pipe:
            last = pipe.state_dict()
    assert last is not None and pipe.state_dict() == last


def test_an_exact_plans_state_after_an_error_is_the_state_after_the_last_batch(tmp_path, tokenizer_dir) -> None:
    """An exact plan counted a microbatch as handed out before reading its rows: a shard changed since planning
    left ``state_dict()`` one microbatch ahead, and a retry skipped it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon.io import Dataset
    from zephon.specs import PackSpec, TokenizeSpec
    from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource

    (tmp_path / "web").mkdir()
    for i in range(3):
        texts = [f"shard {i} doc {r} " + "word " * (r % 13) for r in range(800)]
        pq.write_table(pa.table({"text": texts}), tmp_path / "web" / f"part-{i}.parquet", row_group_size=100)
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(tmp_path / "web"))], mixture=MixtureSpec({"web": 1}), seed=1,
        shuffle=ShuffleSpec(enabled=False), exact_tokens=True,
    )  # fmt: skip
    plan = source.plan(tmp_path / "plan", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=PackSpec(max_length=33))
    reference = [key(batch.to_training()) for batch in pipeline(plan, tokenizer_dir)]
    pq.write_table(pa.table({"text": ["changed " * 5] * 801}), tmp_path / "web" / "part-2.parquet")
    pipe = pipeline(plan, tokenizer_dir)
    got, last = [], None
    with pytest.raises(DatasetError, match="part-2.parquet changed since planning"):
        for batch in pipe:
            got.append(key(batch.to_training()))
            last = pipe.state_dict()
    assert got and got == reference[: len(got)] and pipe.state_dict() == last
    again = []
    with pytest.raises(DatasetError, match="changed since planning"):
        for batch in pipe:  # resumed: the batches before the changed shard, none twice, none skipped
            again.append(key(batch.to_training()))
    assert got + again == reference[: len(got) + len(again)]


def test_the_spill_directories_of_workers_the_loader_ended_are_removed(tmp_path, make_parquet, tokenizer_dir, monkeypatch):
    """Workers keeping decoded row groups in files (``zephon.executor.read.spill``: no share, a tiny budget) that
    the loader kills after a timeout cannot remove their own directories: the loader removes them."""
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    monkeypatch.setenv("ZEPHON_SHARE_ROW_GROUPS", "off")
    monkeypatch.setenv("ZEPHON_DECODED_MEMORY", "1KiB")
    (tmp_path / "spill").mkdir()
    monkeypatch.setenv("ZEPHON_SPILL_DIR", str(tmp_path / "spill"))
    data = make_parquet("web", [1500, 1500], row_group_size=100)
    source = StaticMixtureWorkSource(datasets=[Dataset.from_path("web", str(data))], mixture=MixtureSpec({"web": 1}), seed=3)
    loader = pipeline(source.plan(tmp_path / "plan"), tokenizer_dir).dataloader(num_workers=2, timeout=2)
    before = children()
    workers: set[int] = set()
    try:
        with pytest.raises(WorkerLost, match="timed out"):
            for n, _ in enumerate(loader):
                if n == 3:
                    workers = children() - before
                    assert len(os.listdir(tmp_path / "spill")) >= 2  # each worker's directory, with files
                    for pid in workers:
                        os.kill(pid, signal.SIGSTOP)
    finally:
        for pid in alive(workers):
            os.kill(pid, signal.SIGKILL)
    assert os.listdir(tmp_path / "spill") == []


def test_ctrl_c_while_a_worker_is_stopped_ends_at_once(plan, tokenizer_dir) -> None:
    """Ctrl-C while the loader waits on a stopped worker (no ``timeout=``): torch's shutdown waited 5 s for each
    stopped worker, sent it a SIGTERM it does not act on and waited 5 s more (10 s a worker); it is killed now."""
    import threading

    loader = pipeline(plan, tokenizer_dir).dataloader(num_workers=2)
    before = children()
    workers: set[int] = set()
    interrupted = 0.0
    try:
        with pytest.raises(KeyboardInterrupt):
            for n, _ in enumerate(loader):
                if n == 2:
                    workers = children() - before
                    for pid in workers:
                        os.kill(pid, signal.SIGSTOP)
                    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
                    interrupted = time.monotonic() + 1.0
    finally:
        for pid in alive(workers):
            os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - interrupted < 3 and not alive(workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_len_of_a_loader_is_an_epochs_microbatches(plan, tokenizer_dir, reference, workers) -> None:
    """``len(loader)`` was a bare ``TypeError`` (helper-43), where a scheduler's total steps or a progress bar asks
    for it: an epoch's dicts on this rank, ``num_steps()`` × microbatches a step — what an iteration from the plan's
    start hands out."""
    loader = pipeline(plan, tokenizer_dir).dataloader(num_workers=workers)
    assert len(loader) == loader.num_steps() * 2 == len(reference)
    assert sum(1 for _ in loader) == len(loader)
