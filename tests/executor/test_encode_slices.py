"""Encoding a chunk in slices of bounded size (``zephon.executor.encode.slices``): the same ids as one call,
engine calls bounded in characters however large a chunk is, and the same batches from every plan kind."""

from __future__ import annotations

import numpy as np
import pytest

from zephon import Pipeline
from zephon.demo import write_demo_dataset
from zephon.executor.encode import slices as encode_slices
from zephon.executor.encode.slices import encode_in_slices, slice_bounds
from zephon.executor.encode.text import Encoder
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


def test_slice_bounds_hold_at_most_max_chars_and_a_long_text_alone() -> None:
    assert slice_bounds([5, 5, 5, 20, 1], 10) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert slice_bounds([3, 3, 3], 10) == [(0, 3)]
    assert slice_bounds([], 10) == [(0, 0)]


def test_encoding_in_slices_gives_the_ids_of_one_call(tokenizer_dir: str) -> None:
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    texts = [f"document {i}: " + "word " * (i % 37) for i in range(200)] + [""]
    encoder.encode_flat(texts[:5])  # the first call settles the engine; encode_in_slices leaves that one whole
    whole = encoder.encode_flat(texts)
    sliced = encode_in_slices(encoder, texts, max_chars=300)
    assert np.array_equal(whole.ids, sliced.ids) and np.array_equal(whole.sizes, sliced.sizes)
    assert sliced.ids.dtype == whole.ids.dtype and sliced.sizes.dtype == whole.sizes.dtype


class _Text(str):
    """A ``str`` subclass (what a record converter may hand back): encoded as the plain string."""


def test_slicing_a_chunk_that_fits_or_holds_str_subclasses_gives_the_ids_of_one_call(tokenizer_dir: str) -> None:
    """The fast paths of ``encode_in_slices`` (all plain ``str`` and within ``max_chars``: one call, no
    ``slice_bounds``; anything else: the checks text by text) give the ids and sizes of one call."""
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    texts = [f"doc {i} " + "ab " * (i % 7) for i in range(40)]
    encoder.encode_flat(texts[:3])  # settles the engine
    whole = encoder.encode_flat(texts)
    exact_fit = sum(map(len, texts))
    for max_chars in (exact_fit, exact_fit - 1, 50):
        got = encode_in_slices(encoder, texts, max_chars=max_chars)
        assert got.ids.tolist() == whole.ids.tolist() and got.sizes.tolist() == whole.sizes.tolist()
    mixed = [_Text(t) if i % 3 == 0 else t for i, t in enumerate(texts)]
    got = encode_in_slices(encoder, mixed, max_chars=50)
    assert got.ids.tolist() == whole.ids.tolist() and got.sizes.tolist() == whole.sizes.tolist()


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: str) -> dict[str, object]:
    root = tmp_path_factory.mktemp("slices")
    demo = write_demo_dataset(root / "demo")
    datasets = [Dataset.from_path(n, f"{demo}/{n}-*.parquet") for n in ("prose", "code", "short")]
    mixture = MixtureSpec({"prose": 0.5, "code": 0.3, "short": 0.2})
    kw = {"tokenize": TokenizeSpec(tokenizer_id=tokenizer_dir), "pack": PackSpec(max_length=257)}
    return {
        "samples": StaticMixtureWorkSource(datasets=datasets, mixture=mixture, seed=2, num_documents=600).plan(
            root / "samples"
        ),
        "tokens": StaticMixtureWorkSource(
            datasets=datasets, mixture=mixture, seed=2, token_estimation=TokenEstimation(), num_tokens=60_000
        ).plan(root / "tokens", **kw),
        "exact": StaticMixtureWorkSource(
            datasets=datasets, mixture=mixture, seed=2, token_estimation=TokenEstimation(), num_tokens=60_000,
            exact_tokens=True,
        ).plan(root / "exact", **kw),
    }  # fmt: skip


@pytest.mark.parametrize("kind", ["samples", "tokens", "exact"])
def test_engine_calls_are_bounded_in_characters_and_batches_do_not_change(
    kind: str, plans: dict[str, object], tokenizer_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run() -> list[bytes]:
        pipe = Pipeline.from_plan(plans[kind]).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=257)
        return [b.tokens.tobytes() + b.lengths.tobytes() for b in pipe.options(read_chunk=256).batch(microbatch_size=4)]

    whole = run()
    calls: list[tuple[int, int]] = []  # (characters, longest text) of each engine call once the engine is settled
    original = Encoder.encode_flat

    def spy(self: Encoder, texts: list[str], order=None, *, split: bool = True):
        if self.settled:
            calls.append((sum(map(len, texts)), max(map(len, texts), default=0)))
        return original(self, texts, order, split=split)

    monkeypatch.setattr(Encoder, "encode_flat", spy)
    monkeypatch.setattr(encode_slices, "MAX_CHARS", 2_000)
    assert run() == whole and whole
    assert calls and all(chars <= 2_000 or chars == longest for chars, longest in calls), calls
    assert len(calls) > len(whole) // 8  # chunks of 256 documents were cut into many calls
