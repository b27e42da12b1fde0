"""Token stores in plans and runs (issue #27): exact counts from the index, ids read by range, mixed with raw text."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer, models, pre_tokenizers

from zephon import Pipeline, merge_states
from zephon.cli import cli
from zephon.config_file import load_work_source
from zephon.errors import ConfigError, DatasetError, ZephonWarning
from zephon.inspection.log_check import check_log
from zephon.io import Dataset
from zephon.plan.manifest_parts import STORES_ONLY
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

FIXTURES = Path(__file__).parents[1] / "fixtures" / "token_stores"
WEB = FIXTURES / "megatron" / "web_text_document"
#: The fixtures' documents (tests/fixtures/token_stores/make_fixtures.py: BOS 1, EOS 2).
DOCS = [[1, 17, 23, 2], [1, 5, 2], [1, 300, 301, 302, 303, 2], [1, 2], [1, 40000, 7, 9, 2], [1, 65000, 2]]
WORDS = ["alpha", "beta", "gamma", "delta"]


def write_megatron(prefix: Path, docs: list[list[int]], dtype: str = "uint16") -> Path:
    """A Megatron-Core ``.idx``/``.bin`` pair of ``docs`` (one sequence a document), per its documented layout."""
    code = {"uint8": 1, "int32": 4, "uint16": 8}[dtype]
    ids = [np.asarray(d, dtype=dtype) for d in docs]
    lengths = np.array([len(d) for d in ids], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]) * np.dtype(dtype).itemsize
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(docs), len(docs) + 1)
    body = lengths.tobytes() + pointers.astype(np.int64).tobytes() + np.arange(len(docs) + 1, dtype=np.int64).tobytes()
    prefix.with_suffix(".idx").write_bytes(head + body)
    prefix.with_suffix(".bin").write_bytes(b"".join(d.tobytes() for d in ids))
    return prefix


@pytest.fixture(scope="module")
def wide_tokenizer(tmp_path_factory) -> str:
    """A word-level tokenizer of 70,000 ids (``<s>`` 1, ``</s>`` 2: the fixtures' BOS and EOS), so the fixtures'
    ids are all in its vocabulary."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: 3 + i for i, w in enumerate(WORDS)}}
    vocab.update({f"t{i}": i for i in range(len(vocab), 70_000)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = tmp_path_factory.mktemp("wide_tokenizer")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "bos_token": "<s>"}))
    return str(out)


@pytest.fixture
def prose(tmp_path: Path) -> tuple[Path, list[str]]:
    texts = ["alpha beta", "gamma", "delta alpha beta gamma", "beta beta"]
    (tmp_path / "prose").mkdir()
    pq.write_table(pa.table({"text": texts}), tmp_path / "prose" / "a.parquet")
    return tmp_path / "prose", texts


def mixed(*datasets: Dataset, weights: list[float], **kw) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=list(datasets), mixture=MixtureSpec(dict(zip([d.name for d in datasets], weights, strict=True))), **kw
    )


def test_from_path_detects_a_megatron_prefix_and_keeps_raw_paths_raw(prose) -> None:
    web = Dataset.from_path("web", WEB, tokenizer="wide")
    assert web.token_store is not None and web.token_store.fmt is None and web.files == ()
    assert web.pinned == str(WEB.resolve()) and web.token_store.tokenizer == "wide"
    assert Dataset.from_path("web", WEB, fmt="mmap").token_store.fmt == "megatron"  # an alias
    raw = Dataset.from_path("prose", prose[0])
    assert raw.token_store is None and len(raw.files) == 1
    assert Dataset.from_path("prose", prose[0], fmt="parquet").token_store is None  # parquet without tokens_field
    with pytest.raises(ConfigError, match=r"dataset 'prose': tokenizer=.* must describe a token store, got raw text"):
        Dataset.from_path("prose", prose[0], tokenizer="x")
    with pytest.raises(ConfigError, match=r"fmt must be one of megatron, .* got 'tar'"):
        Dataset.from_path("web", WEB, fmt="tar")
    # a selection is kept for the plan, which evaluates it on a Parquet/JSONL store's columns and refuses it on a
    # store of ids only (tests/planner/test_token_store_selection.py)
    assert Dataset.from_path("web", WEB, where="x > 1").selection is not None


