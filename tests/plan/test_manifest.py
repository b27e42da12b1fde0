"""plan.json read at one door: ``read_manifest`` returns a typed, validated ``Manifest``.

Every plan kind the planner writes reads back field for field; a damaged or edited plan.json is one clear
line naming the file and the key; plans without the optional keys read with the defaults they always had.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from test_plan_pins import KINDS, _source

from zephon.errors import PlanFormatError
from zephon.executor.plan_reader import PlanBundle
from zephon.inspection.sql import run_sql
from zephon.inspection.steps import resolve_layout
from zephon.plan.manifest import Manifest, parse_manifest, read_manifest
from zephon.specs import PackSpec, TokenizeSpec


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: str) -> dict[str, Path]:
    """One plan of each pinned kind: samples, tokens, exact_wrap, exact_best_fit, phases."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        for kind, (kw, algorithm) in sorted(KINDS.items()):
            root = tmp_path_factory.mktemp(kind)
            mp.setenv("ZEPHON_CACHE_DIR", str(root / "cache"))
            pack = PackSpec(max_length=33, algorithm=algorithm) if algorithm else None
            tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
            out[kind] = _source(root, **kw).plan(root / "plan", tokenize=tok, pack=pack)
    return out


def _raw(plan: Path) -> dict[str, Any]:
    return json.loads((plan / "plan.json").read_text(encoding="utf-8"))


