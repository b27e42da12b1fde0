"""Secrets: a Hugging Face token, and S3 keys, never appear in plan bundles, caches, logs, output, error messages
or reprs.

One run exercises everything that handles the token against the Hub test server — resolution refused with 401
(no token) and 403 (a wrong token), a gated dataset resolved, planned (library and ``zephon plan``) and
executed with the right token (remote shards downloaded into the shard cache, the ``gpt2`` tokenizer loaded
from the Hub), and a download refused mid-run — while every logger records at DEBUG. Then it searches every
captured string and every file written for the token.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from zephon import Pipeline
from zephon.cli import cli
from zephon.demo import demo_tokenizer_path
from zephon.errors import HubError, StorageError
from zephon.io import Dataset
from zephon.specs import CacheOptions, StoreCredentials, StoreOptions
from zephon.storage.hub.client import resolve_hf_dataset
from zephon.storage.shard_cache import ShardCache
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource

TOKEN = "hf_ZephonSecretToken0123456789abcdefXY"
WRONG = "hf_ZephonWrongToken9876543210zyxwvuTS"
FINEWEB = "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train"
LOGGERS = (
    "",
    "zephon",
    "huggingface_hub",
    "httpx",
    "httpcore",
    "urllib3",
    "filelock",
    "transformers",
    "fsspec",
    "botocore",
)


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog at DEBUG on every logger, including libraries' loggers that do not propagate to the root."""
    loggers = [logging.getLogger(name) for name in LOGGERS]
    saved = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
        if lg.name != "root" and not lg.propagate:
            lg.addHandler(caplog.handler)
    caplog.handler.setLevel(logging.DEBUG)
    try:
        yield caplog
    finally:
        for lg, (level, propagate) in zip(loggers, saved, strict=True):
            lg.setLevel(level)
            lg.propagate = propagate
            lg.removeHandler(caplog.handler)


def chain(exc: BaseException) -> str:
    """Message, repr and formatted traceback of an exception and of every exception it was raised from."""
    parts, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts += [str(current), repr(current), *traceback.format_exception(current)]
        response = getattr(current, "response", None)
        if response is not None:
            parts += [repr(response), str(getattr(response, "url", ""))]
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


def files_under(*roots: Path) -> Iterator[tuple[Path, bytes]]:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                yield path, path.read_bytes()


def test_hf_token_appears_nowhere(reference_hub, gpt2_hub, tmp_path, monkeypatch, debug_logs, capfd) -> None:
    hub, _ = reference_hub
    hub.gate("HuggingFaceFW/fineweb-edu", [TOKEN])
    seen: list[str] = []  # every string a user could see

    # Refused: no token (401), a wrong token (403).
    with pytest.raises(HubError, match="HTTP 401") as missing:
        Dataset.from_path("web", FINEWEB)
    monkeypatch.setenv("HF_TOKEN", WRONG)
    with pytest.raises(HubError, match="HTTP 403") as denied:
        resolve_hf_dataset(FINEWEB)
    seen += [chain(missing.value), chain(denied.value)]

    # Accepted: resolve, plan (library and CLI), execute through the shard cache with the gpt2 tokenizer.
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    resolved = resolve_hf_dataset(FINEWEB)
    ds = Dataset.from_path("web", FINEWEB)
    source = StaticMixtureWorkSource(
        datasets=[ds], mixture=MixtureSpec({"web": 1}), seed=1, shuffle=ShuffleSpec(window_shards=1), lanes=1
    )
    plan = source.plan(tmp_path / "plan")
    config = tmp_path / "work.yaml"
    config.write_text(f"seed: 2\ndatasets:\n  - {{name: web, path: '{FINEWEB}'}}\nmixture: {{web: 1}}\n")
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "cli-plan")])
    assert result.exit_code == 0, result.output
    cache = CacheOptions(enabled=True, root=str(tmp_path / "shard-cache"), limit_bytes=1 << 30)
    pipe = (
        Pipeline.from_plan(plan)
        .options(io_options=StoreOptions(cache=cache))
        .tokenize(tokenizer_id="gpt2")
        .pack_flat(max_length=65)
        .batch(microbatch_size=4)
    )
    batches = list(pipe)
    assert batches and any(r.authorized for r in hub.requests if "/resolve/" in r.path)
    seen += [result.output, repr(resolved), repr(ds), repr(ds.files), repr(source), repr(pipe.executor_spec())]
    seen += [repr(pipe.stats()), repr(pipe.state_dict()), repr(ShardCache(cache.root, None).entries())]
    seen += [repr(r) for r in hub.requests]

    # Refused mid-run: a download with a wrong token (fresh cache).
    monkeypatch.setenv("HF_TOKEN", WRONG)
    fresh = CacheOptions(enabled=True, root=str(tmp_path / "fresh-cache"), limit_bytes=1 << 30)
    with pytest.raises(HubError, match="HTTP 403") as refused:
        list(pipe.options(io_options=StoreOptions(cache=fresh)))
    seen.append(chain(refused.value))

    out, err = capfd.readouterr()
    seen += [out, err, debug_logs.text]
    seen += [f"{r.getMessage()} {r.args!r} {r.__dict__!r}" for r in debug_logs.records]
    assert len(debug_logs.records) > 10  # the libraries did log at DEBUG
    for text in seen:
        assert TOKEN not in text and WRONG not in text
    written = list(files_under(tmp_path, Path(os.environ["ZEPHON_CACHE_DIR"])))
    assert any(p.name == "plan.json" for p, _ in written) and any("shard-cache" in str(p) for p, _ in written)
    for path, data in written:
        assert TOKEN.encode() not in data and WRONG.encode() not in data, path


