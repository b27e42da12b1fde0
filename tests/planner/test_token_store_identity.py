"""A token store's tokenizer identity (issue #27, item 4): recorded at plan time, checked before a run's first batch.

The identity is the vocabulary size and the EOS, BOS and PAD ids of the tokenizer the ids were made with
(``zephon.executor.token_stores.identity``); a run whose tokenizer differs in any of them is refused in one line.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from zephon import Pipeline
from zephon.demo import demo_tokenizer_path
from zephon.errors import ConfigError, ZephonWarning
from zephon.io import Dataset
from zephon.plan.manifest_parts import STORES_ONLY
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

WEB = Path(__file__).parents[1] / "fixtures" / "token_stores" / "megatron" / "web_text_document"
#: web_text_document's documents (BOS 1, EOS 2), all below 70,000.
DOCS = [[1, 17, 23, 2], [1, 5, 2], [1, 300, 301, 302, 303, 2], [1, 2], [1, 40000, 7, 9, 2], [1, 65000, 2]]


def make_tokenizer(root: Path, *, size: int = 70_000, eos: str = "</s>", pad: str | None = None) -> str:
    """A word-level tokenizer of ``size`` ids: ``<unk>`` 0, ``<s>`` 1 (BOS), ``</s>`` 2, then ``t3``, ``t4``, ..."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    root.mkdir(parents=True)
    tok.save(str(root / "tokenizer.json"))
    config = {"eos_token": eos, "bos_token": "<s>"} | ({"pad_token": pad} if pad else {})
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return str(root)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("identity_tokenizers")
    return {
        "wide": make_tokenizer(root / "wide"),
        "wide_copy": make_tokenizer(root / "wide_copy"),  # another path, the same identity
        "other_eos": make_tokenizer(root / "other_eos", eos="<unk>"),
        "other_pad": make_tokenizer(root / "other_pad", pad="<unk>"),
        "larger": make_tokenizer(root / "larger", size=70_001),
    }


def source(*, exact: bool = True, **dataset) -> StaticMixtureWorkSource:
    web = Dataset.from_path("web", WEB, **dataset)
    return StaticMixtureWorkSource(datasets=[web], mixture=MixtureSpec({"web": 1.0}), seed=3, num_documents=6,
                                   exact_tokens=exact)  # fmt: skip


def run(plan: Path, tokenizer: str) -> list[int]:
    pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer).pack_flat(max_length=8).batch(microbatch_size=1)
    return [t for b in pipe for row, n in zip(b.tokens, b.lengths, strict=True) for t in row[:n].tolist()]


def identity(plan: Path) -> dict | None:
    return json.loads((plan / "plan.json").read_text())["datasets"][0]["token_store"]["identity"]


def test_the_plan_records_the_declared_tokenizers_vocabulary_and_special_ids(tmp_path, tokenizers) -> None:
    plan = source(tokenizer=tokenizers["wide"]).plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=tokenizers[
        "wide_copy"]), pack=PackSpec(max_length=8))  # fmt: skip
    assert identity(plan) == {
        "tokenizer": tokenizers["wide"], "vocab_size": 70_000, "eos_token_id": 2, "bos_token_id": 1, "pad_token_id": 2
    }  # fmt: skip
    assert json.loads((plan / "plan.json").read_text())["tokenizer"]["fingerprint"] == STORES_ONLY
    # a tokenizer of the same identity under another path runs, token for token
    stream = [t for d in sorted(DOCS, key=len) for t in d]
    assert sorted(run(plan, tokenizers["wide_copy"])) == sorted(stream)


@pytest.mark.parametrize(
    ("run_with", "differs"),
    [
        ("larger", r"vocab_size 70001 \(store 70000\)"),
        ("other_eos", r"eos_token_id 0 \(store 2\), pad_token_id 0 \(store 2\)"),
        ("other_pad", r"pad_token_id 0 \(store 2\)"),
    ],
)
def test_a_run_with_another_vocabulary_or_special_ids_is_refused_before_its_first_batch(
    tmp_path, tokenizers, run_with, differs
) -> None:
    plan = source(tokenizer=tokenizers["wide"]).plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=tokenizers[
        "wide"]), pack=PackSpec(max_length=8))  # fmt: skip
    pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizers[run_with]).pack_flat(max_length=8).batch(
        microbatch_size=1
    )
    with pytest.raises(ConfigError) as caught:
        pipe.num_steps()  # before any batch: the check runs as the run opens
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"dataset 'web': token store {str(WEB.resolve())!r} must run with the tokenizer its ids")
    assert f"got {tokenizers[run_with]!r} whose " in message and f"from {tokenizers['wide']!r}'s" in message
    assert re.search(differs + " differ", message), message
    assert message.endswith("or tokenize the store again with this tokenizer")


def test_a_store_only_plan_records_the_plans_tokenizer_and_the_run_checks_it(tmp_path, tokenizers) -> None:
    """No ``tokenizer=``: the plan's ``tokenize`` names it; nothing is tokenized (fingerprint ``token-stores-only``)."""
    plan = source().plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=tokenizers["wide"]),
                         pack=PackSpec(max_length=8))  # fmt: skip
    assert identity(plan)["vocab_size"] == 70_000
    assert json.loads((plan / "plan.json").read_text())["tokenizer"]["fingerprint"] == STORES_ONLY
    assert len(run(plan, tokenizers["wide"])) == sum(map(len, DOCS))
    with pytest.raises(ConfigError, match=r"whose vocab_size 4096 \(store 70000\), eos_token_id 0 \(store 2\), "
                       r"bos_token_id 0 \(store 1\), pad_token_id 0 \(store 2\) differ"):  # fmt: skip
        run(plan, demo_tokenizer_path())


def test_planning_a_store_with_another_tokenizer_than_it_names_is_refused(tmp_path, tokenizers) -> None:
    with pytest.raises(ConfigError, match=r"dataset 'web': token store .* must be planned with the tokenizer its ids "
                       r"were made with, got tokenize\(tokenizer_id='.*other_eos'\) whose eos_token_id 0 \(store 2\)"):
        source(tokenizer=tokenizers["wide"]).plan(tmp_path / "p", tokenize=TokenizeSpec(
            tokenizer_id=tokenizers["other_eos"]), pack=PackSpec(max_length=8))  # fmt: skip


def test_a_tokenizer_that_does_not_load_leaves_the_identity_unrecorded_with_a_warning(tmp_path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = source(tokenizer="org/not-in-the-cache", exact=False).plan(tmp_path / "p")
    assert identity(plan) is None
    (warning,) = [w for w in caught if issubclass(w.category, ZephonWarning)]
    assert str(warning.message).startswith(
        "dataset 'web': the tokenizer 'org/not-in-the-cache' its ids were made with must load for the plan to record"
    )
