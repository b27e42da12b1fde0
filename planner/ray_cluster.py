"""The planner's Ray plumbing, shared by every step that runs as Ray tasks (``engine="ray"``).

Steps on Ray: footer scans (``zephon.planner.ray_scan``), the partitions of a sidecar join
(``zephon.planner.selection.ray_join``), the count pass (``zephon.planner.counts.ray_pass``) and
``zephon tokenize`` (``zephon.planner.tokenize.ray_tasks``). Each submits its tasks through :func:`run_tasks`
and takes the results back **by task index**, never in completion order, so what the driver writes is the
local path's bytes whatever the cluster's shape, speed or failures.

* Session: :func:`ray_session` joins a running Ray (``ray.init`` already called), else the cluster named by
  ``RAY_ADDRESS``, else starts a local instance of ``workers`` CPUs, shut down after the step.
* Lost workers: every task is submitted with ``max_retries=MAX_RETRIES``: a worker process or a node that dies
  mid-task has its task run again elsewhere. Tasks are idempotent (they return values or write files through a
  temporary and a rename), so a retried task gives the bytes the first attempt would have.
* Errors: a task's :class:`~zephon.errors.ZephonError` is raised on the driver as the same one-line error (Ray
  wraps it in a ``RayTaskError``); it is not retried (``retry_exceptions=False``): bad input stays bad.
* Object stores and the Hub: the settings the driver reads each bucket with (a run's ``StoreCredentials``, else
  its environment's variables), and for ``hf://`` paths its ``HF_ENDPOINT``, token and ``HF_HUB_OFFLINE``, travel
  with the tasks (:func:`driver_credentials`, :func:`adopt_credentials`), so every node reads them as the driver
  does; they stay inside the cluster (never in a plan, log or error).
* Paths: a task refuses, naming its node, a path the driver handed it that its node cannot see
  (:func:`require_visible`) — shards, output and spill directories must be on storage every node mounts at
  the same path (docs/ray.md).

Worked example: 5 tasks on 2 nodes; task 3's worker is killed after task 4 finished. Results arrive as 0 4 1 2
(3 is resubmitted), 3; ``run_tasks`` hands them to the caller's ``on_result`` as they come (progress) and
returns ``[r0, r1, r2, r3, r4]``.

``ZEPHON_RAY_FAILPOINT`` (tests): a file path; the first task to start while that file exists removes it and
kills its own worker process (``SIGKILL``), as a crashed or pre-empted node would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from zephon.errors import ConfigError, DatasetError, ZephonError
from zephon.specs import StoreCredentials

__all__ = [
    "ENGINES",
    "HUB_VARIABLES",
    "MAX_RETRIES",
    "TaskAccess",
    "adopt_credentials",
    "check_engine",
    "driver_credentials",
    "failpoint",
    "ray_session",
    "require_visible",
    "run_tasks",
]

#: The engines a heavy planning step runs on: this machine, or Ray tasks.
ENGINES = ("local", "ray")
#: Times a task whose worker died is run again (Ray's ``max_retries``).
MAX_RETRIES = 3
#: Seconds between collections of finished tasks.
WAIT_S = 0.2
#: Seconds a cancelled step waits for its running tasks to end (a Ray task is interrupted between statements).
CANCEL_WAIT_S = 30
#: Environment variable of the fault-injection file (see the module docstring).
FAILPOINT_ENV = "ZEPHON_RAY_FAILPOINT"


def check_engine(engine: object) -> str:
    """``engine`` checked: "local" or "ray"."""
    if engine not in ENGINES:
        raise ConfigError(f'engine must be "local" or "ray", got {engine!r} — pick one')
    return str(engine)


def _import_ray():  # -> module
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "engine 'ray' must have Ray installed, got no `ray` module — pip install 'zephon[ray]', or use the "
            "local engine"
        ) from exc
    return ray


@contextlib.contextmanager
def ray_session(workers: int | None = None) -> Iterator[Any]:
    """The ``ray`` module, joined to the running Ray (initialized in this process), the cluster of ``RAY_ADDRESS``,
    or a local instance of ``workers`` CPUs started here and shut down after — never a cluster that merely runs
    on this machine: join one by setting ``RAY_ADDRESS``."""
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        # Without RAY_ADDRESS a local instance of its own ("local"): a bare ray.init() would join a cluster that
        # `ray start` left running on this machine and then refuse num_cpus ("When connecting to an existing
        # cluster, num_cpus and num_gpus must not be provided").
        kwargs = {"address": address} if address else {"address": "local", "num_cpus": workers or os.cpu_count() or 1}
        ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", **kwargs)
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def run_tasks(
    ray: Any,
    function: Callable[..., Any],
    arguments: Sequence[tuple[Any, ...]],
    *,
    on_result: Callable[[int, Any], None] | None = None,
    memory: int | None = None,
) -> list[Any]:
    """Run ``function(*arguments[i])`` as one Ray task per ``i`` (retried on a lost worker); the results by ``i``.

    ``on_result(i, result)`` is called as each result arrives (any order); ``memory``: bytes each task reserves
    in Ray's scheduler (a DuckDB join's limit), so a node runs no more of them at once than it has memory for."""
    options: dict[str, Any] = {
        "max_retries": MAX_RETRIES,
        "retry_exceptions": False,
        "num_cpus": 1,
        "scheduling_strategy": "SPREAD",  # over every node, not packed onto the driver's first
    }
    if memory is not None:
        options["memory"] = memory
    remote = ray.remote(**options)(function)
    pending = {remote.remote(*args): i for i, args in enumerate(arguments)}
    results: list[Any] = [None] * len(arguments)
    remaining = list(pending)
    try:
        while remaining:
            # Whatever finished within WAIT_S, at once: one wait per WAIT_S over the refs left, not one per task
            # (10^5 count tasks would otherwise cost 10^10 ref checks).
            done, remaining = ray.wait(remaining, num_returns=len(remaining), timeout=WAIT_S)
            for ref in done:
                i = pending.pop(ref)
                try:
                    results[i] = ray.get(ref)
                except Exception as exc:  # a task's ZephonError arrives wrapped (RayTaskError): its one line
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, ZephonError):
                        raise cause from None
                    raise
                if on_result is not None:
                    on_result(i, results[i])
    finally:
        if pending:  # an error or Ctrl-C: cancel the rest, and let them end before the caller cleans up
            _cancel(ray, list(pending))
    return results


def _cancel(ray: Any, refs: list[Any]) -> None:
    """Cancel ``refs`` (a running task gets ``KeyboardInterrupt``, so its ``finally`` blocks run) and wait up to
    ``CANCEL_WAIT_S`` for them to end: no task of the step still writes when the step's files are removed."""
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=False)
    with contextlib.suppress(Exception):
        ray.wait(refs, num_returns=len(refs), timeout=CANCEL_WAIT_S)