def test_a_plan_of_token_stores_only_never_tokenizes(tmp_path: Path) -> None:
    """Counts come from the .idx: the tokenizer named here does not exist, and the plan is made anyway (without
    the tokenizer's identity, which it could not load: tests/planner/test_token_store_identity.py)."""
    source = mixed(Dataset.from_path("web", WEB), weights=[1.0], seed=3, exact_tokens=True)
    with pytest.warns(ZephonWarning, match="no-such-tokenizer' its ids were made with must load"):
        plan = source.plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=str(tmp_path / "no-such-tokenizer")),
                           pack=PackSpec(max_length=8))  # fmt: skip
    manifest = json.loads((plan / "plan.json").read_text())
    assert manifest["tokenizer"]["fingerprint"] == STORES_ONLY
    (entry,) = manifest["datasets"]
    assert entry["token_store"]["fmt"] == "megatron" and entry["rows"] == 6
    assert entry["token_store"]["identity"] is None
    shards = pq.read_table(plan / "shards.parquet").to_pylist()
    assert [(s["uri"], s["format"], s["rows"], s["bytes"]) for s in shards] == [
        (str(WEB.resolve()) + ".bin", "tokens:megatron", 6, 46)
    ]
    assert shards[0]["fingerprint"].startswith("store:")  # a local part: its counts and a sample of its bytes
    samples = pq.read_table(plan / "samples.parquet").to_pylist()
    assert sorted(s["row"] for s in samples) == list(range(6))
    assert [s["tokens"] for s in samples] == [len(DOCS[s["row"]]) for s in samples]
    assert manifest["totals"]["tokens"] == 23


def test_a_mixed_exact_plan_yields_the_stores_ids_and_the_encoded_text_token_for_token(
    tmp_path: Path, prose, wide_tokenizer: str
) -> None:
    path, texts = prose
    source = mixed(Dataset.from_path("web", WEB), Dataset.from_path("prose", path), weights=[0.5, 0.5], seed=1,
                   exact_tokens=True)  # fmt: skip
    plan = source.plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=wide_tokenizer), pack=PackSpec(max_length=8))
    vocab = json.loads(Path(wide_tokenizer, "tokenizer.json").read_text())["model"]["vocab"]
    stream: list[int] = []
    for s in pq.read_table(plan / "samples.parquet").to_pylist():
        # a store's document as stored (it already ends in EOS); a text encoded, then EOS added (no BOS: WordLevel)
        doc = DOCS[s["row"]] if s["dataset_id"] == 0 else [vocab[w] for w in texts[s["row"]].split()] + [2]
        assert s["tokens"] == len(doc)
        stream += doc
    rows = [
        row.tolist()
        for b in Pipeline.from_plan(plan)
        .tokenize(tokenizer_id=wide_tokenizer)
        .pack_flat(max_length=8)
        .batch(microbatch_size=2)
        for row, n in zip(b.tokens, b.lengths, strict=True)
        for row in [row[:n]]
    ]
    assert [t for row in rows for t in row] == stream


