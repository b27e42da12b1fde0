"""Token stores on S3 (the moto server) and on the Hub (the test server) planned and run (issue #27).

The bar: a plan over a remote store lays out the same documents as over its local copy, and its run yields the
same batches, id for id — the indexes read by range at plan time, the documents' ids by range at run time. On
the Hub the repository is gated: the token (``HF_TOKEN``, as for raw text) reaches both the planner and the run.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_token_store_identity import make_tokenizer

from zephon import Pipeline
from zephon.errors import HubError
from zephon.io import CacheOptions, Dataset, StoreOptions
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

FIXTURES = Path(__file__).parents[1] / "fixtures" / "token_stores"
#: Each format's store: the fixture's folder and the file (or prefix) inside it that names the store.
STORES = {"megatron": ("megatron", "web_text_document"), "datatrove": ("datatrove/wide", "00000_wide.ds")}
TOKEN = "hf_store_reader"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return make_tokenizer(tmp_path_factory.mktemp("remote_plans") / "tok")


@pytest.fixture
def prose(tmp_path: Path) -> Dataset:
    (tmp_path / "prose").mkdir()
    texts = [" ".join(f"t{i * 7 + j}" for j in range(i % 5 + 1)) for i in range(3, 30)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "prose" / "a.parquet")
    return Dataset.from_path("prose", tmp_path / "prose")


def plan_and_run(path: str, fmt: str, prose: Dataset, tokenizer: str, out: Path) -> tuple[list, list[bytes]]:
    """An exact plan of the store beside raw text, and its run's rows: (planned documents, row bytes)."""
    store = Dataset.from_path("web", path, fmt=fmt)
    source = StaticMixtureWorkSource(datasets=[store, prose], mixture=MixtureSpec({"web": 0.6, "prose": 0.4}), seed=5,
                                     num_documents=40, exact_tokens=True)  # fmt: skip
    tok = TokenizeSpec(tokenizer_id=tokenizer)
    with pytest.warns(UserWarning) if fmt == "datatrove" else _nothing():  # its metadata names 'zephon/demo'
        plan = source.plan(out, tokenize=tok, pack=PackSpec(max_length=8))
    planned = [(s["dataset_id"], s["row"], s["tokens"]) for s in pq.read_table(plan / "samples.parquet").to_pylist()]
    pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer).pack_flat(max_length=8).batch(microbatch_size=2)
    rows = [b.tokens[i, : b.lengths[i]].tobytes() for b in pipe for i in range(len(b.lengths))]
    return planned, rows


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("fmt", sorted(STORES))
def test_a_store_on_s3_plans_and_runs_as_its_local_copy(s3, tmp_path, prose, tokenizer, fmt) -> None:
    folder, name = STORES[fmt]
    s3.upload_dir(FIXTURES / folder, "corpus/")
    local = plan_and_run(str(FIXTURES / folder / name), fmt, prose, tokenizer, tmp_path / "local")
    remote = plan_and_run(s3.url(f"corpus/{name}"), fmt, prose, tokenizer, tmp_path / "remote")
    assert remote == local
    assert len(local[1]) > 10 and {d for d, _, _ in local[0]} == {0, 1}


@pytest.mark.parametrize("fmt", sorted(STORES))
def test_a_store_on_the_hub_plans_and_runs_as_its_local_copy_with_the_token_passed_through(
    hub_server, monkeypatch, tmp_path, prose, tokenizer, fmt
) -> None:
    folder, name = STORES[fmt]
    files = {f"tokenized/{p.name}": p.read_bytes() for p in (FIXTURES / folder).iterdir() if p.is_file()}
    hub_server.add_dataset("org/tokens", files, lfs=list(files))
    hub_server.gate("org/tokens", [TOKEN])
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    local = plan_and_run(str(FIXTURES / folder / name), fmt, prose, tokenizer, tmp_path / "local")
    url = f"hf://datasets/org/tokens/tokenized/{name}"
    remote = plan_and_run(url, fmt, prose, tokenizer, tmp_path / "remote")
    assert remote == local
    # the run reads with the token too: without it the gated repository refuses, naming the fix
    monkeypatch.delenv("HF_TOKEN")
    pipe = Pipeline.from_plan(tmp_path / "remote").tokenize(tokenizer_id=tokenizer).pack_flat(max_length=8)
    with pytest.raises(
        HubError, match=r"must be authorized, got HTTP 401 with no token — run `hf auth login` or set HF_TOKEN"
    ):
        list(pipe.batch(microbatch_size=2))


def test_a_store_on_s3_is_read_by_ranges_even_with_the_shard_cache_on(s3, tmp_path, prose, tokenizer) -> None:
    """The shard cache holds whole shards of raw text; a store's parts are never staged in it."""
    s3.upload_dir(FIXTURES / "megatron", "corpus/")
    _, rows = plan_and_run(s3.url("corpus/web_text_document"), "megatron", prose, tokenizer, tmp_path / "p")
    cache = StoreOptions(cache=CacheOptions(enabled=True, root=str(tmp_path / "cache")), remote_read="cache")
    pipe = Pipeline.from_plan(tmp_path / "p").options(io_options=cache).tokenize(tokenizer_id=tokenizer)
    batches = pipe.pack_flat(max_length=8).batch(microbatch_size=2)
    assert [b.tokens[i, : b.lengths[i]].tobytes() for b in batches for i in range(len(b.lengths))] == rows
    assert not any(p.is_file() and p.suffix in (".bin", ".idx") for p in (tmp_path / "cache").rglob("*"))


def test_a_store_on_s3_rewritten_with_the_same_counts_since_planning_is_refused(s3, tmp_path, prose, tokenizer) -> None:
    """A remote part's fingerprint held its index alone: ids rewritten with the same counts between planning and
    the run (the object put again) were read silently. It holds the object's pin (ETag) now."""
    from zephon.errors import DatasetError

    s3.upload_dir(FIXTURES / "megatron", "corpus/")
    plan_and_run(s3.url("corpus/web_text_document"), "megatron", prose, tokenizer, tmp_path / "p")
    shards = pq.read_table(tmp_path / "p" / "shards.parquet").to_pylist()
    assert next(s for s in shards if s["format"] == "tokens:megatron")["fingerprint"].startswith("store:")
    data = bytearray((FIXTURES / "megatron" / "web_text_document.bin").read_bytes())
    data[2:4] = data[6:8]  # another id where one was: the same counts, other bytes
    s3.put("corpus/web_text_document.bin", bytes(data))
    pipe = Pipeline.from_plan(tmp_path / "p").tokenize(tokenizer_id=tokenizer).pack_flat(max_length=8).batch(
        microbatch_size=2
    )
    with pytest.raises(DatasetError, match=r"web_text_document\.bin changed since planning: its documents, counts, "
                       r"dtype or content differ from the plan's"):  # fmt: skip
        list(pipe)
