"""Pytest plugin: object-store servers and per-test buckets pointed at by the environment.

Servers (session scope, on 127.0.0.1): ``s3_server`` (moto), ``gs_server`` (fake-gcs-server), ``az_server``
(Azurite). The GCS and Azure ones skip their tests, with the reason, only when the server cannot be installed
on this machine (``servers.object_servers.missing_server``).

Buckets (per test): ``s3`` creates a fresh S3 bucket, sets the AWS variables a user would (``AWS_ENDPOINT_URL``,
keys, region) and makes the client's retries fast; ``bucket`` does the same for each cloud in turn
(parametrized: ``s3``, ``gs``, ``az``). ``s3_proxy`` puts a :class:`~servers.object_servers.FaultProxy` between
the client and the S3 server.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from servers.object_servers import AzuriteServer, FakeGcsServer, FaultProxy, S3Server, missing_server

_names = itertools.count()
_CLEARED = {
    "s3": ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS",),
    "az": ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN"),
}


def _serve(kind: str, server_class: type, log_dir: Path) -> Iterator:
    """Start ``server_class`` for the session, skipping (with the reason) where ``kind``'s server cannot be
    installed; stop it at the end."""
    why = missing_server(kind) if kind != "s3" else None
    if why is not None:
        pytest.skip(why)
    server = server_class(log=log_dir / f"{kind}.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from _serve("s3", S3Server, tmp_path_factory.mktemp("moto"))


@pytest.fixture(scope="session")
def gs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcsServer]:
    yield from _serve("gs", FakeGcsServer, tmp_path_factory.mktemp("fake-gcs"))


@pytest.fixture(scope="session")
def az_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    yield from _serve("az", AzuriteServer, tmp_path_factory.mktemp("azurite"))


@dataclass
class Bucket:
    """A fresh bucket (or container) on one of the servers."""

    server: S3Server | FakeGcsServer | AzuriteServer
    cloud: str
    name: str

    def url(self, key: str = "") -> str:
        return f"{self.cloud}://{self.name}/{key}"

    def put(self, key: str, data: bytes) -> None:
        self.server.put(self.name, key, data)

    def upload_dir(self, root: Path, prefix: str) -> list[str]:
        keys = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            key = prefix + path.relative_to(root).as_posix()
            self.put(key, path.read_bytes())
            keys.append(key)
        return keys

    def put_many(self, objects: dict[str, bytes], concurrency: int = 64) -> None:
        """Upload many S3 objects at once (obstore's async puts: boto3 spends milliseconds of CPU per call)."""
        import asyncio

        import obstore
        from obstore.store import S3Store

        env = self.server.env()
        store = S3Store(
            self.name,
            config={
                "endpoint": env["AWS_ENDPOINT_URL"],
                "region": "us-east-1",
                "access_key_id": env["AWS_ACCESS_KEY_ID"],
                "secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
            },
            client_options={"allow_http": True},
        )

        async def upload() -> None:
            gate = asyncio.Semaphore(concurrency)

            async def one(key: str, data: bytes) -> None:
                async with gate:
                    await obstore.put_async(store, key, data)

            await asyncio.gather(*(one(k, v) for k, v in objects.items()))

        asyncio.run(upload())


S3Bucket = Bucket  # the name the S3-only tests use


def _fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    from zephon.storage.objects import stores

    monkeypatch.setattr(
        stores, "DEFAULT_RETRY", stores.ObjectRetry(attempts=6, base_delay=0.01, max_delay=0.05, timeout=10.0)
    )


def _fresh(cloud: str, server, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    name = f"zephon-test-{next(_names)}"
    server.create_bucket(name)
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    for key in _CLEARED[cloud]:
        monkeypatch.delenv(key, raising=False)
    _fast_retries(monkeypatch)
    return Bucket(server=server, cloud=cloud, name=name)


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    return _fresh("s3", s3_server, monkeypatch)


@pytest.fixture(params=["s3", "gs", "az"])
def bucket(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    cloud = request.param
    return _fresh(cloud, request.getfixturevalue(f"{cloud}_server"), monkeypatch)


@pytest.fixture
def s3_proxy(s3: Bucket, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3.server.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        yield proxy
    finally:
        proxy.stop()
