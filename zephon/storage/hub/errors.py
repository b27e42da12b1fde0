"""The one-line :class:`~zephon.errors.HubError` of a failed Hub request, shared by resolving and reading.

Every failure names the dataset, what was asked and the fix: 401/403 say to run ``hf auth login``, set
``HF_TOKEN`` or request access on the dataset page; 404 tells a missing file (resolve again) from a missing
dataset (check the spelling, or log in for a private one); 429/5xx and network errors — the transient ones,
retried per :class:`~zephon.storage.hub.retry.RetryPolicy` — are reported with the number of attempts.
``HF_HUB_OFFLINE`` set in the environment refuses every call before it is made (:func:`check_online`).

Tokens never appear in a message, repr or log: the wording only says whether a token was sent.
"""

from __future__ import annotations

import os

from huggingface_hub.errors import (
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
)

from zephon.errors import HubError

try:  # huggingface_hub >= 2 ships on httpx2; 1.x on httpx.
    import httpx2 as _httpx
except ImportError:  # pragma: no cover
    import httpx as _httpx  # type: ignore[no-redef]

__all__ = [
    "HTTP_ERRORS",
    "RETRY_STATUSES",
    "TransportError",
    "check_online",
    "http_error",
    "http_status",
    "hub_offline",
]

RETRY_STATUSES: tuple[int, ...] = (429, 500, 502, 503, 504)
TransportError = _httpx.TransportError  # a network failure (connect, read, a broken body): transient
HTTP_ERRORS = (HfHubHTTPError, TransportError, OfflineModeIsEnabled)  # what a Hub request raises when it fails


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set (to 1, ON, YES or TRUE), read now."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def check_online(repo_id: str, what: str) -> None:
    """Refuse ``what`` (e.g. ``"resolve hf://..."``) when ``HF_HUB_OFFLINE`` is set, read now."""
    if hub_offline():
        raise HubError(f"Hub access for dataset {repo_id} must be allowed to {what}, got HF_HUB_OFFLINE set — unset it")


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a failed request, or None (a network error, offline mode)."""
    return getattr(getattr(exc, "response", None), "status_code", None)


def http_error(
    exc: BaseException, repo_id: str, endpoint: str, what: str, *, token_sent: bool, attempts: int
) -> HubError:
    """A one-line HubError for a failed Hub request. Never includes the token."""
    page, status = f"{endpoint}/datasets/{repo_id}", http_status(exc)
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError(
            f"Hub access for dataset {repo_id} must be allowed, got HF_HUB_OFFLINE set — unset it to read {what}"
        )
    if status == 401:
        return HubError(
            f"access to dataset {repo_id} must be authorized, got HTTP 401 with "
            f"{'a token the Hub rejected' if token_sent else 'no token'} — run `hf auth login` or set HF_TOKEN, "
            f"and request access on {page} if the dataset is gated"
        )
    if status == 403:
        return HubError(
            f"access to dataset {repo_id} must be granted to your token, got HTTP 403 — request access on {page}, "
            f"or run `hf auth login` / set HF_TOKEN with a token that has access"
        )
    if isinstance(exc, RemoteEntryNotFoundError):
        return HubError(f"{what} of dataset {repo_id} must exist, got HTTP 404 — the file is gone; resolve again")
    if isinstance(exc, RepositoryNotFoundError) or status == 404:
        return HubError(
            f"dataset {repo_id} must exist on {endpoint}, got HTTP {status} for {what} — check the org/name "
            f"spelling; for a private dataset run `hf auth login` or set HF_TOKEN"
        )
    if status in RETRY_STATUSES or isinstance(exc, TransportError):
        got = f"HTTP {status}" if status is not None else type(exc).__name__
        return HubError(
            f"Hub at {endpoint} must answer {what} of dataset {repo_id}, got {got} after {attempts} attempt(s) "
            f"— the Hub is unavailable or rate-limiting; retry later"
        )
    return HubError(f"Hub request for {what} of dataset {repo_id} must succeed, got HTTP {status} — check {page}")
