"""A sidecar whose key is not unique is one line with the count and the smallest repeated key, in every plan kind:
samples, token and exact plans, a cost mixture whose cost reads the sidecar, and a continuation whose new config
brings the sidecar; in one join and partitioned (the join's own counts find it, then one aggregate names it).
Ray's partitions: tests/planner/test_ray_steps.py; at 10^8 rows: benchmarks/bench_selection.py
(``--modes sidecar-duplicates``, docs/performance.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from zephon.cli import cli
from zephon.errors import DatasetError
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """web/: 2 shards of 4 rows (id web-S-R, text, n); good/: a sidecar of one row per id; dup/: the same ids with
    web-0-1 on 2 rows and web-1-0 on 3 (2 keys repeated, 5 rows in all)."""
    root = tmp_path_factory.mktemp("sidecar-keys")
    (root / "web").mkdir()
    ids = [f"web-{s}-{r}" for s in range(2) for r in range(4)]
    for s in range(2):
        part = ids[4 * s : 4 * s + 4]
        text = [f"document {k} " + "word " * (3 + i) for i, k in enumerate(part)]
        pq.write_table(pa.table({"id": part, "text": text, "n": [3, 5, 2, 7]}), root / "web" / f"part-{s}.parquet")
    for name, keys in (("good", ids), ("dup", [*ids, "web-0-1", "web-1-0", "web-1-0"])):
        (root / name).mkdir()
        quality = [0.1 * (i % 10) for i in range(len(keys))]
        pq.write_table(pa.table({"id": keys, "quality": quality}), root / name / "q.parquet")
    return root


def _source(corpus: Path, sidecar: str, kind: str) -> StaticMixtureWorkSource:
    cost = {"cost": "n + 10 * quality"} if kind == "cost" else {}
    web = Dataset.from_path("web", corpus / "web", metadata=corpus / sidecar, key="id", where="quality >= 0", **cost)
    budget: dict = {"num_documents": 12}
    if kind in ("tokens", "exact", "continuation"):
        budget = {"num_tokens": 300, "token_estimation": TokenEstimation(calibration_samples=8)}
    if kind == "cost":
        budget = {"mixture_unit": "cost", "num_cost": 100}
    exact = kind in ("exact", "continuation")
    return StaticMixtureWorkSource(
        datasets=[web], mixture=MixtureSpec({"web": 1.0}), seed=3, exact_tokens=exact, **budget
    )


def _line(corpus: Path) -> str:
    return (
        r"^dataset 'web': sidecar key 'id' must be unique, got 2 rows for 'web-0-1' \(2 keys on more than one row, "
        rf"5 rows in all\) in {re.escape(str(corpus / 'dup'))} — keep one row per key \(e\.g\. deduplicate the "
        r"sidecar\) and re-plan$"
    )


@pytest.mark.parametrize("partitions", ["1", "3"])
@pytest.mark.parametrize("kind", ["samples", "tokens", "exact", "cost", "continuation"])
def test_a_repeated_sidecar_key_is_one_line_with_its_count_in_every_plan_kind(
    corpus, tokenizer_dir, tmp_path, monkeypatch, kind, partitions
) -> None:
    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", partitions)
    tokenize = TokenizeSpec(tokenizer_id=tokenizer_dir) if kind != "cost" else None
    pack = PackSpec(max_length=17) if kind in ("exact", "continuation") else None
    options: dict = {}
    if kind == "continuation":  # the parent read the good sidecar; the new config brings the repeated one
        parent = _source(corpus, "good", kind).plan(tmp_path / "parent", tokenize=tokenize, pack=pack)
        options = {"continue_from": parent, "at_step": 1, "global_batch": 2}
    assert _source(corpus, "good", kind).plan(tmp_path / "fine", tokenize=tokenize, pack=pack).exists()
    with pytest.raises(DatasetError, match=_line(corpus)):
        _source(corpus, "dup", kind).plan(tmp_path / "plan", tokenize=tokenize, pack=pack, **options)
    assert not (tmp_path / "plan").exists()


def test_zephon_plan_prints_the_one_line_and_exits_1(corpus, tmp_path) -> None:
    config = tmp_path / "plan.yaml"
    config.write_text(
        f"seed: 3\ndatasets:\n  - {{name: web, path: {corpus / 'web'}, metadata: {corpus / 'dup'}, key: id}}\n"
        "mixture: {web: 1}\n"
    )
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "plan")])
    assert result.exit_code == 1 and re.fullmatch("zephon: error: " + _line(corpus)[1:-1] + "\n", result.output), (
        result.output
    )
