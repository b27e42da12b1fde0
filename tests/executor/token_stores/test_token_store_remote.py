"""Token stores on a real S3 server (moto) and the Hub test server: indexes and token ranges by range requests.

The bar: the store read remotely gives the same documents and counts as its local copy, opening reads only
the index files, each ``read`` is one range GET of exactly the documents' bytes, and an object changed after
opening is refused (its pin), never mixed in.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from zephon.errors import DatasetError
from zephon.executor.token_stores import detect_format, open_token_store
from zephon.storage.objects.reads import REQUESTS

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "token_stores"
DOCS = [[1, 17, 23, 2], [1, 5, 2], [1, 300, 301, 302, 303, 2], [1, 2], [1, 40000, 7, 9, 2], [1, 65000, 2]]
COUNTS = [4, 3, 6, 2, 5, 3]


def gets() -> int:
    return REQUESTS["range"] + REQUESTS["whole"] + REQUESTS["footer"]


def test_megatron_on_s3_reads_its_index_then_one_range_per_read(s3) -> None:
    s3.upload_dir(FIXTURES / "megatron", "corpus/")
    url = s3.url("corpus/split_sentence")
    assert detect_format(url) == "megatron"
    before = gets()
    store = open_token_store(url)
    assert gets() - before == 1  # the whole .idx, nothing of the .bin
    assert store.token_counts().tolist() == COUNTS and str(store.dtype) == "int32"
    assert store.path == url
    before = gets()
    assert store.read(2, 5).to_lists() == DOCS[2:5]
    assert gets() - before == 1
    assert store.read(0, 6).to_lists() == DOCS


def test_a_folder_of_megatron_prefixes_on_s3(s3) -> None:
    for name in ("a", "b"):
        for ext in (".idx", ".bin"):
            s3.put(f"web/{name}{ext}", (FIXTURES / f"megatron/web_text_document{ext}").read_bytes())
    store = open_token_store(s3.url("web/"))
    assert store.num_documents == 12 and store.read(5, 7).to_lists() == [DOCS[5], DOCS[0]]


def test_an_object_changed_after_opening_is_refused_not_mixed(s3) -> None:
    s3.upload_dir(FIXTURES / "megatron", "corpus/")
    store = open_token_store(s3.url("corpus/web_text_document"))
    s3.put("corpus/web_text_document.bin", bytes(46))
    with pytest.raises(DatasetError, match=r"web_text_document\.bin"):
        store.read(0, 1)


def test_a_truncated_bin_on_s3_is_named(s3) -> None:
    s3.put("t/web.idx", (FIXTURES / "megatron/web_text_document.idx").read_bytes())
    s3.put("t/web.bin", (FIXTURES / "megatron/web_text_document.bin").read_bytes()[:-2])
    with pytest.raises(DatasetError, match=r"s3://.*/t/web\.bin must be 46 bytes as s3://.*/t/web\.idx says, got 44"):
        open_token_store(s3.url("t/web"))


def test_datatrove_on_s3_with_metadata_and_loss(s3) -> None:
    s3.upload_dir(FIXTURES / "datatrove", "dt/")
    url = s3.url("dt/wide")
    assert detect_format(url) == "datatrove"
    before = gets()
    store = open_token_store(url)
    assert gets() - before == 2  # metadata and index; not the tokens, not the loss mask
    assert store.tokenizer == "zephon/demo" and str(store.dtype) == "uint32"
    assert store.token_counts().tolist() == COUNTS
    local = open_token_store(str(FIXTURES / "datatrove/wide"))
    before = gets()
    docs = store.read(1, 4)
    assert gets() - before == 2  # the tokens and the loss mask of those documents
    assert docs.to_lists() == DOCS[1:4]
    assert docs.loss_mask.tolist() == local.read(1, 4).loss_mask.tolist()
    single = open_token_store(s3.url("dt/00000_unshuffled.ds"))
    assert single.read(0, 6).to_lists() == DOCS


@pytest.mark.parametrize(
    ("name", "options"), [("mds/int32", {}), ("litdata/tokens", {}), ("olmo", {"dtype": "uint32"})]
)
def test_other_formats_read_the_same_from_s3(s3, name: str, options: dict) -> None:
    s3.upload_dir(FIXTURES / name, f"{name}/")
    url = s3.url(f"{name}/part-0-00000.npy" if name == "olmo" else f"{name}/")
    assert open_token_store(url, **options).read(0, 6).to_lists() == DOCS


def test_megatron_on_the_hub_by_range_requests(hub_server) -> None:
    files = {
        f"tokenized/web{ext}": (FIXTURES / f"megatron/split_sentence{ext}").read_bytes() for ext in (".idx", ".bin")
    }
    commit = hub_server.add_dataset("org/tokens", files, lfs=list(files))
    url = "hf://datasets/org/tokens/tokenized/web"
    assert detect_format(url) == "megatron"
    store = open_token_store(url)
    assert store.path == f"hf://datasets/org/tokens@{commit}/tokenized/web"
    hub_server.clear_requests()
    assert store.read(1, 3).to_lists() == DOCS[1:3]
    ranged = [r for r in hub_server.requests if "/resolve/" in r.path]
    assert [r.range for r in ranged] == ["bytes=16-51"]
    assert len(ranged) == 1
    assert store.token_counts().tolist() == COUNTS


def test_a_hub_path_must_name_a_file_inside_a_dataset(hub_server) -> None:
    with pytest.raises(DatasetError, match=r"must be named hf://datasets/ORG/NAME\[@REVISION\]/PATH"):
        open_token_store("hf://org/tokens")


def test_megatron_and_datatrove_on_every_cloud(bucket) -> None:
    """The same readers on s3://, gs:// and az:// (each cloud's server; skipped, with the reason, where absent)."""
    bucket.upload_dir(FIXTURES / "megatron", "m/")
    bucket.upload_dir(FIXTURES / "datatrove", "d/")
    assert open_token_store(bucket.url("m/split_sentence")).read(0, 6).to_lists() == DOCS
    store = open_token_store(bucket.url("d/00000_unshuffled.ds"))
    assert store.tokenizer == "zephon/demo" and store.read(2, 6).to_lists() == DOCS[2:]
