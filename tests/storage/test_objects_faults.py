"""Object-store faults against a real S3 server behind a fault-injecting proxy: throttling (503 SlowDown),
server errors, 429, connections dropped mid-body — survived with identical batches — and, after the last
retry, one line naming the object; wrong credentials and an endpoint that does not answer, one line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import write_jsonl_dataset, write_parquet_dataset
from servers.object_servers import S3Server
from test_objects_s3 import cache_io, run, source

from zephon.errors import StorageError
from zephon.io import Dataset
from zephon.specs import StoreCredentials, StoreOptions


@pytest.fixture
def planned(s3, tmp_path, tokenizer_dir) -> tuple[Path, str]:
    """A plan over two s3 datasets (made without faults) and the hash of its batches from local copies."""
    web = write_parquet_dataset(tmp_path / "local", "web", [30, 25, 40], row_group_size=5)
    code = write_jsonl_dataset(tmp_path / "local", "code", [30, 33], compression="gz")
    s3.upload_dir(web, "web/")
    s3.upload_dir(code, "code/")
    local = source(Dataset.from_path("web", str(web)), Dataset.from_path("code", str(code)))
    expected = run(local.plan(tmp_path / "local-plan"), tokenizer_dir)
    return source(Dataset.from_path("web", s3.url("web/")), Dataset.from_path("code", s3.url("code/"))).plan(
        tmp_path / "plan"
    ), expected


@pytest.mark.parametrize("mode", ["cache", "range"])
def test_throttling_and_server_errors_are_retried(planned, s3_proxy, tmp_path, tokenizer_dir, mode) -> None:
    plan, expected = planned
    s3_proxy.fail(2, 503)  # S3's SlowDown: 5 failures in a row, then the 6th attempt succeeds
    s3_proxy.fail(1, 500)
    s3_proxy.fail(2, 429)
    io = cache_io(tmp_path) if mode == "cache" else StoreOptions(remote_read="range")
    assert run(plan, tokenizer_dir, io) == expected
    statuses = [r.status for r in s3_proxy.seen]
    assert statuses.count(503) == 2 and statuses.count(500) == 1 and statuses.count(429) == 2


@pytest.mark.parametrize("mode", ["cache", "range"])
def test_connections_dropped_mid_body_are_read_again(planned, s3_proxy, tmp_path, tokenizer_dir, mode) -> None:
    plan, expected = planned
    s3_proxy.drop(3)
    io = cache_io(tmp_path) if mode == "cache" else StoreOptions(remote_read="range")
    assert run(plan, tokenizer_dir, io) == expected


def test_planning_survives_faults(s3, s3_proxy, tmp_path) -> None:
    web = write_parquet_dataset(tmp_path / "local", "web", [10, 12, 14])
    s3.upload_dir(web, "web/")
    s3_proxy.fail(2, 503, method=None)  # the listing too
    s3_proxy.drop(2)
    plan = source(Dataset.from_path("web", s3.url("web/"))).plan(tmp_path / "plan")
    local = source(Dataset.from_path("web", str(web))).plan(tmp_path / "local-plan")
    assert (plan / "samples.parquet").read_bytes() == (local / "samples.parquet").read_bytes()


def test_a_store_that_keeps_failing_is_one_line_naming_the_object(planned, s3_proxy, tmp_path, tokenizer_dir) -> None:
    plan, _ = planned
    s3_proxy.fail(1000, 503)
    with pytest.raises(StorageError) as info:
        run(plan, tokenizer_dir, StoreOptions(remote_read="range"))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("store at s3://")
    assert "/web/part-0000" in message or "/code/part-0000" in message
    assert "got HTTP 503 SlowDown" in message and "retry later" in message


@pytest.fixture(scope="module")
def strict_s3(tmp_path_factory) -> Iterator[S3Server]:
    server = S3Server(log=tmp_path_factory.mktemp("moto-auth") / "moto.log", authenticated=True)
    try:
        yield server
    finally:
        server.stop()


def test_wrong_or_expired_credentials_are_one_line(strict_s3, tmp_path, tokenizer_dir, monkeypatch) -> None:
    """A server that checks signatures: the right keys plan, a wrong secret is refused at listing, and keys
    that stop working mid-run (here: replaced by a StoreCredentials override) are refused naming the object."""
    web = write_parquet_dataset(tmp_path / "local", "web", [20])
    client = strict_s3.client()
    client.create_bucket(Bucket="strict")
    client.put_object(Bucket="strict", Key="web/part-00000.parquet", Body=(web / "part-00000.parquet").read_bytes())
    for key, value in strict_s3.env().items():
        monkeypatch.setenv(key, value)
    from zephon.storage.objects import stores

    monkeypatch.setattr(stores, "DEFAULT_RETRY", stores.ObjectRetry(attempts=2, base_delay=0.01, timeout=10.0))
    url = "s3://strict/web/part-00000.parquet"
    plan = source(Dataset.from_path("web", url)).plan(tmp_path / "plan")  # the right keys
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StorageError) as info:
        Dataset.from_path("web", url)
    message = str(info.value)
    assert "\n" not in message and "not-the-secret" not in message
    assert message.startswith(f"access to {url} must be granted to your credentials, got HTTP 403")
    assert "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" in message
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", strict_s3.SECRET_KEY)
    expired = StoreCredentials(
        prefix="s3://strict/web", env={**strict_s3.env(), "AWS_SECRET_ACCESS_KEY": "expired-secret"}
    )
    with pytest.raises(StorageError, match=rf"^access to {url} must be granted to your credentials, got HTTP 403"):
        run(plan, tokenizer_dir, StoreOptions(remote_read="range", credentials=(expired,)))
    # The override covers only its prefix: the environment's keys still read the object.
    elsewhere = StoreCredentials(prefix="s3://strict/other", env={"AWS_SECRET_ACCESS_KEY": "x"})
    run(plan, tokenizer_dir, StoreOptions(remote_read="range", credentials=(elsewhere,)))


def test_no_credentials_at_all_is_one_line(monkeypatch) -> None:
    """No keys, no profile: the client asks the instance metadata service, which is not there."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    from zephon.storage.objects import stores

    monkeypatch.setattr(stores, "DEFAULT_RETRY", stores.ObjectRetry(attempts=1, timeout=3.0, connect_timeout=1.0))
    with pytest.raises(StorageError) as info:
        Dataset.from_path("web", "s3://some-bucket/web/")
    message = str(info.value)
    assert "\n" not in message
    assert "access to s3://some-bucket/web/ must use credentials, got none in the environment" in message
    assert "AWS_ACCESS_KEY_ID" in message


