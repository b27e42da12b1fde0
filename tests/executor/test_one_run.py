"""One run, opened once: a pipeline opens its plan bundle and builds its encoder once per process, whatever it is
asked (``num_steps``, ``load_state_dict``, ``state_dict``, iterating), with the same batches as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_parquet_dataset

import zephon.executor.runner as runner_module
import zephon.run as run_module
from zephon import Pipeline
from zephon.executor.plan_reader import PlanBundle
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


@pytest.fixture
def plan(tmp_path: Path) -> Path:
    web = write_parquet_dataset(tmp_path, "web", [30, 25])
    code = write_parquet_dataset(tmp_path, "code", [20])
    ws = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web)), Dataset.from_path("code", str(code))],
        mixture=MixtureSpec({"web": 0.6, "code": 0.4}),
        seed=3,
    )
    return ws.plan(tmp_path / "plan")


def pipe(plan: Path, tokenizer_dir: str) -> Pipeline:
    return (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=33).batch(microbatch_size=2)
    )


@pytest.mark.parametrize("kind", ["estimated", "exact"])
def test_a_resumed_run_opens_the_bundle_once_and_builds_one_encoder(
    kind: str, tmp_path: Path, tokenizer_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    web = write_parquet_dataset(tmp_path / "data", "web", [30, 25])
    ws = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web))],
        mixture=MixtureSpec({"web": 1.0}),
        seed=3,
        exact_tokens=kind == "exact",
        num_tokens=1500,
        token_estimation=TokenEstimation(calibration_samples=16),
    )
    plan = ws.plan(tmp_path / kind, tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=PackSpec(max_length=33))
    whole = [b.tokens.tobytes() for b in pipe(plan, tokenizer_dir)]
    first = pipe(plan, tokenizer_dir)
    it = iter(first)
    head = [next(it).tokens.tobytes() for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))

    opened, built = [], []
    real_init, real_make = PlanBundle.__init__, run_module.make_encoder

    def counted_init(self, plan_dir):  # type: ignore[no-untyped-def]
        opened.append(plan_dir)
        real_init(self, plan_dir)

    def counted_make(*args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(args)
        return real_make(*args, **kwargs)

    monkeypatch.setattr(PlanBundle, "__init__", counted_init)  # wherever a bundle is opened
    monkeypatch.setattr(run_module, "make_encoder", counted_make)
    monkeypatch.setattr(runner_module, "make_encoder", counted_make)
    resumed = pipe(plan, tokenizer_dir)
    steps = resumed.num_steps()
    resumed.load_state_dict(state)
    rest = [b.tokens.tobytes() for b in resumed]
    resumed.state_dict()
    assert (len(opened), len(built)) == (1, 1)
    assert head + rest == whole and steps >= 1


def test_a_pipeline_with_other_tokenize_settings_builds_its_own_encoder(
    plan: Path, tokenizer_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundle is shared by the pipelines derived from one another; an encoder only by the same settings."""
    built = []
    real_make = run_module.make_encoder
    monkeypatch.setattr(run_module, "make_encoder", lambda *a, **k: built.append(a) or real_make(*a, **k))
    base = pipe(plan, tokenizer_dir)
    base.num_steps()
    same = base.batch(microbatch_size=4)
    same.num_steps()
    other = base.tokenize(tokenizer_id=tokenizer_dir, add_bos=False)
    other.num_steps()
    assert len(built) == 2
    assert same._opened is not None and same._opened.plan is base._opened.plan  # type: ignore[union-attr]


def test_the_pipeline_holds_one_settings_object_checked_whichever_step_set_it(plan: Path, tokenizer_dir: str) -> None:
    from zephon.errors import ConfigError
    from zephon.executor.settings import ExecutorSpec

    bare = Pipeline.from_plan(plan)
    with pytest.raises(ConfigError, match=r"^Pipeline must have .* got none for tokenize, pack_flat, batch — add"):
        bare.executor_spec()
    p = pipe(plan, tokenizer_dir).options(read_chunk=7, dp_rank=1, dp_size=2, provenance_dir=plan.parent / "log")
    spec = p.options(tokenizer_threads=1).executor_spec()
    assert isinstance(spec, ExecutorSpec) and spec.read_chunk == 7 and spec.rank() == (1, 2)
    assert spec.provenance_dir == str(plan.parent / "log") and spec.tokenizer_threads == 1
    assert p.executor_spec().tokenizer_threads is None  # a builder step returns a new pipeline
    for bad, message in [
        ({"read_chunk": 0}, r"^read_chunk must be an integer ≥ 1, got 0$"),
        ({"tokenizer_threads": 2.5}, r"^tokenizer_threads must be an integer ≥ 1 or None, got 2.5$"),
        ({"dp_rank": 1}, r"^dp_rank and dp_size must be given together, got dp_rank=1, dp_size=None — pass both$"),
        ({"dp_rank": 2, "dp_size": 2}, r"^dp_rank must be in \[0, dp_size\) with dp_size ≥ 1, got rank 2 of 2 — give each rank a dp_rank below "
         r"dp_size ≥ 1$"),
        ({"on_bad_document": "drop"}, r"^on_bad_document must be \"raise\" or \"skip\", got 'drop'$"),
        ({"io_options": "fast"}, r"^io_options must be zephon.io.StoreOptions, got str$"),
    ]:
        with pytest.raises(ConfigError, match=message):
            bare.options(**bad)
