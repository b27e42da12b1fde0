"""Secrets: a Hugging Face token never appears in plan bundles, caches, logs, output, error messages or reprs.

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
from zephon.errors import HubError
from zephon.io import Dataset
from zephon.specs import CacheOptions, StoreOptions
from zephon.storage.hub.client import resolve_hf_dataset
from zephon.storage.shard_cache import ShardCache
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource

TOKEN = "hf_ZephonSecretToken0123456789abcdefXY"
WRONG = "hf_ZephonWrongToken9876543210zyxwvuTS"
FINEWEB = "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train"
LOGGERS = ("", "zephon", "huggingface_hub", "httpx", "httpcore", "urllib3", "filelock", "transformers", "fsspec")


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