def _same(typed: Any, raw: Any, where: str) -> None:
    """Every key of ``raw`` is a field of ``typed`` holding the same value (typed fields absent from ``raw``
    must be unset)."""
    if dataclasses.is_dataclass(typed):
        assert isinstance(raw, dict), where
        names = {f.name for f in dataclasses.fields(typed)}
        assert set(raw) <= names, f"{where}: keys {set(raw) - names} written but not read"
        for name in names:
            if name in raw:
                _same(getattr(typed, name), raw[name], f"{where}.{name}")
            else:
                assert getattr(typed, name) in (None, ()), f"{where}.{name} is not in plan.json"
    elif isinstance(typed, tuple):
        assert isinstance(raw, list) and len(raw) == len(typed), where
        for i, (t, r) in enumerate(zip(typed, raw, strict=True)):
            _same(t, r, f"{where}[{i}]")
    elif isinstance(typed, Mapping):
        assert isinstance(raw, dict) and list(typed) == list(raw), where
        for name, value in typed.items():
            _same(value, raw[name], f"{where}.{name}")
    else:
        assert typed == raw and type(typed) is type(raw), f"{where}: {typed!r} != {raw!r}"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_key_the_planner_writes_reads_back_typed(plans: dict[str, Path], kind: str) -> None:
    plan = plans[kind]
    manifest = read_manifest(plan)
    _same(manifest, _raw(plan), "plan.json")
    assert parse_manifest(_raw(plan), plan / "plan.json") == manifest
    assert manifest.exact == kind.startswith("exact")
    assert manifest.lanes is None  # estimated plans: one lane per row of the run's global batch
    assert (manifest.files.bins is not None) == (kind == "exact_best_fit")
    assert len(manifest.phases) == (2 if kind == "phases" else 0)
    assert manifest.resolved_phases[0].first_position == 0
    assert manifest.resolved_phases[-1].end_position == manifest.totals.documents
    if manifest.exact:
        assert manifest.exact_packing().algorithm == KINDS[kind][1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        manifest.kind = "exact"  # type: ignore[misc]


def test_a_plan_without_phases_resolves_to_one_phase_spanning_it(plans: dict[str, Path]) -> None:
    manifest = read_manifest(plans["tokens"])
    (phase,) = manifest.resolved_phases
    assert (phase.index, phase.first_position, phase.end_position) == (0, 0, manifest.totals.documents)
    assert dict(phase.weights) == {d.name: d.weight for d in manifest.datasets}
    assert dict(phase.planned_documents) == {d.name: d.planned_documents for d in manifest.datasets}
    assert phase.planned_tokens is not None
    assert dict(phase.planned_tokens) == {d.name: d.planned_tokens for d in manifest.datasets}
    assert read_manifest(plans["samples"]).resolved_phases[0].planned_tokens is None


def _edit(plans: dict[str, Path], kind: str, tmp_path: Path, change: Callable[[dict[str, Any]], object]) -> Path:
    """A copy of the ``kind`` plan whose plan.json went through ``change`` (which edits it in place, or
    returns a replacement JSON value)."""
    plan = tmp_path / "plan"
    shutil.copytree(plans[kind], plan)
    data = _raw(plan)
    replaced = change(data)
    (plan / "plan.json").write_text(json.dumps(data if replaced is None else replaced), encoding="utf-8")
    return plan


def _drop(*keys: str | int) -> Callable[[dict[str, Any]], None]:
    def change(m: dict[str, Any]) -> None:
        *path, last = keys
        for key in path:
            m = m[key]  # type: ignore[index]
        del m[last]  # type: ignore[arg-type]

    return change


def _set(*keys: str | int, value: object) -> Callable[[dict[str, Any]], None]:
    def change(m: dict[str, Any]) -> None:
        *path, last = keys
        for key in path:
            m = m[key]  # type: ignore[index]
        m[last] = value  # type: ignore[index]

    return change


DAMAGED: dict[str, tuple[str, Callable[[dict[str, Any]], object], str]] = {
    "no config_hash": ("samples", _drop("config_hash"), r"must have the key 'config_hash', got none"),
    "no totals.documents": ("samples", _drop("totals", "documents"), r"must have the key 'totals.documents', got none"),
    "documents as text": (
        "samples",
        _set("totals", "documents", value="55"),
        r"key 'totals.documents' must be an integer ≥ 0, got '55'",
    ),
    "weight as text": (
        "tokens",
        _set("datasets", 1, "weight", value="0.4"),
        r"key 'datasets\[1\].weight' must be a number, got '0.4'",
    ),
    "dataset not an object": ("samples", lambda m: m["datasets"].append(3), r"key 'datasets\[2\]' must be an object"),
    "datasets not a list": ("samples", _set("datasets", value={}), r"key 'datasets' must be a list of objects"),
    "unknown kind": (
        "samples",
        _set("kind", value="precise"),
        r"key 'kind' must be one of 'estimated', 'exact', got 'precise'",
    ),
    "zero lanes": ("samples", _set("lanes", value=0), r"key 'lanes' must be an integer ≥ 1, got 0"),
    "lanes a flag": ("samples", _set("lanes", value=True), r"key 'lanes' must be an integer ≥ 1, got True"),
    "no samples files": (
        "samples",
        _set("files", "samples", value=[]),
        r"key 'files.samples' must be a non-empty list of file names, got \[\]",
    ),
    "unknown packing": (
        "exact_wrap",
        _set("packing", "algorithm", value="first_fit"),
        r"key 'packing.algorithm' must be one of 'wrap', 'best_fit', 'homogeneous', got 'first_fit'",
    ),
    "exact without packing": (
        "exact_wrap",
        _set("packing", value=None),
        r"must have the key 'packing' \(an exact plan's\), got none",
    ),
    "exact without tokens": (
        "exact_wrap",
        _drop("totals", "tokens"),
        r"must have the key 'totals.tokens' \(an exact plan's\), got none",
    ),
    "best fit without bins": (
        "exact_best_fit",
        _drop("files", "bins"),
        r"must have the key 'files.bins' \(a best-fit plan's\), got none",
    ),
    "add_bos as text": (
        "exact_wrap",
        _set("tokenizer", "add_bos", value="yes"),
        r"key 'tokenizer.add_bos' must be true or false, got 'yes'",
    ),
    "phase weight as text": (
        "phases",
        _set("phases", 1, "weights", "web", value="1/5"),
        r"key 'phases\[1\].weights.web' must be a number, got '1/5'",
    ),
    "tokens without share": (
        "tokens",
        _drop("datasets", 0, "planned_token_share"),
        r"must have the key 'datasets\[0\].planned_token_share' \(with planned_tokens\), got none",
    ),
    "unknown format version": ("samples", _set("format_version", value=3), r"plan format version must be 2, got 3"),
    "no format version": ("samples", _drop("format_version"), r"plan format version must be 2, got None"),
    "not an object": ("samples", lambda m: [m], r"plan format version must be 2, got None"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_plan_json_is_one_line_naming_the_file_and_the_key(
    plans: dict[str, Path], tmp_path: Path, case: str
) -> None:
    kind, change, message = DAMAGED[case]
    plan = _edit(plans, kind, tmp_path, change)
    with pytest.raises(PlanFormatError, match=message) as caught:
        read_manifest(plan)
    text = str(caught.value)
    assert "\n" not in text and str(plan / "plan.json") in text and " — " in text


def test_plan_json_that_is_not_json_names_the_file(plans: dict[str, Path], tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(plans["samples"], plan)
    (plan / "plan.json").write_text('{"format_version": 2,', encoding="utf-8")
    with pytest.raises(PlanFormatError, match=rf"^{plan / 'plan.json'} must be valid JSON, got .* — rewrite the plan"):
        read_manifest(plan)


#: Keys an older (or hand-written) plan may lack, top level and per dataset.
OPTIONAL = ("kind", "lanes", "phases", "shuffle", "mixture", "tokenizer", "token_estimation", "packing", "budget")
OPTIONAL_TOO = ("on_exhaustion", "zephon_version", "seed", "config", "batch", "integrity")


def _old_style(m: dict[str, Any]) -> None:
    for key in (*OPTIONAL, *OPTIONAL_TOO):
        m.pop(key, None)
    m["files"].pop("shards")
    for entry in m["datasets"]:
        for key in ("first_shard_id", "epochs_started", "passes_completed"):
            entry.pop(key)


def test_a_plan_without_the_optional_keys_reads_with_the_old_defaults(plans: dict[str, Path], tmp_path: Path) -> None:
    plan = _edit(plans, "phases", tmp_path, _old_style)
    manifest = read_manifest(plan)
    assert (manifest.kind, manifest.exact, manifest.lanes, manifest.phases) == ("estimated", False, None, ())
    assert (manifest.packing, manifest.tokenizer, manifest.token_estimation, manifest.budget) == (None,) * 4
    assert (manifest.mixture.unit, manifest.shuffle.window_shards, manifest.files.shards) == (
        "samples",
        1,
        "shards.parquet",
    )
    assert (dict(manifest.config), manifest.batch, manifest.datasets[0].first_shard_id) == ({}, None, None)
    (phase,) = manifest.resolved_phases
    assert (phase.first_position, phase.end_position) == (0, manifest.totals.documents)
    # The readers run on it as before: lanes per row of the global batch, one phase, the default shards file.
    assert PlanBundle(plan).manifest.lanes is None
    assert resolve_layout(manifest).packing == "document"
    assert run_sql(plan, "SELECT count(*) FROM phases").rows == [(len(manifest.datasets),)]


def test_null_optional_keys_read_as_absent_ones(plans: dict[str, Path], tmp_path: Path) -> None:
    nulls = dict.fromkeys(("kind", "lanes", "phases", "shuffle", "mixture", "config", "batch"))
    manifest = read_manifest(_edit(plans, "samples", tmp_path, lambda m: m.update(nulls)))
    assert (manifest.kind, manifest.lanes, manifest.phases, manifest.shuffle.window_shards) == (
        "estimated",
        None,
        (),
        1,
    )
    assert (manifest.mixture.unit, dict(manifest.config), manifest.batch) == ("samples", {}, None)


def test_an_exact_plan_has_no_lanes_and_unknown_keys_are_ignored(plans: dict[str, Path], tmp_path: Path) -> None:
    manifest = read_manifest(_edit(plans, "exact_wrap", tmp_path, lambda m: m.update(lanes=4, added_later={"x": 1})))
    assert manifest.lanes is None and not hasattr(manifest, "added_later")


def test_a_dataset_named_like_a_parameter_reads(plans: dict[str, Path], tmp_path: Path) -> None:
    def rename(m: dict[str, Any]) -> None:
        m["mixture"]["weights"] = {"self": 0.6, "values": 0.4}

    manifest = read_manifest(_edit(plans, "samples", tmp_path, rename))
    assert dict(manifest.mixture.weights) == {"self": 0.6, "values": 0.4}


def test_an_estimated_plan_has_no_exact_packing(plans: dict[str, Path]) -> None:
    manifest: Manifest = read_manifest(plans["samples"])
    with pytest.raises(PlanFormatError, match=r"must have packing \(an exact plan\), got a plan of kind 'estimated'"):
        manifest.exact_packing()