def test_an_endpoint_that_does_not_answer_is_one_line(monkeypatch) -> None:
    from servers.object_servers import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    with pytest.raises(StorageError) as info:
        Dataset.from_path("web", "s3://some-bucket/web/")
    message = str(info.value)
    assert "\n" not in message
    assert "store at s3://some-bucket must answer the listing of s3://some-bucket/web/, got a refused connection" in (
        message
    )
    assert "AWS_ENDPOINT_URL" in message


def test_a_download_that_keeps_breaking_leaves_nothing_in_the_cache(planned, s3_proxy, tmp_path, tokenizer_dir) -> None:
    from zephon.storage.shard_cache import ShardCache

    plan, _ = planned
    s3_proxy.drop(1000)  # every GET is cut halfway (the client resumes a broken body with a Range GET: cut too)
    with pytest.raises(StorageError) as info:
        run(plan, tokenizer_dir, cache_io(tmp_path))
    message = str(info.value)
    assert "\n" not in message and "got a connection dropped mid-body" in message
    assert message.startswith("store at s3://") and (".parquet" in message or ".jsonl.gz" in message)
    cache = ShardCache(tmp_path / "cache", 1 << 30)
    assert cache.entries() == [] and cache.total_bytes() == 0
    assert [p for p in (tmp_path / "cache" / "tmp").iterdir()] == []


def test_a_named_profile_of_a_shared_credentials_file_is_used(strict_s3, tmp_path, monkeypatch) -> None:
    """On the signature-checking server: the profile's keys are what signs the requests."""
    pytest.importorskip("boto3")
    from zephon.storage.objects import stores

    web = write_parquet_dataset(tmp_path / "local", "web", [5])
    client = strict_s3.client()
    client.create_bucket(Bucket="profiled")
    client.put_object(Bucket="profiled", Key="web/part-00000.parquet", Body=(web / "part-00000.parquet").read_bytes())
    monkeypatch.setattr(stores, "DEFAULT_RETRY", stores.ObjectRetry(attempts=2, base_delay=0.01, timeout=10.0))
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", strict_s3.endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    (tmp_path / "credentials").write_text(
        f"[team]\naws_access_key_id = {strict_s3.ACCESS_KEY}\naws_secret_access_key = {strict_s3.SECRET_KEY}\n"
        f"[stale]\naws_access_key_id = {strict_s3.ACCESS_KEY}\naws_secret_access_key = not-the-secret\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    url = "s3://profiled/web/part-00000.parquet"
    monkeypatch.setenv("AWS_PROFILE", "team")
    assert [f.uri for f in Dataset.from_path("web", url).files] == [url]
    monkeypatch.setenv("AWS_PROFILE", "stale")
    with pytest.raises(StorageError, match=rf"^access to {url} must be granted to your credentials, got HTTP 403"):
        Dataset.from_path("web", url)


def test_requests_that_hang_time_out_and_are_tried_again(
    planned, s3_proxy, tmp_path, tokenizer_dir, monkeypatch
) -> None:
    from zephon.storage.objects import stores

    plan, expected = planned
    monkeypatch.setattr(
        stores, "DEFAULT_RETRY", stores.ObjectRetry(attempts=4, base_delay=0.01, max_delay=0.05, timeout=1.0)
    )
    s3_proxy.stall(2, 30.0)  # two GETs held far past the 1 s timeout
    start = time.monotonic()
    assert run(plan, tokenizer_dir, StoreOptions(remote_read="range")) == expected
    assert time.monotonic() - start < 25  # the held GETs were given up and tried again, not waited for
