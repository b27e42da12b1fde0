"""One-line errors of failed object-store requests, naming the object (or bucket) and the fix.

The client's own messages hold request URLs (a SAS token travels in the query string) and response bodies,
so they are never shown: a message keeps only the HTTP status and the store's error code
(``NoSuchBucket``, ``SignatureDoesNotMatch``, ``SlowDown``, ...), read from the client's message.

Worked example: a GET of ``s3://corpus/web/0.parquet`` answered 403 ``InvalidAccessKeyId`` becomes
``access to s3://corpus/web/0.parquet must be granted to your credentials, got HTTP 403 InvalidAccessKeyId —
check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (or AWS_PROFILE), or the StoreCredentials
for this bucket``.
"""

from __future__ import annotations

import re

from zephon.errors import DatasetError, StorageError, ZephonError

__all__ = ["CREDENTIAL_HINT", "is_body_failure", "object_error"]

CREDENTIAL_HINT = {
    "s3": "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (or AWS_PROFILE), or the "
    "StoreCredentials for this bucket",
    "gs": "check GOOGLE_APPLICATION_CREDENTIALS (or STORAGE_EMULATOR_HOST), or the StoreCredentials for this bucket",
    "az": "check AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or "
    "AZURE_STORAGE_SAS_TOKEN), or the StoreCredentials for this container",
}
_ENDPOINT_HINT = {"s3": "AWS_ENDPOINT_URL", "gs": "STORAGE_EMULATOR_HOST", "az": "AZURE_STORAGE_CONNECTION_STRING"}
_STATUS = re.compile(r"(?:status code: |status: |HTTP status )(\d{3})")
_STATUS_WORD = re.compile(r"\b([45]\d\d) (?:[A-Z][a-z]+)")
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>|\"reason\"\s*:\s*\"([A-Za-z]+)\"")
_BUCKET_MISSING = ("NoSuchBucket", "ContainerNotFound", "notFound")
_AFTER_RETRIES = re.compile(r"(?:after (\d+) retries|\bretries: (\d+),)")


def _describe(exc: BaseException) -> tuple[int | None, str | None, str]:
    text = str(exc)
    status = _STATUS.search(text) or _STATUS_WORD.search(text)
    code = _CODE.search(text)
    got = f"HTTP {status.group(1)}" if status else None
    word = (code.group(1) or code.group(2)) if code else None
    if got is None:
        lowered = text.lower()
        if "connectionrefused" in lowered or "connection refused" in lowered:
            got = "a refused connection"
        elif "timedout" in lowered or "timed out" in lowered or "kind: timeout" in lowered:
            got = "a timeout"
        elif is_body_failure(exc):
            got = "a connection dropped mid-body"
        elif "connect" in lowered or "connection" in lowered or "reset" in lowered or "closed" in lowered:
            got = "a connection failure"
        else:
            got = type(exc).__name__
    retries = _AFTER_RETRIES.search(text)
    tries = int(retries.group(1) or retries.group(2)) + 1 if retries else 1
    shown = got + (f" {word}" if word else "") + (f" after {tries} attempts" if tries > 1 else "")
    return (int(status.group(1)) if status else None), word, shown


def is_body_failure(exc: BaseException) -> bool:
    """A response body that broke after its headers (a reset or closed connection, a short body): the client
    retries requests, not bodies, so the caller reads again."""
    lowered = str(exc).lower()
    return isinstance(exc, ConnectionError) or any(
        mark in lowered for mark in ("body error", "incompletebody", "unexpectedeof", "short body")
    )


def object_error(exc: BaseException, uri: str, cloud: str, what: str, *, version: str | None = None) -> ZephonError:
    """The one-line error of a failed request ``what`` (e.g. ``"the footer"``) on ``uri``; ``version``: the
    pinned version id the request asked for (a 404 then means that version is gone)."""
    from obstore import exceptions as ox

    if isinstance(exc, ZephonError):
        return exc
    status, code, shown = _describe(exc)
    bucket = uri.split("/", 3)[:3]
    bucket_uri = "/".join(bucket)
    text = str(exc)
    if "169.254.169.254" in text or "169.254.170.2" in text or "metadata.google.internal" in text:
        return StorageError(
            f"access to {uri} must use credentials, got none in the environment and none from the instance "
            f"metadata service ({shown}) reading {what} — {CREDENTIAL_HINT[cloud]}"
        )
    if isinstance(exc, ox.PreconditionError) or status == 412:
        return DatasetError(
            f"object {uri} changed since planning: its ETag must match the plan's pin, got another version (HTTP "
            "412) — restore the planned object or re-plan"
        )
    if code in _BUCKET_MISSING:
        return DatasetError(
            f"bucket {bucket_uri} must exist, got {shown} reading {what} of {uri} — check the bucket name and the "
            f"endpoint ({_ENDPOINT_HINT[cloud]})"
        )
    missing = isinstance(exc, ox.NotFoundError | FileNotFoundError) or status == 404
    if missing and version is not None:
        return DatasetError(
            f"object {uri} changed since planning: its planned version {version} must exist, got {shown} reading "
            f"{what} — it was overwritten or deleted (a bucket without versioning keeps only the latest): restore "
            "the planned object or re-plan"
        )
    if missing:
        return DatasetError(
            f"object {uri} must exist, got {shown} reading {what} — it was deleted or renamed since planning: "
            "restore it or re-plan"
        )
    if isinstance(exc, ox.UnauthenticatedError | ox.PermissionDeniedError | PermissionError) or status in (401, 403):
        return StorageError(
            f"access to {uri} must be granted to your credentials, got {shown} reading {what} — "
            f"{CREDENTIAL_HINT[cloud]}"
        )
    if status is not None and (status >= 500 or status == 429):
        return StorageError(
            f"store at {bucket_uri} must answer {what} of {uri}, got {shown} — the store is unavailable or "
            "throttling; retry later"
        )
    if status is None:
        return StorageError(
            f"store at {bucket_uri} must answer {what} of {uri}, got {shown} — check the network and the endpoint "
            f"({_ENDPOINT_HINT[cloud]}), then retry"
        )
    return StorageError(f"request for {what} of {uri} must succeed, got {shown} — {CREDENTIAL_HINT[cloud]}")
