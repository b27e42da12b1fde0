"""Model repos on the local Hub server (tests/hub_server.py): the real transformers and huggingface_hub clients
load the demo tokenizer published as ``gpt2``, so ``tokenize(tokenizer_id="gpt2")`` runs hermetically."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    GatedRepoError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from servers.hub_fixtures import DEMO_TOKENIZER_FILES, add_demo_gpt2, demo_tokenizer_files
from servers.hub_server import HubServer
from tokenizers import Tokenizer

from zephon.demo import demo_tokenizer_path
from zephon.errors import TokenizerError
from zephon.executor.encode.text import Encoder
from zephon.specs import TokenizeSpec

TEXTS = [
    "Hello world",
    "The river flows past the old mill, and the teacher reads a letter.",
    "def f(x):\n    return x * 2  # code\n",
    "  leading spaces, UTF-8 café — ünïcödé and numbers 12345",
    "<|endoftext|> is the end-of-text token",
    "",
]


def _resolves(hub: HubServer, repo_id: str) -> dict[str, set[str]]:
    """{file: {methods}} of the resolve requests made for ``repo_id``."""
    out: dict[str, set[str]] = {}
    for r in hub.requests:
        head, sep, rest = r.path.partition(f"/{repo_id}/resolve/")
        if sep and not head:
            out.setdefault(rest.split("/", 1)[1], set()).add(r.method)
    return out


def test_hub_server_fixture_isolates_hf_home(gpt2_hub: HubServer, tmp_path: Path) -> None:
    from huggingface_hub import constants

    assert gpt2_hub.url == constants.ENDPOINT
    assert Path(constants.HF_HUB_CACHE).is_relative_to(tmp_path)
    assert not Path(constants.HF_HUB_CACHE).exists()  # nothing cached: every load below downloads


def test_auto_tokenizer_downloads_gpt2_from_server(gpt2_hub: HubServer) -> None:
    from huggingface_hub import constants
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("gpt2")

    assert tokenizer.is_fast
    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.eos_token_id == 0
    demo = Tokenizer.from_file(str(Path(demo_tokenizer_path()) / "tokenizer.json"))
    for text in TEXTS:
        assert tokenizer.encode(text) == demo.encode(text, add_special_tokens=False).ids, text
    assert tokenizer.encode("Hello world") != []

    sha = gpt2_hub.resolve("gpt2", repo_type="model")
    resolves = _resolves(gpt2_hub, "gpt2")
    for name in DEMO_TOKENIZER_FILES:  # the three files were downloaded (GET), at the commit main resolved to
        assert "GET" in resolves[name], (name, resolves)
    assert all(r.path.split("/")[3] == sha for r in gpt2_hub.requests if "/gpt2/resolve/" in r.path)
    assert any(r.path == "/api/models/gpt2" and r.status == 200 for r in gpt2_hub.requests)
    # Optional files the repo lacks were asked for and answered 404 EntryNotFound, which transformers ignores.
    missing = {r.path.rsplit("/", 1)[1] for r in gpt2_hub.requests if "/gpt2/resolve/" in r.path and r.status == 404}
    assert {"added_tokens.json", "chat_template.jinja"} <= missing
    assert not [
        r
        for r in gpt2_hub.requests
        if r.status >= 500
        or (r.status == 404 and "resolve" not in r.path and "additional_chat_templates" not in r.path)
    ]
    snapshot = Path(constants.HF_HUB_CACHE) / "models--gpt2" / "snapshots" / sha
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(DEMO_TOKENIZER_FILES)

    # A second load revalidates (HEAD) without downloading the files again.
    gpt2_hub.clear_requests()
    again = AutoTokenizer.from_pretrained("gpt2")
    assert again.encode(TEXTS[1]) == tokenizer.encode(TEXTS[1])
    assert not [r for r in gpt2_hub.requests if r.method == "GET" and "/resolve/" in r.path]


def test_auto_tokenizer_with_org_id_and_tag(gpt2_hub: HubServer) -> None:
    from transformers import AutoTokenizer

    repo = "openai-community/gpt2"
    tagged = gpt2_hub.create_tag(repo, "v1", repo_type="model")
    main = gpt2_hub.commit(repo, {"README.md": "moved on\n"}, keep=True, repo_type="model")
    tokenizer = AutoTokenizer.from_pretrained(repo, revision="v1")

    assert tokenizer.eos_token_id == 0
    assert "GET" in _resolves(gpt2_hub, repo)["tokenizer.json"]
    assert any(r.path == f"/api/models/{repo}/revision/v1" and r.status == 200 for r in gpt2_hub.requests)
    commits = {r.path.split("/")[4] for r in gpt2_hub.requests if f"/{repo}/resolve/" in r.path}
    assert commits == {tagged} and tagged != main
    assert not _resolves(gpt2_hub, "gpt2")  # the two repos are separate


def test_hf_hub_download_model_file(gpt2_hub: HubServer) -> None:
    files = demo_tokenizer_files()
    path = hf_hub_download(repo_id="gpt2", filename="tokenizer.json")
    assert Path(path).read_bytes() == files["tokenizer.json"]
    config = hf_hub_download(repo_id="openai-community/gpt2", filename="tokenizer_config.json")
    assert Path(config).read_bytes() == files["tokenizer_config.json"]
    sha = gpt2_hub.resolve("gpt2", repo_type="model")
    head = [r for r in gpt2_hub.requests if r.method == "HEAD" and r.path == "/gpt2/resolve/main/tokenizer.json"]
    assert head and head[0].status == 200
    assert Path(path).parent.name == sha

    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(repo_id="gpt2", filename="added_tokens.json")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(repo_id="gpt2", filename="tokenizer.json", revision="v9")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(repo_id="nope/missing", filename="tokenizer.json")


def _http(method: str, url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_model_info_tree_and_ranges(gpt2_hub: HubServer) -> None:
    api = HfApi(endpoint=gpt2_hub.url)
    info = api.model_info("gpt2", files_metadata=True)
    assert info.sha == gpt2_hub.resolve("gpt2", repo_type="model")
    sizes = {s.rfilename: s.size for s in info.siblings}
    assert sizes == {name: len(data) for name, data in demo_tokenizer_files().items()}
    assert sorted(e.path for e in api.list_repo_tree("openai-community/gpt2")) == sorted(DEMO_TOKENIZER_FILES)
    assert api.file_exists("gpt2", "tokenizer.json") and not api.file_exists("gpt2", "config.json")
    assert [b.name for b in api.list_repo_refs("gpt2").branches] == ["main"]

    data = demo_tokenizer_files()["special_tokens_map.json"]
    status, headers, body = _http(
        "GET", f"{gpt2_hub.url}/gpt2/resolve/main/special_tokens_map.json", {"Range": "bytes=2-9"}
    )
    assert (status, body, headers["Content-Range"]) == (206, data[2:10], f"bytes 2-9/{len(data)}")
    assert headers["X-Repo-Commit"] == info.sha
    status, headers, _ = _http("HEAD", f"{gpt2_hub.url}/gpt2/resolve/main/processor_config.json")
    assert (status, headers["X-Error-Code"]) == (404, "EntryNotFound")
    status, headers, _ = _http("GET", f"{gpt2_hub.url}/nope/resolve/main/config.json")
    assert (status, headers["X-Error-Code"]) == (404, "RepoNotFound")


def test_gated_model_repo(gpt2_hub: HubServer) -> None:
    token = "hf_modelTOKENvalue123"
    gpt2_hub.gate("gpt2", [token], repo_type="model")
    with pytest.raises(GatedRepoError):
        hf_hub_download(repo_id="gpt2", filename="tokenizer.json")
    with pytest.raises(TokenizerError, match="tokenizer 'gpt2' could not be loaded"):
        Encoder(TokenizeSpec(tokenizer_id="gpt2"))
    path = hf_hub_download(repo_id="gpt2", filename="tokenizer.json", token=token)
    assert Path(path).read_bytes() == demo_tokenizer_files()["tokenizer.json"]
    assert {r.status for r in gpt2_hub.requests if r.path.startswith("/gpt2/") and not r.authorized} == {401}


def test_model_and_dataset_repos_are_separate(hub_server: HubServer) -> None:
    add_demo_gpt2(hub_server)
    hub_server.add_dataset("openai-community/gpt2", {"data.jsonl": b'{"text": "x"}\n'})
    assert set(hub_server.files_at("openai-community/gpt2")) == {"data.jsonl"}
    assert set(hub_server.files_at("openai-community/gpt2", repo_type="model")) == set(DEMO_TOKENIZER_FILES)
    with pytest.raises(ValueError, match="model repo id"):
        hub_server.add_model("a/b/c", {})


def test_encoder_loads_gpt2_from_server(gpt2_hub: HubServer) -> None:
    hub_encoder = Encoder(TokenizeSpec(tokenizer_id="gpt2"))
    local_encoder = Encoder(TokenizeSpec(tokenizer_id=demo_tokenizer_path()))

    assert hub_encoder.fingerprint == local_encoder.fingerprint
    assert (hub_encoder.eos_id, hub_encoder.bos_id, hub_encoder.pad_id, hub_encoder.prefix) == (0, 0, 0, [])
    assert [a.tolist() for a in hub_encoder.encode(TEXTS)] == [a.tolist() for a in local_encoder.encode(TEXTS)]
    assert hub_encoder.tokenizer.to_str() == local_encoder.tokenizer.to_str()
    resolves = _resolves(gpt2_hub, "gpt2")
    for name in DEMO_TOKENIZER_FILES:
        assert "GET" in resolves[name], (name, resolves)


def test_encoder_with_org_id_matches_plain_id(gpt2_hub: HubServer) -> None:
    plain = Encoder(TokenizeSpec(tokenizer_id="gpt2"))
    org = Encoder(TokenizeSpec(tokenizer_id="openai-community/gpt2"))
    assert org.fingerprint == plain.fingerprint
    assert "GET" in _resolves(gpt2_hub, "openai-community/gpt2")["tokenizer.json"]


def test_readme_snippet_runs_with_gpt2_id(gpt2_hub: HubServer, make_parquet, tokenizer_dir) -> None:
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    source = StaticMixtureWorkSource(
        datasets=[
            Dataset.from_path("web", make_parquet("web", [6, 5])),
            Dataset.from_path("code", make_parquet("code", [4])),
        ],
        mixture=MixtureSpec({"web": 0.7, "code": 0.3}),
        seed=42,
    )

    def batches(tokenizer_id: str) -> list[list[list[int]]]:
        pipeline = (
            Pipeline(source)
            .tokenize(tokenizer_id=tokenizer_id, field="text")
            .pack_flat(max_length=17, algorithm="wrap")
            .batch(microbatch_size=2)
        )
        return [batch.to_training(return_labels=True)["input_ids"].tolist() for batch in pipeline]

    from_hub = batches("gpt2")
    assert from_hub and from_hub == batches(tokenizer_dir)
    assert "GET" in _resolves(gpt2_hub, "gpt2")["tokenizer.json"]


def test_missing_model_repo_is_a_tokenizer_error(gpt2_hub: HubServer) -> None:
    with pytest.raises(TokenizerError, match="tokenizer 'nope/missing' could not be loaded"):
        Encoder(TokenizeSpec(tokenizer_id="nope/missing"))
    assert any(r.path.startswith("/api/models/nope/missing") and r.status == 404 for r in gpt2_hub.requests)
