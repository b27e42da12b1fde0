"""Retrying Hub requests: 429/5xx and network errors are tried again with exponential backoff, then reported.

A call without a policy uses :data:`DEFAULT_RETRY`, read at call time (:func:`retry_policy`), so tests may
monkeypatch a faster one here — on this module: ``zephon.storage.hub.client`` only re-exports the value.
API calls retry through :func:`with_retries`; file reads (:mod:`zephon.storage.hub.fetch`) pass the same policy
to ``huggingface_hub``'s ``http_stream_backoff`` and retry broken bodies themselves. Tree-listing pages are
retried by ``huggingface_hub``'s own ``http_backoff`` and not again here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from zephon.errors import HubError
from zephon.storage.hub.errors import HTTP_ERRORS, RETRY_STATUSES, TransportError, http_status

__all__ = ["DEFAULT_RETRY", "RetryPolicy", "retry_policy", "with_retries"]

_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """``attempts`` tries in total on 429/5xx/network errors, sleeping ``base_delay * 2**(n-1)`` seconds
    (at most ``max_delay``) after the n-th failure."""

    attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 4.0

    def delay(self, failures: int) -> float:
        return min(self.max_delay, self.base_delay * 2 ** (failures - 1))


DEFAULT_RETRY = RetryPolicy()  # read at call time, so tests may monkeypatch a faster one


def retry_policy(retry: RetryPolicy | None) -> RetryPolicy:
    """``retry``, or :data:`DEFAULT_RETRY` as it is now."""
    return retry or DEFAULT_RETRY


def with_retries(fn: Callable[[], _T], policy: RetryPolicy, on_error: Callable[[BaseException, int], HubError]) -> _T:
    """Call ``fn``; retry 429/5xx and network errors per ``policy``; map failures with ``on_error``."""
    attempts = max(1, policy.attempts)
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except HTTP_ERRORS as exc:
            transient = isinstance(exc, TransportError) or http_status(exc) in RETRY_STATUSES
            if not transient or attempt == attempts:
                raise on_error(exc, attempt) from exc
            time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")  # pragma: no cover
