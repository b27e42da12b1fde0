"""Resolution of hf:// paths and remote reads, against the local Hub server (tests/hub_server.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from servers.hub_fixtures import ALPACA, FINEWEB, WIKIPEDIA, add_reference_datasets, fineweb_shard
from servers.hub_server import HubServer, git_blob_oid

from zephon.errors import ConfigError, DatasetError, HubError
from zephon.storage.hub.client import (
    RetryPolicy,
    download_remote_file,
    read_remote_parquet_metadata,
    resolve_hf_dataset,
)
from zephon.storage.hub.discovery import conversion_layout, default_layout, dir_layout, glob_to_regex, listing_prefix

TOKEN = "hf_secretTOKENvalue123"
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02)


@pytest.fixture
def hub(reference_hub: tuple[HubServer, dict[str, str]]) -> HubServer:
    return reference_hub[0]


@pytest.fixture
def commits(reference_hub: tuple[HubServer, dict[str, str]]) -> dict[str, str]:
    return reference_hub[1]


def _files(resolved) -> list[tuple[str, int, str, str, str]]:
    return [(f.path_in_repo, f.size, f.etag, f.format, f.revision) for f in resolved.files]


def _expected(hub: HubServer, repo: str, commit: str, paths: list[str]) -> list[tuple[str, int, str, str, str]]:
    data = hub.files_at(repo, commit)
    return [(p, len(data[p]), hashlib.sha256(data[p]).hexdigest(), "parquet", commit) for p in paths]


SAMPLE = [f"sample/10BT/00{i}_00000.parquet" for i in range(3)]


def test_fineweb_main_resolves_and_pins(hub: HubServer, commits: dict[str, str]) -> None:
    sha = commits["fineweb_main"]
    resolved = resolve_hf_dataset("hf://HuggingFaceFW/fineweb-edu/sample-10BT/train")
    assert resolved.commit == sha == hub.resolve(FINEWEB, "main")
    assert resolved.source == "original"
    assert str(resolved.pinned) == f"hf://HuggingFaceFW/fineweb-edu@{sha}~original/sample-10BT/train"
    assert str(resolved.path) == "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train"
    assert _files(resolved) == _expected(hub, FINEWEB, sha, SAMPLE)
    assert resolved.files[0].url() == f"{hub.url}/datasets/{FINEWEB}/resolve/{sha}/{SAMPLE[0]}"
    # Only the directory named by the card's data_files was listed, not the whole repository.
    assert [r.path for r in hub.requests if "/tree/" in r.path] == [f"/api/datasets/{FINEWEB}/tree/{sha}/sample/10BT"]


def test_fineweb_branch_v140(hub: HubServer, commits: dict[str, str]) -> None:
    sha = commits["fineweb_v1"]
    resolved = resolve_hf_dataset("hf://HuggingFaceFW/fineweb-edu@v1.4.0/sample-10BT/train")
    assert resolved.commit == sha != commits["fineweb_main"]
    assert str(resolved.pinned) == f"hf://HuggingFaceFW/fineweb-edu@{sha}~original/sample-10BT/train"
    assert _files(resolved) == _expected(hub, FINEWEB, sha, SAMPLE[:2])
    assert resolve_hf_dataset("hf://HuggingFaceFW/fineweb-edu@v1.0.0/sample-10BT/train").commit == sha  # a tag


def test_wikipedia_config(hub: HubServer, commits: dict[str, str]) -> None:
    sha = commits["wikipedia_main"]
    resolved = resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train")
    paths = [f"20231101.en/train-0000{i}-of-00002.parquet" for i in range(2)]
    assert _files(resolved) == _expected(hub, WIKIPEDIA, sha, paths)
    assert str(resolved.pinned) == f"hf://wikimedia/wikipedia@{sha}~original/20231101.en/train"


def test_alpaca_parquet_conversion(hub: HubServer, commits: dict[str, str]) -> None:
    sha = commits["alpaca_conversion"]
    resolved = resolve_hf_dataset("hf://yahma/alpaca-cleaned@~parquet/train")
    assert (resolved.commit, resolved.source) == (sha, "parquet")
    assert sha == hub.resolve(ALPACA, "refs/convert/parquet") != commits["alpaca_main"]
    assert str(resolved.pinned) == f"hf://yahma/alpaca-cleaned@{sha}~parquet/default/train"
    assert _files(resolved) == _expected(hub, ALPACA, sha, ["default/train/0000.parquet"])
    paths = {r.path for r in hub.requests}
    assert f"/api/datasets/{ALPACA}/revision/refs/convert/parquet" in paths
    assert any(r.raw_path.endswith("/revision/refs%2Fconvert%2Fparquet") for r in hub.requests)


def test_default_source_falls_back_to_conversion_for_unsupported_files(hub: HubServer, commits: dict[str, str]) -> None:
    resolved = resolve_hf_dataset("hf://yahma/alpaca-cleaned/train")
    assert resolved.source == "parquet"
    assert str(resolved.pinned) == f"hf://yahma/alpaca-cleaned@{commits['alpaca_conversion']}~parquet/default/train"
    with pytest.raises(HubError) as info:
        resolve_hf_dataset("hf://yahma/alpaca-cleaned@~original/train")
    assert str(info.value) == (
        "files of dataset yahma/alpaca-cleaned config 'default' split 'train' must be parquet, jsonl, jsonl.gz, "
        "jsonl.zst, tar, tar.gz, got 'alpaca_data_cleaned.json' (1 unsupported of 1) — read the Hub's Parquet conversion "
        "with hf://yahma/alpaca-cleaned@~parquet/train"
    )


def test_pinned_path_round_trip_needs_no_revision_lookup(hub: HubServer) -> None:
    for text in ("hf://HuggingFaceFW/fineweb-edu/sample-10BT/train", "hf://yahma/alpaca-cleaned@~parquet/train"):
        first = resolve_hf_dataset(text)
        hub.clear_requests()
        again = resolve_hf_dataset(str(first.pinned))
        assert (again.pinned, again.files, again.commit) == (first.pinned, first.files, first.commit)
        for record in hub.requests:
            assert first.commit in record.path, record.path  # every call names the commit: no branch lookup
            assert "/refs" not in record.path
    # For the conversion even the info call is skipped: listing the tree at the commit is enough.
    assert [r.path.split("/")[5] for r in hub.requests] == ["tree"]


def test_moved_branch_gives_new_sha_old_pin_keeps_old_files(hub: HubServer, commits: dict[str, str]) -> None:
    before = resolve_hf_dataset("hf://HuggingFaceFW/fineweb-edu/sample-10BT/train")
    new_sha = hub.commit(
        FINEWEB,
        {"sample/10BT/003_00000.parquet": fineweb_shard(5)},
        keep=True,
        delete=["sample/10BT/000_00000.parquet"],
    )
    after = resolve_hf_dataset("hf://HuggingFaceFW/fineweb-edu/sample-10BT/train")
    assert after.commit == new_sha != before.commit
    assert [f.path_in_repo for f in after.files] == [*SAMPLE[1:], "sample/10BT/003_00000.parquet"]
    old = resolve_hf_dataset(str(before.pinned))
    assert old.files == before.files
    hub.move_branch(FINEWEB, "main", commits["fineweb_v1"])  # a branch can also move backwards
    assert resolve_hf_dataset("hf://HuggingFaceFW/fineweb-edu/sample-10BT/train").commit == commits["fineweb_v1"]


def test_gated_dataset_401_and_403_name_the_dataset_and_the_fix(hub: HubServer, monkeypatch) -> None:
    hub.gate(WIKIPEDIA, [TOKEN])
    page = f"{hub.url}/datasets/{WIKIPEDIA}"
    with pytest.raises(HubError) as missing:
        resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train")
    assert str(missing.value) == (
        "access to dataset wikimedia/wikipedia must be authorized, got HTTP 401 with no token — run "
        f"`hf auth login` or set HF_TOKEN, and request access on {page} if the dataset is gated"
    )
    wrong = "hf_wrongTOKEN456"
    with pytest.raises(HubError) as denied:
        resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train", token=wrong)
    assert str(denied.value) == (
        "access to dataset wikimedia/wikipedia must be granted to your token, got HTTP 403 — request access "
        f"on {page}, or run `hf auth login` / set HF_TOKEN with a token that has access"
    )
    chain = f"{denied.value!s} {denied.value!r} {denied.value.__cause__!s} {denied.value.__cause__!r}"
    assert wrong not in chain
    # Accepted: explicit token, HF_TOKEN, or the token saved by `hf auth login` (HF_HOME is isolated).
    assert len(resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train", token=TOKEN).files) == 2
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    resolved = resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train")
    assert TOKEN not in repr(resolved)
    monkeypatch.delenv("HF_TOKEN")
    from huggingface_hub import constants

    Path(constants.HF_TOKEN_PATH).write_text(TOKEN)
    hub.clear_requests()
    resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train")
    assert all(r.authorized and r.status == 200 for r in hub.requests)
    metadata = read_remote_parquet_metadata(resolved.files[0])
    assert metadata.num_rows == 150


def test_gated_download_without_token(hub: HubServer, tmp_path: Path) -> None:
    resolved = resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train")
    hub.gate(WIKIPEDIA, [TOKEN])
    with pytest.raises(HubError, match=r"^access to dataset wikimedia/wikipedia must be authorized, got HTTP 401"):
        download_remote_file(resolved.files[0], str(tmp_path / "out" / "x.parquet"))
    with pytest.raises(HubError, match="got HTTP 403") as info:
        read_remote_parquet_metadata(resolved.files[0], token="hf_nope_789")
    assert "hf_nope_789" not in f"{info.value} {info.value.__cause__}"
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            "hf://HuggingFaceFW/fineweb-edu/train",
            "config of dataset HuggingFaceFW/fineweb-edu must be given, it has 3 configs: default, sample-10BT, "
            "CC-MAIN-2024-10 — write e.g. hf://HuggingFaceFW/fineweb-edu/default/train (the card's default config)",
        ),
        (
            "hf://HuggingFaceFW/fineweb-edu/sample-100BT/train",
            "config of dataset HuggingFaceFW/fineweb-edu must be one of default, sample-10BT, CC-MAIN-2024-10, got "
            "'sample-100BT' — write e.g. hf://HuggingFaceFW/fineweb-edu/default/train",
        ),
        (
            "hf://wikimedia/wikipedia/20231101.en/test",
            "split of dataset wikimedia/wikipedia config '20231101.en' must be one of train, got 'test' — write e.g. "
            "hf://wikimedia/wikipedia/20231101.en/train",
        ),
        (
            "hf://HuggingFaceFW/fineweb-edu@v9.9/sample-10BT/train",
            "revision of dataset HuggingFaceFW/fineweb-edu must exist, got 'v9.9' — available branches: main, v1.4.0; "
            "tags: v1.0.0 (or pin a commit sha)",
        ),
        (
            f"hf://HuggingFaceFW/fineweb-edu@{'ab' * 20}~original/sample-10BT/train",
            f"commit of dataset HuggingFaceFW/fineweb-edu must exist, got '{'ab' * 20}' — available branches: main, "
            "v1.4.0; tags: v1.0.0 (or pin a commit sha)",
        ),
        (
            "hf://yahma/alpaca-cleaned@~parquet/validation",
            "split of dataset yahma/alpaca-cleaned config 'default' must be one of train, got 'validation' — write "
            "e.g. hf://yahma/alpaca-cleaned@~parquet/train",
        ),
        (
            "hf://yahma/alpaca-cleaned@v1~parquet/train",
            "revision of hf://yahma/alpaca-cleaned@v1~parquet/train must be main or a commit sha of refs/convert/parquet "
            "when reading the Parquet conversion, got 'v1' — the Hub converts only the main branch: drop @v1 or read "
            "uploaded files with ~original",
        ),
        (
            "hf://wikimedia/wikipedia@~parquet/20231101.en/train",
            "dataset wikimedia/wikipedia must have a Parquet conversion (branch refs/convert/parquet) to read "
            "hf://wikimedia/wikipedia@~parquet/20231101.en/train, got none — read uploaded files with ~original",
        ),
    ],
)
def test_unknown_names_list_what_exists(hub: HubServer, path: str, message: str) -> None:
    with pytest.raises(HubError) as info:
        resolve_hf_dataset(path)
    assert str(info.value) == message


def test_missing_dataset(hub: HubServer) -> None:
    with pytest.raises(
        HubError,
        match=r"^dataset nobody/nothing must exist on http://127\.0\.0\.1:\d+, got HTTP "
        r"404 for the revision 'main' — check the org/name spelling",
    ):
        resolve_hf_dataset("hf://nobody/nothing/train")


def test_offline_mode_refuses_before_any_request(hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    file = resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train").files[0]
    hub.clear_requests()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="^Hub access for dataset wikimedia/wikipedia must be allowed to resolve "):
        resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train")
    with pytest.raises(HubError, match="got HF_HUB_OFFLINE set — unset it$"):
        read_remote_parquet_metadata(file)
    assert hub.requests == []


def test_datasets_file_form_is_refused(hub: HubServer) -> None:
    with pytest.raises(
        ConfigError,
        match="use hf://HuggingFaceFW/fineweb-edu/sample-10BT/train, not "
        "hf://datasets/HuggingFaceFW/fineweb-edu/sample-10BT/train$",
    ):
        resolve_hf_dataset("hf://datasets/HuggingFaceFW/fineweb-edu/sample-10BT/train")
    assert hub.requests == []


@pytest.mark.parametrize("status", [503, 429])
def test_transient_errors_are_retried(hub: HubServer, status: int) -> None:
    hub.inject_faults(status, 2)
    resolved = resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train", retry=FAST)
    assert len(resolved.files) == 2
    info_calls = [r.status for r in hub.requests if r.path.endswith("/revision/main")]
    assert info_calls == [status, status, 200]


def test_persistent_503_fails_fast_with_a_clear_error(hub: HubServer) -> None:
    hub.inject_faults(503, 1000)
    started = time.monotonic()
    with pytest.raises(HubError) as info:
        resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train", retry=FAST)
    assert time.monotonic() - started < 1.0
    assert str(info.value) == (
        f"Hub at {hub.url} must answer the revision 'main' of dataset wikimedia/wikipedia, got HTTP 503 after 3 "
        "attempt(s) — the Hub is unavailable or rate-limiting; retry later"
    )
    assert len(hub.requests) == 3


def test_range_reads_are_retried(hub: HubServer) -> None:
    file = resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train").files[0]
    hub.clear_requests()
    hub.inject_faults(503, 1, path_contains="/resolve/")
    assert read_remote_parquet_metadata(file, retry=FAST).num_rows == 150
    assert [r.status for r in hub.requests] == [503, 206, 206]
    hub.inject_faults(502, 1000, path_contains="/resolve/")
    with pytest.raises(HubError, match=r"got HTTP 502 after 3 attempt\(s\)"):
        read_remote_parquet_metadata(file, retry=FAST)


def test_footer_read_transfers_only_the_footer(hub: HubServer, commits: dict[str, str]) -> None:
    file = resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train").files[1]
    data = hub.files_at(WIKIPEDIA)[file.path_in_repo]
    footer = int.from_bytes(data[-8:-4], "little")
    hub.clear_requests()
    metadata = read_remote_parquet_metadata(file)
    local = pq.read_metadata(io.BytesIO(data))
    assert metadata.equals(local) and metadata.num_rows == 150 and metadata.num_row_groups == 3
    assert [r.range for r in hub.requests] == [
        f"bytes={len(data) - 8}-{len(data) - 1}",
        f"bytes={len(data) - 8 - footer}-{len(data) - 9}",
    ]
    assert hub.bytes_served("/resolve/") == footer + 8 < len(data) // 4


def test_footer_read_refuses_a_changed_file(hub: HubServer) -> None:
    file = resolve_hf_dataset("hf://wikimedia/wikipedia/20231101.en/train").files[0]
    with pytest.raises(
        HubError,
        match=f"must be {file.size + 1} bytes as resolved, got {file.size} — the file "
        "changed; resolve the dataset again",
    ):
        read_remote_parquet_metadata(dataclasses.replace(file, size=file.size + 1))
    with pytest.raises(
        DatasetError, match="must be Parquet of at least 12 bytes to read its footer, got format 'jsonl' of "
    ):
        read_remote_parquet_metadata(dataclasses.replace(file, format="jsonl"))


def test_download_verifies_size_and_hash(hub: HubServer, tmp_path: Path) -> None:
    file = resolve_hf_dataset("hf://HuggingFaceFW/fineweb-edu/sample-10BT/train").files[2]
    dest = tmp_path / "cache" / "shard.parquet"
    download_remote_file(file, str(dest))
    assert dest.read_bytes() == hub.files_at(FINEWEB)[file.path_in_repo]
    assert sorted(os.listdir(dest.parent)) == ["shard.parquet"]
    bad_size = dataclasses.replace(file, size=file.size + 10)
    with pytest.raises(HubError, match=f"must be {file.size + 10} bytes, got {file.size} — the file changed"):
        download_remote_file(bad_size, str(tmp_path / "a.parquet"))
    short = dataclasses.replace(file, size=file.size - 10)
    with pytest.raises(HubError, match=f"must be {file.size - 10} bytes, got more"):
        download_remote_file(short, str(tmp_path / "b.parquet"))
    bad_hash = dataclasses.replace(file, etag="0" * 64)
    with pytest.raises(HubError, match="must match etag 0{64}, got [0-9a-f]{64} — the download is corrupt"):
        download_remote_file(bad_hash, str(tmp_path / "c.parquet"))
    assert sorted(os.listdir(tmp_path / "cache")) == ["shard.parquet"]
    assert not any(name.startswith(("a.", "b.", "c.")) for name in os.listdir(tmp_path))


def test_download_retries_a_broken_body_then_fails_cleanly(hub: HubServer, tmp_path: Path) -> None:
    file = resolve_hf_dataset("hf://HuggingFaceFW/fineweb-edu/sample-10BT/train").files[0]
    hub.clear_requests()
    hub.truncate_responses(1, path_contains="/resolve/")
    download_remote_file(file, str(tmp_path / "ok.parquet"), retry=FAST)
    assert (tmp_path / "ok.parquet").read_bytes() == hub.files_at(FINEWEB)[file.path_in_repo]
    assert [r.body_bytes for r in hub.requests] == [file.size // 2, file.size]
    hub.truncate_responses(1000, path_contains="/resolve/")
    with pytest.raises(
        HubError, match=r"of dataset HuggingFaceFW/fineweb-edu, got RemoteProtocolError after 3 attempt"
    ):
        download_remote_file(file, str(tmp_path / "broken.parquet"), retry=FAST)
    assert sorted(os.listdir(tmp_path)) == ["hf_home", "ok.parquet"]


def test_download_of_git_stored_jsonl_checks_the_blob_sha1(hub: HubServer, tmp_path: Path) -> None:
    lines = b'{"text": "hello"}\n{"text": "world"}\n'
    sha = hub.add_dataset("org/small", {"data/train-0.jsonl": lines, "data/test-0.jsonl": lines[:18]})
    resolved = resolve_hf_dataset("hf://org/small/train")
    assert [(f.path_in_repo, f.size, f.etag, f.format) for f in resolved.files] == [
        ("data/train-0.jsonl", len(lines), git_blob_oid(lines), "jsonl")
    ]
    assert str(resolved.pinned) == f"hf://org/small@{sha}~original/default/train"
    download_remote_file(resolved.files[0], str(tmp_path / "t.jsonl"))
    assert (tmp_path / "t.jsonl").read_bytes() == lines
    with pytest.raises(HubError, match="must match etag"):
        download_remote_file(dataclasses.replace(resolved.files[0], etag="1" * 40), str(tmp_path / "u.jsonl"))


def test_tree_pagination_is_followed(hub: HubServer) -> None:
    hub.tree_page_size = 2
    resolved = resolve_hf_dataset("hf://HuggingFaceFW/fineweb-edu/sample-10BT/train")
    assert [f.path_in_repo for f in resolved.files] == SAMPLE
    assert sum("/tree/" in r.path for r in hub.requests) == 2


def test_server_works_with_hf_hub_download(hub: HubServer) -> None:
    from huggingface_hub import hf_hub_download

    local = hf_hub_download(
        ALPACA, "default/train/0000.parquet", repo_type="dataset", revision="refs/convert/parquet", endpoint=hub.url
    )
    assert Path(local).read_bytes() == hub.files_at(ALPACA, "refs/convert/parquet")["default/train/0000.parquet"]


def test_fixture_is_isolated(hub_server: HubServer) -> None:
    from huggingface_hub import constants

    assert os.environ["HF_ENDPOINT"] == hub_server.url
    assert "HF_HUB_OFFLINE" not in os.environ and "HF_TOKEN" not in os.environ
    assert Path(constants.HF_TOKEN_PATH).parent == Path(os.environ["HF_HOME"])
    fresh = HubServer().start()
    try:  # a second server can hold the same repos (deterministic content)
        assert add_reference_datasets(fresh) == add_reference_datasets(hub_server)
    finally:
        fresh.stop()


# -- discovery rules (pure) ----------------------------------------------------------------------------
def test_glob_semantics() -> None:
    assert glob_to_regex("data/*/*").match("data/CC/x.parquet")
    assert not glob_to_regex("data/*").match("data/CC/x.parquet")
    assert glob_to_regex("data/**").match("data/a/b/c.parquet")
    assert glob_to_regex("**/train-*.parquet").match("train-0.parquet")
    assert glob_to_regex("shard-[0-9].jsonl").match("shard-7.jsonl")
    assert listing_prefix(["sample/10BT/*"]) == "sample/10BT"
    assert listing_prefix(["data/en/*.parquet", "data/fr/*.parquet"]) == "data"
    assert listing_prefix(["*.parquet"]) == ""


def test_default_layout_rules() -> None:
    assert default_layout(["README.md", "data/train-00000.parquet", "data/test-00000.parquet", "x/y.parquet"]) == {
        "default": {"test": ["data/test-00000.parquet"], "train": ["data/train-00000.parquet"]}
    }
    assert default_layout(["train/a.jsonl", "dev/b.jsonl.gz"]) == {
        "default": {"train": ["train/a.jsonl"], "validation": ["dev/b.jsonl.gz"]}
    }
    assert default_layout(["en/train-0.parquet", "en/test-0.parquet", "fr/train/0.parquet", "misc/a.parquet"]) == {
        "en": {"test": ["en/test-0.parquet"], "train": ["en/train-0.parquet"]},
        "fr": {"train": ["fr/train/0.parquet"]},
    }
    assert default_layout(["raw/wiki_test_2020.jsonl", "raw/wiki_train_2020.jsonl"]) == {
        "default": {"test": ["raw/wiki_test_2020.jsonl"], "train": ["raw/wiki_train_2020.jsonl"]}
    }
    assert default_layout(["a.json", ".hidden/b.json", "c.png"]) == {"default": {"train": ["a.json"]}}
    assert default_layout(["README.md"]) == {}
    assert dir_layout(["sub/train.parquet", "other/test.parquet"], "sub") == {"train": ["sub/train.parquet"]}


def test_conversion_layout() -> None:
    assert conversion_layout(
        [
            "default/train/0000.parquet",
            "default/train/0001.parquet",
            "default/partial-test/0000.parquet",
            "other/validation/0000.parquet",
            "README.md",
            ".gitattributes",
        ]
    ) == {
        "default": {
            "partial-test": ["default/partial-test/0000.parquet"],
            "train": ["default/train/0000.parquet", "default/train/0001.parquet"],
        },
        "other": {"validation": ["other/validation/0000.parquet"]},
    }


def test_partial_conversion_is_refused(hub: HubServer) -> None:
    hub.add_dataset("org/big", {"data.csv": "a,b\n1,2\n"})
    hub.add_parquet_conversion("org/big", {"default/partial-train/0000.parquet": fineweb_shard(9)})
    with pytest.raises(HubError, match="config 'default' split 'train' must be complete, got only partial-train"):
        resolve_hf_dataset("hf://org/big/train")


def test_card_data_dir_and_string_data_files(hub: HubServer) -> None:
    card = "---\nconfigs:\n- config_name: a\n  data_dir: sub\n- config_name: b\n  data_files: b/*.parquet\n---\n"
    hub.add_dataset(
        "org/card",
        {"sub/train-0.parquet": b"x" * 20, "sub/test-0.parquet": b"y" * 20, "b/0.parquet": b"z" * 20},
        readme=card,
    )
    assert [f.path_in_repo for f in resolve_hf_dataset("hf://org/card/a/test").files] == ["sub/test-0.parquet"]
    assert [f.path_in_repo for f in resolve_hf_dataset("hf://org/card/b/train").files] == ["b/0.parquet"]
    with pytest.raises(HubError, match=r"split of dataset org/card config 'a' must be one of test, train, got 'dev'"):
        resolve_hf_dataset("hf://org/card/a/dev")