#: The variables the driver reads the Hub with (``zephon.storage.hub``: read at call time); they travel with a
#: task that reads ``hf://`` paths, as a bucket's settings do (``HF_TOKEN``: the token the driver resolved, from
#: the variable or ``hf auth login``).
HUB_VARIABLES = ("HF_ENDPOINT", "HF_TOKEN", "HF_HUB_OFFLINE")


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskAccess:
    """What a task needs to read the driver's remote paths as the driver reads them.

    Attributes:
        stores: one ``StoreCredentials`` a bucket among the task's object-store paths.
        hub: for a task with ``hf://`` paths, each of ``HUB_VARIABLES`` → the driver's value (``None``: unset
            there, so unset in the task too); empty otherwise.
    """

    stores: tuple[StoreCredentials, ...] = ()
    hub: tuple[tuple[str, str | None], ...] = ()

    def __repr__(self) -> str:  # values are secrets: never in a log or an error
        names = [c.prefix for c in self.stores] + (["hf://"] if self.hub else [])
        return f"TaskAccess({', '.join(names)})"


def driver_credentials(uris: Iterable[str]) -> TaskAccess:
    """The settings this driver reads ``uris`` with: one ``StoreCredentials`` a bucket, and its Hub variables
    when one of them is an ``hf://`` path (nothing for local paths)."""
    from zephon.storage.objects.paths import is_object_uri, parse_object_path
    from zephon.storage.objects.stores import settings_for

    found: dict[str, StoreCredentials] = {}
    hub = False
    for uri in uris:
        if is_object_uri(uri):
            path = parse_object_path(uri)
            prefix = f"{path.cloud}://{path.bucket}"
            if prefix not in found:
                found[prefix] = StoreCredentials(prefix=prefix, env=settings_for(path))
        hub = hub or uri.startswith("hf://")
    return TaskAccess(stores=tuple(found.values()), hub=_driver_hub() if hub else ())


def _driver_hub() -> tuple[tuple[str, str | None], ...]:
    from huggingface_hub import get_token

    values = {name: os.environ.get(name) for name in HUB_VARIABLES}
    values["HF_TOKEN"] = get_token()
    return tuple(values.items())


def adopt_credentials(access: TaskAccess) -> None:
    """In a task: read the driver's buckets and the Hub with the driver's settings (``driver_credentials``). The
    Hub's variables are set in this worker process, which serves this job's tasks only."""
    if access.stores:
        from zephon.storage.objects.stores import register_credentials

        register_credentials(access.stores)
    for name, value in access.hub:
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if access.hub:  # huggingface_hub read HF_HUB_OFFLINE once, when this worker imported it; its requests obey that
        from huggingface_hub import constants

        from zephon.storage.hub.errors import hub_offline

        constants.HF_HUB_OFFLINE = hub_offline()


def failpoint() -> None:
    """Kill this worker process when the fault-injection file exists (tests; module docstring)."""
    path = os.environ.get(FAILPOINT_ENV)
    if not path:
        return
    try:
        os.unlink(path)  # one task only: the first to remove it
    except OSError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def require_visible(paths: Sequence[str], what: str, fix: str) -> None:
    """Refuse, in one line naming this node, the first of ``paths`` this Ray worker cannot see (local paths only).

    ``what`` names the paths ("dataset 'web': shard"), ``fix`` says how to share them."""
    for path in paths:
        if "://" not in path and not os.path.exists(path):
            raise DatasetError(
                f"{what} {path} must be visible to every Ray node at the same path, got missing on node "
                f"{socket.gethostname()} ({_node_ip()}) — {fix}"
            )


def _node_ip() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # outside a Ray worker: the host name says enough
        return "no Ray node"