def test_the_run_refuses_ids_beyond_its_tokenizers_vocabulary_naming_file_and_document(
    tmp_path: Path, tokenizer_dir: str
) -> None:
    """The demo tokenizer has 4,096 ids; the fixture's document 4 holds 40000."""
    source = mixed(Dataset.from_path("web", WEB), weights=[1.0], seed=3, exact_tokens=True)
    plan = source.plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=PackSpec(max_length=64))
    pipe = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=64).batch(microbatch_size=1)
    )
    with pytest.raises(DatasetError, match=r"web_text_document\.bin must be < the tokenizer's vocabulary of 4096, "
                       r"got (40000|65000) in document [45]"):  # fmt: skip
        list(pipe)


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize(
    "rewritten", [[[5, 6, 0], [7, 8, 0]], [[9, 9, 0], [9, 0]]], ids=["other counts", "same counts, other ids"]
)
def test_a_store_rewritten_since_planning_is_refused(tmp_path: Path, tokenizer_dir: str, rewritten, exact) -> None:
    """Ids rewritten with the same counts (the store tokenized again, a file copied over it) were read silently:
    the fingerprint held the index only. A local part's now holds a sample of its bytes too."""
    (tmp_path / "store").mkdir()
    store = write_megatron(tmp_path / "store" / "web", [[5, 6, 0], [7, 0]])
    source = mixed(Dataset.from_path("web", store), weights=[1.0], seed=3, exact_tokens=exact)
    plan = source.plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=PackSpec(max_length=4))
    write_megatron(store, rewritten)
    pipe = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=4).batch(microbatch_size=1)
    )
    with pytest.raises(
        DatasetError, match=r"web\.bin changed since planning: its documents, counts, dtype or content differ "
        r"from the plan's \(2 documents now, 2 planned\) — restore the store or re-plan$"
    ):  # fmt: skip
        list(pipe)


def test_a_config_file_names_a_token_store(tmp_path: Path, prose) -> None:
    config = tmp_path / "plan.yaml"
    config.write_text(
        "seed: 1\ndatasets:\n"
        f"  - {{name: web, path: {WEB}, fmt: megatron, tokenizer: wide}}\n"
        f"  - {{name: prose, path: {prose[0]}}}\n"
        "mixture: {web: 0.5, prose: 0.5}\n"
    )
    source = load_work_source(config)
    assert source.datasets[0].token_store.fmt == "megatron" and source.datasets[0].token_store.tokenizer == "wide"
    assert source.datasets[1].token_store is None
    config.write_text(config.read_text().replace("fmt: megatron", "eos_token_id: -1"))
    with pytest.raises(ConfigError, match=r"datasets\[0\]\.eos_token_id"):
        load_work_source(config)


def test_zephon_count_and_show_read_a_token_store_by_its_index_and_ids(
    tmp_path: Path, prose, wide_tokenizer: str, monkeypatch
) -> None:
    """Both refused any CONFIG or plan with a token store ("a reader without the plan's stores"): count takes a
    store's counts from its index, show previews its documents' ids — and, over local shards, makes no cache."""
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "plan.yaml"
    config.write_text(
        f"seed: 1\nexact_tokens: true\ntokenizer: {{id: {wide_tokenizer}}}\npacking: {{max_length: 8}}\n"
        f"datasets:\n  - {{name: web, path: {WEB}, fmt: megatron}}\n  - {{name: prose, path: {prose[0]}}}\n"
        "mixture: {web: 0.5, prose: 0.5}\n"
    )
    counted = CliRunner().invoke(cli, ["count", str(config), "--workers", "1", "--no-progress"])
    assert counted.exit_code == 0, counted.output
    prose_tokens = sum(len(t.split()) + 1 for t in prose[1])  # WordLevel words and EOS
    assert counted.output.splitlines() == [
        f"counted 1 shard (0 cached), 1 token store part read from their indexes: {23 + prose_tokens} tokens",
        "  web    documents 6  tokens 23  (token store: its index)",
        f"  prose  documents 4  tokens {prose_tokens}",
    ]
    planned = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "p"), "--workers", "1"])
    assert planned.exit_code == 0, planned.output
    shutil.rmtree(tmp_path / "cache")
    shown = CliRunner().invoke(cli, ["show", str(tmp_path / "p"), "-s", "0", "-b", "2"])
    assert shown.exit_code == 0, shown.output
    samples = pq.read_table(tmp_path / "p" / "samples.parquet").to_pylist()
    first_store = next(s for s in samples if s["dataset_id"] == 0)
    assert "ids " + " ".join(map(str, DOCS[first_store["row"]])) in shown.output
    assert not (tmp_path / "cache").exists()  # a read-only command over local shards creates nothing


