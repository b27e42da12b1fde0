"""The Hub client: resolve ``hf://`` dataset paths to pinned file lists, and read the remote files.

This module is the entry point; it re-exports the client's API from the modules that implement it:

* :mod:`zephon.storage.hub.resolve` — :func:`resolve_hf_dataset` pins a path to a commit and lists every file
  of its split (:class:`ResolvedHfDataset` of :class:`RemoteFile`), from uploaded files or the Hub's Parquet
  conversion; refuses listings with unsafe paths (:func:`is_safe_repo_path`).
* :mod:`zephon.storage.hub.fetch` — :func:`read_remote_parquet_metadata` (a footer by two range requests) and
  :func:`download_remote_file` (a whole file, size and hash checked, renamed into place).
* :mod:`zephon.storage.hub.retry` — :class:`RetryPolicy`: 429/5xx and network errors are retried with
  exponential backoff. The default, :data:`DEFAULT_RETRY`, is read at call time from that module: patch
  ``zephon.storage.hub.retry.DEFAULT_RETRY`` to change it (assigning this module's name has no effect).
* :mod:`zephon.storage.hub.errors` — the one-line :class:`~zephon.errors.HubError` of a failed request
  (401/403 say to run ``hf auth login``, set ``HF_TOKEN`` or request access; ``HF_HUB_OFFLINE`` refuses every
  call). Tokens never appear in a message, repr or log.

All calls use the real ``huggingface_hub`` client, with the endpoint read from ``HF_ENDPOINT``
(:func:`hub_endpoint`) and the token from the argument, ``HF_TOKEN`` or ``hf auth login`` — both at call time.
"""

from __future__ import annotations

from zephon.storage.hub.errors import RETRY_STATUSES as RETRY_STATUSES
from zephon.storage.hub.fetch import download_remote_file, read_remote_parquet_metadata, read_remote_range
from zephon.storage.hub.resolve import CONVERSION_REVISION as CONVERSION_REVISION
from zephon.storage.hub.resolve import (
    RemoteFile,
    ResolvedHfDataset,
    hub_endpoint,
    resolve_hf_dataset,
)
from zephon.storage.hub.resolve import check_repo_path as check_repo_path
from zephon.storage.hub.resolve import is_safe_repo_path as is_safe_repo_path
from zephon.storage.hub.retry import DEFAULT_RETRY, RetryPolicy

__all__ = [
    "DEFAULT_RETRY",
    "RemoteFile",
    "ResolvedHfDataset",
    "RetryPolicy",
    "download_remote_file",
    "hub_endpoint",
    "read_remote_parquet_metadata",
    "read_remote_range",
    "resolve_hf_dataset",
]
