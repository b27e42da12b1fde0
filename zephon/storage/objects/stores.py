"""The client of each object store, configured by the cloud's own environment variables.

One ``obstore`` store per (cloud, bucket, settings), built on first use and reused (its connection pool too).
The settings are the cloud's variables (``zephon.specs.CREDENTIAL_VARIABLES``), read from the environment at
call time, unless a :class:`~zephon.specs.StoreCredentials` covers the path: then its ``env`` replaces that
cloud's variables entirely (the longest matching prefix wins), so a second account never inherits the first's
session token.

* S3: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, or ``AWS_PROFILE`` (through
  boto3's session, when boto3 is installed; with boto3, ``~/.aws/credentials``' default profile also without
  ``AWS_PROFILE``); ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``); ``AWS_ENDPOINT_URL`` (or
  ``AWS_ENDPOINT_URL_S3``) for MinIO, R2, on-premises S3 — path-style requests, ``http://`` allowed. Without
  keys or a profile, the store asks the instance or container metadata service, as the AWS SDKs do.
* GCS: ``GOOGLE_APPLICATION_CREDENTIALS`` (a service-account or authorized-user JSON file);
  ``STORAGE_EMULATOR_HOST`` (``http://host:port`` of an emulator, no authentication).
* Azure: ``AZURE_STORAGE_CONNECTION_STRING`` (Azurite's ``UseDevelopmentStorage=true`` too), or
  ``AZURE_STORAGE_ACCOUNT_NAME`` with ``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``.

Requests are retried by the client with exponential backoff and jitter on 5xx (S3's 503 SlowDown), 429,
dropped connections and timeouts (:data:`DEFAULT_RETRY`, read at call time; tests patch a faster one). The
store's repr names the bucket only; Zephon never prints the settings.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from zephon.errors import ConfigError
from zephon.specs import CREDENTIAL_VARIABLES, StoreCredentials
from zephon.storage.objects.paths import ObjectPath

__all__ = ["DEFAULT_RETRY", "ObjectRetry", "register_credentials", "store_for"]

_CLOUD_VARIABLES = {
    "s3": tuple(v for v in CREDENTIAL_VARIABLES if v.startswith("AWS_")),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST"),
    "az": tuple(v for v in CREDENTIAL_VARIABLES if v.startswith("AZURE_")),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectRetry:
    """``attempts`` tries per request; backoff from ``base_delay`` doubling to ``max_delay`` seconds; a request
    (connect and transfer) gives up after ``timeout`` seconds, a connection attempt after ``connect_timeout``."""

    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 8.0
    timeout: float = 60.0
    connect_timeout: float = 10.0


DEFAULT_RETRY = ObjectRetry()  # read at call time, so tests may monkeypatch a faster one

_lock = threading.Lock()
_stores: dict[tuple[Any, ...], Any] = {}
_registered: dict[str, StoreCredentials] = {}


#: Whether an ancestor of this process, forked after it had built a store, ran obstore's I/O runtime: its
#: threads are not copied by ``fork()``, and a read in the child would wait for them forever.
_forked_after_use = False


def _forget_stores() -> None:
    """In a forked child (a DataLoader worker): remember whether the parent had built stores — their client,
    and obstore's process-wide I/O runtime, belong to threads the child does not have (obstore is not fork
    safe) — so that a read refuses in one line instead of hanging (``store_for``)."""
    global _lock, _forked_after_use
    _lock = threading.Lock()
    _forked_after_use = _forked_after_use or bool(_stores)
    _stores.clear()


os.register_at_fork(after_in_child=_forget_stores)


def register_credentials(credentials: Iterable[StoreCredentials]) -> None:
    """Make ``credentials`` apply to every later read of this process (``Dataset.from_path(..., io_options=)``
    and the executor's ``StoreOptions`` call it); a later registration of the same prefix replaces it."""
    with _lock:
        for c in credentials:
            _registered[c.prefix.rstrip("/")] = c


def settings_for(path: ObjectPath, credentials: Iterable[StoreCredentials] = ()) -> dict[str, str]:
    """The variables that configure ``path``'s store: those of the longest prefix covering it among
    ``credentials`` (a run's ``StoreOptions``), else among the registered ones, else the environment's."""
    from zephon.storage.objects.paths import SCHEMES

    with _lock:
        registered = list(_registered.values())
    best: StoreCredentials | None = None
    for group in (list(credentials), registered):
        for cred in group:
            scheme, _, rest = cred.prefix.rstrip("/").partition("://")
            here = f"{path.bucket}/{path.key}"
            covers = SCHEMES.get(scheme) == path.cloud and (here == rest or here.startswith(rest + "/"))
            if covers and (best is None or len(cred.prefix.rstrip("/")) > len(best.prefix.rstrip("/"))):
                best = cred
        if best is not None:
            break
    names = _CLOUD_VARIABLES[path.cloud]
    source: Mapping[str, str] = best.env if best is not None else os.environ
    return {k: source[k] for k in names if source.get(k)}


def store_for(path: ObjectPath, credentials: Iterable[StoreCredentials] = ()) -> Any:
    """The ``obstore`` store of ``path``'s bucket, built once per settings. In a process forked after its
    parent read object storage, refused in one line: obstore's reads would hang there (``_forget_stores``)."""
    if _forked_after_use:
        raise ConfigError(
            f"object {path.cloud}://{path.bucket}/{path.key} must be read by a process started by spawn or "
            "forkserver, or forked before its parent read object storage, got a process forked after that: "
            "obstore's I/O threads do not survive fork(), so the read would hang — start DataLoader workers with "
            "multiprocessing_context='spawn' (or 'forkserver')"
        )
    settings = settings_for(path, credentials)
    retry = DEFAULT_RETRY
    key = (path.cloud, path.bucket, path.account, tuple(sorted(settings.items())), retry)
    with _lock:
        store = _stores.get(key)
    if store is None:
        store = _build(path, settings, retry)
        with _lock:
            _stores[key] = store
    return store


def _client_options(endpoint: str | None, retry: ObjectRetry) -> dict[str, Any]:
    options: dict[str, Any] = {
        "timeout": timedelta(seconds=retry.timeout),
        "connect_timeout": timedelta(seconds=retry.connect_timeout),
    }
    if endpoint is not None and endpoint.startswith("http://"):
        options["allow_http"] = True
    return options


def _retry_config(retry: ObjectRetry) -> dict[str, Any]:
    return {
        "max_retries": max(0, retry.attempts - 1),
        "backoff": {
            "init_backoff": timedelta(seconds=retry.base_delay),
            "max_backoff": timedelta(seconds=retry.max_delay),
            "base": 2,
        },
        "retry_timeout": timedelta(seconds=max(retry.timeout, 1.0) * max(1, retry.attempts)),
    }


def _build(path: ObjectPath, env: Mapping[str, str], retry: ObjectRetry) -> Any:
    from obstore.store import AzureStore, GCSStore, S3Store

    if path.cloud == "s3":
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        config: dict[str, Any] = {"region": region}
        if endpoint:
            config["endpoint"] = endpoint.rstrip("/")
        provider = None
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
            credential = {
                "access_key_id": env["AWS_ACCESS_KEY_ID"],
                "secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
                "token": env.get("AWS_SESSION_TOKEN"),
                "expires_at": None,
            }
            provider = _StaticCredentials(credential)
        elif env.get("AWS_PROFILE"):
            provider = _profile_provider(env["AWS_PROFILE"])
        elif _shared_aws_files() and _has_boto3():  # ~/.aws/credentials without AWS_PROFILE: its default profile
            provider = _profile_provider(None)
        return S3Store(
            path.bucket,
            config=config,
            client_options=_client_options(endpoint, retry),
            retry_config=_retry_config(retry),
            credential_provider=provider,
        )
    if path.cloud == "gs":
        config = {}
        emulator = env.get("STORAGE_EMULATOR_HOST")
        if emulator:
            base = emulator if "://" in emulator else f"http://{emulator}"
            key = {"gcs_base_url": base.rstrip("/"), "disable_oauth": True, "client_email": "", "private_key": ""}
            config["service_account_key"] = json.dumps({**key, "private_key_id": ""})
        elif env.get("GOOGLE_APPLICATION_CREDENTIALS"):
            config["application_credentials"] = env["GOOGLE_APPLICATION_CREDENTIALS"]
        return GCSStore(
            path.bucket,
            config=config,
            client_options=_client_options(emulator and base, retry),
            retry_config=_retry_config(retry),
        )
    config = {}
    endpoint = None
    conn = env.get("AZURE_STORAGE_CONNECTION_STRING")
    if conn:
        parts = dict(p.split("=", 1) for p in conn.split(";") if "=" in p)
        if parts.get("UseDevelopmentStorage", "").lower() == "true":
            config["use_emulator"] = True
            endpoint = "http://127.0.0.1:10000"
        else:
            config["account_name"] = parts.get("AccountName", "")
            if parts.get("AccountKey"):
                config["account_key"] = parts["AccountKey"]
            if parts.get("SharedAccessSignature"):
                config["sas_key"] = parts["SharedAccessSignature"]
            if parts.get("BlobEndpoint"):
                endpoint = parts["BlobEndpoint"].rstrip("/")
                config["endpoint"] = endpoint
    else:
        if path.account or env.get("AZURE_STORAGE_ACCOUNT_NAME"):
            config["account_name"] = path.account or env["AZURE_STORAGE_ACCOUNT_NAME"]
        if env.get("AZURE_STORAGE_ACCOUNT_KEY"):
            config["account_key"] = env["AZURE_STORAGE_ACCOUNT_KEY"]
        if env.get("AZURE_STORAGE_SAS_TOKEN"):
            config["sas_key"] = env["AZURE_STORAGE_SAS_TOKEN"].lstrip("?")
    return AzureStore(
        path.bucket,
        config=config,
        client_options=_client_options(endpoint, retry),
        retry_config=_retry_config(retry),
    )


class _StaticCredentials:
    """Credentials given by the environment or an override; the repr never shows them."""

    __slots__ = ("_credential",)

    def __init__(self, credential: dict[str, Any]) -> None:
        self._credential = credential

    def __call__(self) -> dict[str, Any]:
        return self._credential

    def __repr__(self) -> str:
        return "_StaticCredentials(<hidden>)"


def _shared_aws_files() -> bool:
    home = os.path.expanduser("~")
    files = (
        os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"),
        os.environ.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"),
    )
    return any(os.path.isfile(f) for f in files)


def _has_boto3() -> bool:
    import importlib.util

    return importlib.util.find_spec("boto3") is not None


def _profile_provider(profile: str | None) -> Any:
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as exc:
        raise ConfigError(
            f"AWS_PROFILE={profile!r} must be read with boto3 installed, got no `boto3` module — pip install boto3, or "
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead"
        ) from exc
    return Boto3CredentialProvider(boto3.Session(profile_name=profile))