# ---------------------------------------------------------------------------------------------------------
# Runs: estimated (samples and tokens) and exact plans over a store and raw text; elastic dp, resume, audit
# ---------------------------------------------------------------------------------------------------------

GLOBAL, LENGTH = 8, 17


@pytest.fixture(scope="module")
def plans(tmp_path_factory, tokenizer_dir: str) -> dict[str, Path]:
    from zephon.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("store_runs")
    write_demo_dataset(root / "data")
    rng = np.random.default_rng(5)
    docs = [[*rng.integers(3, 4000, size=int(n)).tolist(), 0] for n in rng.integers(1, 40, size=120)]  # EOS 0
    (root / "store").mkdir()
    store = Dataset.from_path("web", write_megatron(root / "store" / "web", docs))
    prose = Dataset.from_path("prose", str(root / "data" / "demo" / "prose-*.parquet"))
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    te = TokenEstimation(calibration_samples=64)
    return {
        "samples": mixed(store, prose, weights=[0.5, 0.5], seed=2, num_documents=300).plan(root / "samples"),
        "tokens": mixed(store, prose, weights=[0.5, 0.5], seed=2, num_tokens=6000, token_estimation=te).plan(
            root / "tokens", tokenize=tok
        ),
        "exact": mixed(store, prose, weights=[0.5, 0.5], seed=2, num_documents=300, exact_tokens=True).plan(
            root / "exact", tokenize=tok, pack=PackSpec(max_length=LENGTH)
        ),
    }


def pipeline(plan: Path, tokenizer_dir: str, rank: int, size: int, log: Path | None = None) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .options(dp_rank=rank, dp_size=size, provenance_dir=str(log) if log else None)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=LENGTH)
        .batch(microbatch_size=GLOBAL // size, global_batch_size=GLOBAL)
    )


def steps_of(batches) -> dict[int, dict[int, bytes]]:
    rows: dict[int, dict[int, bytes]] = {}
    for b in batches:
        for i, j in enumerate(b.sequences.tolist()):
            rows.setdefault(b.step, {})[j] = b.tokens[i, : b.lengths[i]].tobytes()
    return rows


def digests(rows: dict[int, dict[int, bytes]]) -> list[str]:
    return [hashlib.sha256(b"".join(r[j] for j in sorted(r))).hexdigest() for _, r in sorted(rows.items())]


@pytest.mark.parametrize("kind", ["samples", "tokens", "exact"])
def test_dp_1_2_and_4_give_the_same_global_batches(plans, tokenizer_dir, kind) -> None:
    reference = steps_of(pipeline(plans[kind], tokenizer_dir, 0, 1))
    assert len(reference) > 3
    for size in (2, 4):
        rows: dict[int, dict[int, bytes]] = {}
        for rank in range(size):
            for step, got in steps_of(pipeline(plans[kind], tokenizer_dir, rank, size)).items():
                rows.setdefault(step, {}).update(got)
        assert digests(rows) == digests(reference), size


def test_the_stores_documents_are_packed_as_stored(plans, tokenizer_dir) -> None:
    """Every id of the store's documents reaches the batches of the samples plan (none doubled or dropped)."""
    manifest = json.loads((plans["samples"] / "plan.json").read_text())
    assert manifest["datasets"][0]["token_store"]["fmt"] == "megatron"
    from zephon.executor.token_stores import open_token_store

    store = open_token_store(manifest["datasets"][0]["pinned"])
    planned = [s for s in pq.read_table(plans["samples"] / "samples.parquet").to_pylist() if s["dataset_id"] == 0]
    want = sum(len(store.read(s["row"], s["row"] + 1)[0]) for s in planned)
    batches = list(pipeline(plans["samples"], tokenizer_dir, 0, 1))
    assert sum(int(b.lengths.sum()) for b in batches) > want > 0


