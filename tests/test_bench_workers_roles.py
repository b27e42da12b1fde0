"""``benchmarks/bench_workers.py --threads``: CPU seconds by role, read from ``/proc`` for this process and its
children — checked against real threads and a real child process that burn known CPU."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

bench_workers = pytest.importorskip("bench_workers")

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _helper(burnt: threading.Event, read: threading.Event) -> None:
    _burn(0.2)
    burnt.set()
    read.wait(30)  # alive until read: a thread that ended before any reading is not seen


def _child(go: multiprocessing.synchronize.Event, done: multiprocessing.synchronize.Event) -> None:
    go.wait()
    _burn(0.3)
    done.set()
    time.sleep(30)  # alive until the parent has read it (terminated then)


def test_roles_split_callers_from_other_threads_in_this_process_and_its_children() -> None:
    context = multiprocessing.get_context("fork")
    go, done = context.Event(), context.Event()
    worker = context.Process(target=_child, args=(go, done))
    worker.start()
    try:
        start: bench_workers.Readings = {}
        bench_workers.role_cpu(start)
        assert any(role == "worker callers" for role, _ in start.values())  # the child is seen
        go.set()
        burnt, read = threading.Event(), threading.Event()
        helper = threading.Thread(target=_helper, args=(burnt, read))
        helper.start()
        _burn(0.1)
        assert done.wait(30) and burnt.wait(30)
        end: bench_workers.Readings = {}
        bench_workers.role_cpu(end)
        read.set()
        helper.join()
    finally:
        worker.terminate()
        worker.join()
    spent = bench_workers.by_role(start, end)
    assert set(spent) == set(bench_workers.ROLES)
    # clock ticks are 10 ms: each burn is read within a few ticks of what it spent
    assert 0.25 <= spent["worker callers"] <= 0.6, spent
    assert 0.15 <= spent["loader threads"] <= 0.4, spent
    assert 0.05 <= spent["loader caller"] <= 0.5, spent
    assert spent["worker threads"] < 0.05, spent
