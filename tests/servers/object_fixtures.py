"""Pytest plugin: object-store servers (``s3_server``) and per-test buckets pointed at by the environment.

``s3_server`` (session) is one moto S3 server; ``s3`` (per test) creates a fresh bucket, sets the AWS
variables a user would (``AWS_ENDPOINT_URL``, keys, region) and makes the client's retries fast, and yields an
:class:`S3Bucket` to upload into. ``s3_proxy`` puts a :class:`~servers.object_servers.FaultProxy` between the
client and the server.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from servers.object_servers import FaultProxy, S3Server

_names = itertools.count()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(log=tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


@dataclass
class S3Bucket:
    server: S3Server
    name: str

    def url(self, key: str = "") -> str:
        return f"s3://{self.name}/{key}"

    def upload_dir(self, root: Path, prefix: str) -> list[str]:
        return self.server.upload_dir(self.name, root, prefix)

    def put(self, key: str, data: bytes) -> None:
        self.server.client().put_object(Bucket=self.name, Key=key, Body=data)

    def put_many(self, objects: dict[str, bytes], concurrency: int = 64) -> None:
        """Upload many objects at once (obstore's async puts: boto3 spends milliseconds of CPU per call)."""
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


def _fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    from zephon.storage.objects import stores

    monkeypatch.setattr(
        stores, "DEFAULT_RETRY", stores.ObjectRetry(attempts=6, base_delay=0.01, max_delay=0.05, timeout=10.0)
    )


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Bucket:
    name = f"zephon-test-{next(_names)}"
    s3_server.client().create_bucket(Bucket=name)
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)
    _fast_retries(monkeypatch)
    return S3Bucket(server=s3_server, name=name)


@pytest.fixture
def s3_proxy(s3: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3.server.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        yield proxy
    finally:
        proxy.stop()