@pytest.mark.parametrize("kind", ["tokens", "exact"])
def test_a_run_resumed_from_its_state_dict_continues_where_it_stopped(plans, tokenizer_dir, kind) -> None:
    reference = digests(steps_of(pipeline(plans[kind], tokenizer_dir, 0, 1)))
    before: dict[int, dict[int, bytes]] = {}
    states = []
    for rank in range(2):
        p = pipeline(plans[kind], tokenizer_dir, rank, 2)
        taken = []
        for b in p:
            taken.append(b)
            if b.step == 1:
                break
        for step, got in steps_of(taken).items():
            before.setdefault(step, {}).update(got)
        states.append(p.state_dict())
    merged = json.loads(json.dumps(merge_states(states)))
    p = pipeline(plans[kind], tokenizer_dir, 0, 1)
    p.load_state_dict(merged)
    assert digests({**before, **steps_of(p)}) == reference


@pytest.mark.parametrize("kind", ["tokens", "exact"])
def test_the_provenance_log_of_a_store_run_passes_the_audit(plans, tokenizer_dir, tmp_path, kind) -> None:
    for rank in range(2):
        list(pipeline(plans[kind], tokenizer_dir, rank, 2, log=tmp_path / "log"))
    assert check_log(plans[kind], tmp_path / "log").ok
    result = CliRunner().invoke(cli, ["audit", str(plans[kind]), "--log", str(tmp_path / "log")])
    assert result.exit_code == 0 and result.output.splitlines()[-1] == "ok: the log matches the plan", result.output


def test_a_store_moved_after_planning_is_named(tmp_path: Path, tokenizer_dir: str) -> None:
    (tmp_path / "store").mkdir()
    store = write_megatron(tmp_path / "store" / "web", [[5, 6, 0], [7, 0]])
    plan = mixed(Dataset.from_path("web", store), weights=[1.0], seed=3, num_documents=2).plan(tmp_path / "p")
    shutil.rmtree(tmp_path / "store")
    pipe = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=4).batch(microbatch_size=1)
    )
    with pytest.raises(DatasetError, match=r"token store path .*web' must name a file"):
        list(pipe)


@pytest.mark.parametrize("exact", [False, True])
def test_a_datatrove_loss_mask_reaches_the_batches_and_their_labels(
    tmp_path: Path, prose, wide_tokenizer: str, exact: bool
) -> None:
    """datatrove's ``.ds.loss`` (tokens that carry no loss: here each document's first 0, 1 or 2) was read by
    ``TokenStore.read`` but not by the runs, which trained on every token. Now the plan records it, the store's ids
    carry it, texts beside it train on every token, and labels of masked tokens are -100."""
    path, texts = prose
    source = mixed(
        Dataset.from_path("sft", FIXTURES / "datatrove" / "wide"),
        Dataset.from_path("prose", path),
        weights=[0.5, 0.5],
        seed=1,
        exact_tokens=exact,
        lanes=None if exact else 1,
    )
    with pytest.warns(ZephonWarning, match="zephon/demo' its ids were made with must load"):
        plan = source.plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=wide_tokenizer),
                           pack=PackSpec(max_length=8))  # fmt: skip
    assert json.loads((plan / "plan.json").read_text())["datasets"][0]["token_store"]["loss_mask"] is True
    vocab = json.loads(Path(wide_tokenizer, "tokenizer.json").read_text())["model"]["vocab"]
    ids: list[int] = []
    mask: list[bool] = []
    for s in pq.read_table(plan / "samples.parquet").to_pylist():
        if s["dataset_id"] == 0:
            doc = DOCS[s["row"]]
            ids += doc
            mask += [k >= s["row"] % 3 for k in range(len(doc))]
        else:
            doc = [vocab[w] for w in texts[s["row"]].split()] + [2]
            ids += doc
            mask += [True] * len(doc)
    got_ids: list[int] = []
    got_mask: list[bool] = []
    pipe = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=wide_tokenizer).pack_flat(max_length=8).batch(microbatch_size=2)
    )
    in_workers = [t["labels"].numpy() for t in pipe.dataloader(num_workers=2 if exact else 1)]  # the same labels
    for k, b in enumerate(pipe):
        assert b.loss_mask is not None
        labels = b.to_training()["labels"].numpy()
        assert np.array_equal(labels, in_workers[k])
        for r, n in enumerate(b.lengths.tolist()):
            got_ids += b.tokens[r, :n].tolist()
            got_mask += b.loss_mask[r, :n].tolist()
            for j in range(n - 1):  # label j predicts token j + 1: ignored where that token carries no loss
                if not b.loss_mask[r, j + 1]:
                    assert labels[r, j] == -100
                elif not b.doc_start[r, j + 1]:
                    assert labels[r, j] == b.tokens[r, j + 1]
    assert got_ids == ids and got_mask == mask and not all(mask)