def test_object_store_secrets_appear_nowhere(strict_s3_secrets, tmp_path, monkeypatch, debug_logs, capfd) -> None:
    """The same search for S3 keys: from the environment and from a StoreCredentials override, accepted
    (listing, footers, plan, run in both read modes) and refused (a wrong secret at listing and mid-run), with
    the moto server checking every signature."""
    server, bucket, url = strict_s3_secrets
    secret, wrong = server.SECRET_KEY, "zephon-wrong-secret-0123456789abcdef"
    seen: list[str] = []
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)

    ds = Dataset.from_path("web", url)
    source = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1}), seed=1)
    plan = source.plan(tmp_path / "plan")
    config = tmp_path / "work.yaml"
    config.write_text(f"seed: 2\ndatasets:\n  - {{name: web, path: '{url}'}}\nmixture: {{web: 1}}\n")
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "cli-plan")])
    assert result.exit_code == 0, result.output
    cache = CacheOptions(enabled=True, root=str(tmp_path / "shard-cache"), limit_bytes=1 << 30)
    override = StoreCredentials(prefix=f"s3://{bucket}", env=server.env())
    for io in (StoreOptions(cache=cache), StoreOptions(remote_read="range", credentials=(override,))):
        pipe = Pipeline.from_plan(plan).options(io_options=io).tokenize(tokenizer_id=demo_tokenizer_path())
        pipe = pipe.pack_flat(max_length=65).batch(microbatch_size=4)
        assert list(pipe)
        seen += [repr(io), str(io), repr(pipe.executor_spec()), repr(pipe.stats())]
    seen += [result.output, repr(ds), repr(ds.files), repr(source), repr(override)]
    from zephon.storage.objects.paths import parse_object_path
    from zephon.storage.objects.stores import store_for

    seen.append(repr(store_for(parse_object_path(url))))

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    with pytest.raises(StorageError, match="HTTP 403") as denied:
        Dataset.from_path("web", url)
    bad = StoreCredentials(prefix=f"s3://{bucket}", env={**server.env(), "AWS_SECRET_ACCESS_KEY": wrong})
    pipe = Pipeline.from_plan(plan).options(io_options=StoreOptions(remote_read="range", credentials=(bad,)))
    pipe = pipe.tokenize(tokenizer_id=demo_tokenizer_path()).pack_flat(max_length=65).batch(microbatch_size=4)
    with pytest.raises(StorageError, match="HTTP 403") as refused:
        list(pipe)
    seen += [chain(denied.value), chain(refused.value), repr(bad), repr(pipe.executor_spec())]

    out, err = capfd.readouterr()
    seen += [out, err, debug_logs.text]
    seen += [f"{r.getMessage()} {r.args!r} {r.__dict__!r}" for r in debug_logs.records]
    for text in seen:
        assert secret not in text and wrong not in text
    written = list(files_under(tmp_path, Path(os.environ["ZEPHON_CACHE_DIR"])))
    assert any(p.name == "plan.json" for p, _ in written) and any("shard-cache" in str(p) for p, _ in written)
    for path, data in written:
        assert secret.encode() not in data and wrong.encode() not in data, path


@pytest.fixture
def strict_s3_secrets(tmp_path, monkeypatch) -> Iterator[tuple[object, str, str]]:
    """A moto server that checks signatures, holding one Parquet shard; fast client retries."""
    from conftest import write_parquet_dataset
    from servers.object_servers import S3Server

    from zephon.storage.objects import stores

    monkeypatch.setattr(stores, "DEFAULT_RETRY", stores.ObjectRetry(attempts=2, base_delay=0.01, timeout=10.0))
    server = S3Server(log=tmp_path / "moto.log", authenticated=True)
    try:
        web = write_parquet_dataset(tmp_path / "local", "web", [40])
        client = server.client()
        client.create_bucket(Bucket="secrets")
        data = (web / "part-00000.parquet").read_bytes()
        client.put_object(Bucket="secrets", Key="web/part-00000.parquet", Body=data)
        yield server, "secrets", "s3://secrets/web/part-00000.parquet"
    finally:
        server.stop()
