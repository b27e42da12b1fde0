"""plan.json written and read through one schema: ``Manifest.from_json(text).to_json()`` gives back the bytes the
planner wrote (key order, null and left-out keys, float forms, ``indent=2``, the final newline, the integrity
record last) for every pinned plan kind and for continued plans, whose phases follow the lineage's keys."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
from test_plan_pins import KINDS, _source

from zephon.errors import PlanWarning
from zephon.plan.manifest import Manifest, read_manifest
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, Phase


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: str) -> dict[str, Path]:
    """One plan of each pinned kind, and two continuations of the exact wrap plan (one with a new phase)."""
    out = {}
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    with pytest.MonkeyPatch.context() as mp:
        for kind, (kw, algorithm) in sorted(KINDS.items()):
            root = tmp_path_factory.mktemp(kind)
            mp.setenv("ZEPHON_CACHE_DIR", str(root / "cache"))
            pack = PackSpec(max_length=33, algorithm=algorithm) if algorithm else None
            out[kind] = _source(root, **kw).plan(root / "plan", tokenize=tok, pack=pack)
        root = tmp_path_factory.mktemp("continued")
        mp.setenv("ZEPHON_CACHE_DIR", str(root / "cache"))
        kw, _ = KINDS["exact_wrap"]
        pack = PackSpec(max_length=33)
        source = _source(root, **kw)
        parent = source.plan(root / "parent", tokenize=tok, pack=pack)
        later = Phase(start=0.75, mixture=MixtureSpec({"books": 1.0}))
        for name, phases in (("continued", []), ("continued_phases", [later])):
            mixture = MixtureSpec({"web": 0.3, "books": 0.7})
            child = dataclasses.replace(source, mixture=mixture, epochs=None, num_documents=150, phases=phases)
            with warnings.catch_warnings():  # books is read 6 times: a repetition warning, in plan.json too
                warnings.simplefilter("ignore", PlanWarning)
                out[name] = child.plan(
                    root / name, tokenize=tok, pack=pack, continue_from=parent, at_step=2, global_batch=2
                )
    return out


@pytest.mark.parametrize("kind", [*sorted(KINDS), "continued", "continued_phases"])
def test_plan_json_reads_back_and_writes_out_byte_for_byte(plans: dict[str, Path], kind: str) -> None:
    path = plans[kind] / "plan.json"
    text = path.read_text(encoding="utf-8")
    manifest = Manifest.from_json(text, path)
    assert manifest == read_manifest(plans[kind])
    assert manifest.to_json() == text
    assert list(json.loads(text))[-1] == "integrity"
    assert (manifest.lineage is not None) == kind.startswith("continued")


def test_a_continued_plan_writes_its_phases_beside_its_lineage(plans: dict[str, Path]) -> None:
    keys = list(read_manifest(plans["continued_phases"]).to_json_dict())
    assert keys[-3:] == ["phases", "lineage", "integrity"]
    assert [p.segment for p in read_manifest(plans["continued_phases"]).phases] == [0, 1, 1]
    assert list(read_manifest(plans["phases"]).to_json_dict())[-2:] == ["phases", "integrity"]


def test_a_manifest_without_a_record_is_sealed_last(plans: dict[str, Path]) -> None:
    manifest = read_manifest(plans["exact_best_fit"])
    unsealed = dataclasses.replace(manifest, integrity=None)
    assert "integrity" not in unsealed.to_json_dict()
    assert unsealed.sealed(plans["exact_best_fit"]).to_json() == manifest.to_json()


def test_unknown_keys_are_dropped_and_left_out_keys_stay_out(plans: dict[str, Path], tmp_path: Path) -> None:
    data = json.loads((plans["samples"] / "plan.json").read_text(encoding="utf-8"))
    written = Manifest.from_json(json.dumps(data | {"added_later": 1}), tmp_path / "plan.json").to_json_dict()
    assert written == data
    for absent in ("phases", "sources", "selected_copies", "lineage", "batch"):
        assert absent not in written