def test_a_loss_mask_the_plan_does_not_record_is_refused(tmp_path: Path, wide_tokenizer: str) -> None:
    """A ``.ds.loss`` added after planning (or a plan made before runs applied masks) would be left out of the
    run's loss without a word: the run refuses it in one line naming the store."""
    store = tmp_path / "sft"
    shutil.copytree(FIXTURES / "datatrove" / "wide", store)
    (store / "00000_wide.ds.loss").rename(tmp_path / "loss")
    source = mixed(Dataset.from_path("sft", store), weights=[1.0], seed=1, exact_tokens=True)
    with pytest.warns(ZephonWarning):
        plan = source.plan(
            tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=wide_tokenizer), pack=PackSpec(max_length=8)
        )
    assert "loss_mask" not in json.loads((plan / "plan.json").read_text())["datasets"][0]["token_store"]
    (tmp_path / "loss").rename(store / "00000_wide.ds.loss")
    pipe = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=wide_tokenizer).pack_flat(max_length=8).batch(microbatch_size=2)
    )
    with pytest.raises(DatasetError, match=r"^dataset 'sft': token store .* keeps a loss mask \(.ds.loss\), which the plan "
                       r"does not record — .* re-plan"):  # fmt: skip
        next(iter(pipe))


def test_a_plan_made_before_content_samples_checks_the_index_alone(tmp_path: Path, tokenizer_dir: str) -> None:
    """Shards planned with ``index:`` fingerprints (before parts' bytes were sampled) still open: their index is
    compared, their bytes are not — so such a plan keeps running, and a rewrite with other counts is refused."""
    from zephon.executor.plan_reader import PlanBundle
    from zephon.executor.token_stores.shards import PlanStores, part_fingerprint
    from zephon.plan.records import shard_refs

    (tmp_path / "store").mkdir()
    store = write_megatron(tmp_path / "store" / "web", [[5, 6, 0], [7, 0]])
    source = mixed(Dataset.from_path("web", store), weights=[1.0], seed=3, exact_tokens=True)
    plan = source.plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=PackSpec(max_length=4))
    (ref,) = shard_refs(pq.read_table(plan / "shards.parquet"))
    older = dataclasses.replace(ref, fingerprint=part_fingerprint("megatron", "uint16", np.array([3, 2])))
    assert older.fingerprint.startswith("index:") and ref.fingerprint.startswith("store:")
    write_megatron(store, [[9, 9, 0], [9, 0]])  # same counts
    datasets = PlanBundle(plan).manifest.datasets
    assert PlanStores(datasets).open(older).read(np.array([0, 1])).to_lists() == [[9, 9, 0], [9, 0]]
    with pytest.raises(DatasetError, match="changed since planning"):
        PlanStores(datasets).open(ref)
    write_megatron(store, [[9, 9, 0], [9, 9, 0]])  # other counts
    with pytest.raises(DatasetError, match=r"its documents, counts or dtype differ from the plan's"):
        PlanStores(datasets).open(older)


def test_a_compressed_mds_shard_rewritten_with_the_same_counts_is_refused(tmp_path: Path, wide_tokenizer: str) -> None:
    """A zstd MDS shard is decompressed into memory under the raw shard's name, so its fingerprint held its counts
    alone and other ids of the same counts were read silently; it now samples the decompressed bytes."""
    import zstandard

    store = tmp_path / "zstd"
    shutil.copytree(FIXTURES / "mds" / "zstd", store)
    source = mixed(Dataset.from_path("web", store, tokenizer=wide_tokenizer), weights=[1.0], seed=3, exact_tokens=True)
    plan = source.plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=wide_tokenizer), pack=PackSpec(max_length=8))
    assert pq.read_table(plan / "shards.parquet")["fingerprint"][0].as_py().startswith("store:")

    def pipe() -> Pipeline:
        return (
            Pipeline.from_plan(plan)
            .tokenize(tokenizer_id=wide_tokenizer)
            .pack_flat(max_length=8)
            .batch(microbatch_size=1)
        )

    assert sorted(int(t) for b in pipe() for t in b.tokens[0][: b.lengths[0]]) == sorted(t for d in DOCS for t in d)
    zipped = store / "shard.00000.mds.zstd"
    raw = zstandard.ZstdDecompressor().decompress(zipped.read_bytes())
    ids = np.asarray([300, 301], np.uint16).tobytes()
    assert raw.count(ids) == 1
    zipped.write_bytes(zstandard.ZstdCompressor().compress(raw.replace(ids, ids[::-1])))  # same counts, other ids
    index = json.loads((store / "index.json").read_text())
    index["shards"][0]["zip_data"]["bytes"] = zipped.stat().st_size  # as a writer would record it
    (store / "index.json").write_text(json.dumps(index))
    with pytest.raises(DatasetError, match=r"shard\.00000\.mds \(from shard\.00000\.mds\.zstd\) changed since planning: its documents, counts, dtype "
                       r"or content differ"):  # fmt: skip
        list(pipe())


def test_a_store_damaged_since_planning_is_named_with_its_dataset(tmp_path: Path, tokenizer_dir: str) -> None:
    """A .bin truncated after planning was refused at run time without the dataset's name (planning has it)."""
    (tmp_path / "store").mkdir()
    store = write_megatron(tmp_path / "store" / "web", [[5, 6, 0], [7, 0]])
    source = mixed(Dataset.from_path("web", store), weights=[1.0], seed=3, exact_tokens=True)
    plan = source.plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=PackSpec(max_length=4))
    store.with_suffix(".bin").write_bytes(store.with_suffix(".bin").read_bytes()[:-2])
    pipe = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=4).batch(microbatch_size=1)
    )
    with pytest.raises(DatasetError, match=r"^dataset 'web': .*web\.bin must be 10 bytes as .*web\.idx says, got 8 "):
        list(pipe)


def test_a_store_truncated_on_disk_while_read_is_refused_not_a_sigbus(
    tmp_path: Path, tokenizer_dir: str, monkeypatch
) -> None:
    """A local part is read through a memory map: a file truncated in place mid-run (``cp`` over it) made the next
    read past its new end a SIGBUS, killing the process without a word (exit 135)."""
    monkeypatch.setenv("ZEPHON_READ_AHEAD", "off")  # each chunk read when the batches need it
    (tmp_path / "store").mkdir()
    store = write_megatron(tmp_path / "store" / "web", [[1 + (i % 7), 2 + (i % 5), 0] for i in range(3000)])
    source = mixed(Dataset.from_path("web", store), weights=[1.0], seed=3)
    plan = source.plan(tmp_path / "p")
    pipe = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=16).batch(microbatch_size=2)
    )
    batches = iter(pipe.options(read_chunk=16))
    next(batches)
    with open(store.with_suffix(".bin"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(DatasetError, match=r"web\.bin must keep its size of 18000 bytes while read, got 100 — it was "
                       r"truncated on disk while the run read it; restore it, then resume from the run's last checkpoint$"):  # fmt: skip
        list(batches)
