"""Checkpoint state of a pipeline: small, JSON-serializable, versioned, and refusing to guess.

A state records where training is in the plan — completed global steps, microbatches into the current
step, and for estimated plans each packing lane's cursor ``(position, skip)`` — plus what it is valid
for: the plan's ``config_hash``, the tokenizer fingerprint, field, ``max_length``, packing algorithm,
global batch and lanes. An estimated plan's state also carries the run's length (``num_steps``, with the
``drop_last`` it was computed for), so a resumed run does not measure it again (``zephon.executor.pack.run_length``)
— with user operators, also what they made of the documents it was measured on (``outputs``), which a resume
measures again and compares (``zephon.executor.operators.outputs_digest``).
Loading a state made for anything else is refused with a message naming what
differs. Resuming seeks (row-group statistics, lane cursors); it never replays the plan.

One rank knows the cursors of its own lanes only. Under ``torch.distributed``, ``Pipeline.state_dict()``
gathers every rank's cursors, so any one rank's state resumes any data-parallel size; without it,
``zephon.merge_states`` combines the ranks' states. A state can move to another data-parallel size only at
a step boundary (``microbatch == 0``); mid-step, only with the same dp and microbatch size (``check_mid_step``).

Example (estimated plan, 4 lanes, after 10 steps of 8 sequences)::

    {"version": 1, "plan": "9f2c…", "tokenizer": "51ab…", "field": "text", "max_length": 2049,
     "algorithm": "wrap", "global_batch": 8, "lanes": 4, "dp_size": 2, "microbatch_size": 4, "step": 10,
     "microbatch": 0, "lane_cursors": {"0": [812, 0], "1": [815, 344], "2": [818, 1200], "3": [809, 0]}}
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from zephon.checks import is_int
from zephon.errors import STATE_FIX, ConfigError, PlanWarning
from zephon.executor.geometry import Geometry
from zephon.executor.operators import differing_outputs
from zephon.executor.operators import names as operator_names
from zephon.plan.manifest import Manifest

STATE_VERSION = 1
#: The one key under which a framework's checkpoint holds the state as JSON text (``zephon.integrations.state_text``).
PACKED_KEY = "zephon_state"
_IDENTITY = ("plan", "tokenizer", "field", "max_length", "algorithm", "global_batch", "lanes", "operators")


def rank_state(
    identity: dict[str, Any],
    *,
    dp_size: int,
    microbatch_size: int,
    step: int,
    microbatch: int,
    lane_cursors: dict[str, list[int]],
    **extra: Any,
) -> dict[str, Any]:
    """A rank's state, the one place its keys are written (text and record runs alike): the version, what it is
    valid for (``identity``), where the rank stands, then the run kind's ``extra`` keys."""
    return {
        "version": STATE_VERSION,
        **identity,
        "dp_size": dp_size,
        "microbatch_size": microbatch_size,
        "step": step,
        "microbatch": microbatch,
        "lane_cursors": lane_cursors,
        **extra,
    }


def check_resume(
    state: dict[str, Any], expected: dict[str, Any], manifest: Manifest, geometry: Geometry
) -> tuple[int, int]:
    """A state a runner starts from, checked as every runner checks it — its fields (``check_state_fields``), its
    identity against ``expected`` with the plan it may name (its own, or a continued plan's ancestor:
    ``state_plan``), and a mid-step state's geometry (``check_mid_step``); its ``(step, microbatch)``."""
    check_state_fields(state, documents=manifest.totals.documents)
    check_state(state, expected | {"plan": state_plan(state, manifest)})
    check_mid_step(state, geometry)  # the same dp and microbatch size, microbatch < A
    return int(state["step"]), int(state["microbatch"])


def check_mid_step(state: dict[str, Any], geometry: Geometry) -> None:
    """A state taken mid-step (``microbatch`` > 0) resumes only where a step is cut into the same microbatches:
    the same dp size and microbatch size (a state written before states recorded ``microbatch_size`` is taken at
    its word), and its ``microbatch`` below the ``accumulation`` microbatches a step has (a larger one was a run
    that never ended: its step never closed). At a step boundary every dp and microbatch size resumes."""
    microbatch = int(state["microbatch"])
    if not microbatch:
        return
    dp_size, microbatch_size, accumulation = geometry.dp_size, geometry.microbatch, geometry.accumulation
    mb = state.get("microbatch_size")
    if state.get("dp_size") != dp_size or (mb is not None and mb != microbatch_size):
        raise ConfigError(
            f"a state taken mid-step (microbatch {microbatch}) must resume with the same dp_size "
            f"{state.get('dp_size')} and microbatch size {mb if mb is not None else '(not recorded)'}, got dp_size "
            f"{dp_size}, microbatch size {microbatch_size} — resume as it was saved, or checkpoint at a step "
            "boundary to change them"
        )
    if microbatch >= accumulation:
        raise _bad("'microbatch'", f"< the {accumulation} microbatches of a step on each rank here", microbatch)


def check_state(state: dict[str, Any], expected: dict[str, Any]) -> None:
    """Refuse a state of another version, plan, tokenizer or packing; name every difference."""
    _check_version(state)
    names = {"plan": "plan (config_hash)", "tokenizer": "tokenizer fingerprint"}
    differences = [
        f"operators {operator_names(state.get(k))} (this pipeline: {operator_names(expected.get(k))})"
        if k == "operators"
        else f"{names.get(k, k)} {state.get(k)!r} (this pipeline: {expected.get(k)!r})"
        for k in _IDENTITY
        if state.get(k) != expected.get(k)  # "operators" is absent without user operators
    ]
    if differences:
        raise ConfigError(
            "pipeline state must come from the same plan, tokenizer and packing, got a different "
            + "; ".join(differences)
            + " — resume with the pipeline that saved it, or start fresh"
        )


def refuse_packed(state: object) -> None:
    """Refuse, naming the fix, the packed form a framework's checkpoint holds (``{PACKED_KEY: JSON text}``, what
    ``DataCheckpoint.state_dict()`` returns) where the state itself belongs: it was blamed on a missing version."""
    if isinstance(state, dict) and isinstance(state.get(PACKED_KEY), str) and "version" not in state:
        raise ConfigError(
            f"pipeline state must be the dict state_dict() returned, got the packed form {{{PACKED_KEY!r}: JSON "
            f"text}} a framework's checkpoint holds — pass json.loads(saved[{PACKED_KEY!r}]), or load it through "
            "the integration that saved it (DataCheckpoint(...).load_state_dict)"
        )


def _check_version(state: object) -> None:
    refuse_packed(state)
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        got = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise ConfigError(
            f"pipeline state version must be {STATE_VERSION}, got {got!r} — use a state saved by this Zephon version"
        )


_FIX = STATE_FIX


def _bad(field: str, want: str, got: object) -> ConfigError:
    return ConfigError(f"pipeline state {field} must be {want}, got {got!r} — {_FIX}")


def _count(state: dict[str, Any], key: str, least: int, *, optional: bool = False) -> int | None:
    """``state[key]``: an integer ≥ ``least`` (a bool is not one); ``optional``: absent or null is None."""
    if key not in state or (optional and state[key] is None):
        if optional:
            return None
        raise ConfigError(f"pipeline state must hold {key!r}, got keys {sorted(state)} — {_FIX}")
    value = state[key]
    if not is_int(value) or value < least:
        raise _bad(f"{key!r}", f"an integer ≥ {least}", value)
    return value


def check_state_fields(state: dict[str, Any], *, documents: int | None = None) -> None:
    """Refuse a hand-edited or truncated state in one line naming the field: ``step``, ``microbatch``,
    ``global_batch``, ``dp_size`` and ``lanes`` integers in range, ``lane_cursors`` a lane → ``[position, skip]``
    map of lanes below ``lanes`` and positions ≤ the plan's ``documents``, ``num_steps`` ``{"steps", "drop_last"}``
    with ``step`` ≤ ``steps``. Called with :func:`check_state` wherever a state is loaded."""
    _check_version(state)
    step = _count(state, "step", 0)
    _count(state, "microbatch", 0)
    batch = _count(state, "global_batch", 1)
    size = _count(state, "dp_size", 1, optional=True)
    if size is not None and batch is not None and batch % size:  # a rank-independent state's dp size splits G
        raise _bad("'dp_size'", f"a divisor of its global batch of {batch} sequences", size)
    _count(state, "microbatch_size", 1, optional=True)
    lanes = _count(state, "lanes", 1, optional=True)
    if "lane_cursors" not in state:
        raise ConfigError(f"pipeline state must hold 'lane_cursors', got keys {sorted(state)} — {_FIX}")
    cursors = state["lane_cursors"]
    if not isinstance(cursors, dict):
        raise _bad("'lane_cursors'", "an object of lane → [position, skip]", cursors)
    for lane, cursor in cursors.items():
        if not (isinstance(lane, str) and lane.isdigit() and (lanes is None or int(lane) < lanes)):
            raise _bad("'lane_cursors' key", f"a lane number below lanes {lanes}" if lanes else "a lane number", lane)
        if not (isinstance(cursor, list | tuple) and len(cursor) == 2 and all(is_int(v) and v >= 0 for v in cursor)):
            raise _bad(f"'lane_cursors' lane {lane}", "[position, skip] of two integers ≥ 0", cursor)
        if documents is not None and cursor[0] > documents:
            raise _bad(f"'lane_cursors' lane {lane} position", f"≤ the plan's {documents} documents", cursor[0])
    known = state.get("num_steps")
    if known is not None:
        if not (isinstance(known, dict) and isinstance(known.get("drop_last"), bool)):
            raise _bad("'num_steps'", '{"steps": N, "drop_last": true|false}', known)
        steps = _count(known, "steps", 0)
        assert steps is not None and step is not None
        if step > steps:
            raise _bad("'step'", f"≤ its run's num_steps {steps}", step)


def check_resumed_step(step: int, steps: int) -> None:
    """A state's ``step`` past the end of the run (``steps``, known once the run's length is)."""
    if step > steps:
        raise ConfigError(
            f"pipeline state 'step' must be ≤ this run's {steps} steps, got {step} — {_FIX} (a state of another run?)"
        )


def state_plan(state: dict[str, Any], manifest: Manifest) -> str:
    """The plan (config_hash) a state must name to resume on ``manifest``'s plan: its own, or — for a continued
    plan (plan.json ``lineage``) — an ancestor's, when the state is at a step the two plans share and for the
    global batch the branch was made for. A state of an ancestor from after the branch is refused here."""
    own = manifest.config_hash
    lineage = manifest.lineage
    got = state.get("plan") if isinstance(state, dict) else None
    ancestors = {lineage.parent.config_hash, *(s.config_hash for s in lineage.segments)} if lineage else set()
    if lineage is None or got == own or got not in ancestors:
        return own
    step, microbatch = int(state.get("step", 0)), int(state.get("microbatch", 0))
    if state.get("global_batch") != lineage.branch.global_batch:
        raise ConfigError(
            f"a state of the parent plan {str(got)[:12]} must have the branch's global batch "
            f"{lineage.branch.global_batch} to resume on the continued plan {own[:12]}, got "
            f"{state.get('global_batch')!r} — resume with the global batch the continuation was made for"
        )
    if not lineage.accepts(str(got), step, microbatch):
        raise ConfigError(
            f"a state of the parent plan {str(got)[:12]} must be from a step the plans share (≤ the branch step "
            f"{lineage.branch.step}), got step {step} microbatch {microbatch} — resume from a checkpoint taken at or "
            "before the branch, or continue the parent at a later step"
        )
    return str(got)


def check_run_batch(manifest: Manifest, global_batch: int, *, records: bool = False) -> None:
    """A continued plan (plan.json ``lineage``) run with a global batch other than its branch's.

    An estimated plan with one lane per row of the global batch (``lanes`` unset) packs other lanes at another
    global batch, so its kept steps would no longer be its parent's (the branch position is where the branch's
    lanes stood): refused. Exact plans and plans with fixed lanes yield the same rows at any global batch, only
    grouped into other steps: a ``PlanWarning`` says where the branch falls. So do record runs (``records``): their
    steps are runs of plan positions or planned rows, whatever the global batch."""
    lineage = manifest.lineage
    if lineage is None or global_batch == lineage.branch.global_batch:
        return
    g, step = lineage.branch.global_batch, lineage.branch.step
    if not manifest.exact and manifest.lanes is None and not records:
        raise ConfigError(
            f"the global batch must be {g} for the continued plan {manifest.config_hash[:12]}, got {global_batch} — "
            f"its kept steps hold what {g} packing lanes (one per row) had read by step {step}; run it with "
            f".batch(global_batch_size={g}), or continue the parent again from a state of a run at {global_batch}"
        )
    warnings.warn(
        f"global batch {global_batch} is not the {g} the continued plan {manifest.config_hash[:12]} was made for: "
        f"the rows are the same, but its lineage counts steps of {g} rows (the branch is row {step * g}, step "
        f"{step * g / global_batch:g} at {global_batch})",
        PlanWarning,
        stacklevel=3,
    )


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Combine the states of all data-parallel ranks (same step) into one that resumes any data-parallel size."""
    if not isinstance(states, list | tuple):
        raise ConfigError(
            f"merge_states needs a list of every rank's state_dict(), got {type(states).__name__} — pass "
            "[state_of_rank_0, state_of_rank_1, ...]"
        )
    if not states:
        raise ConfigError("merge_states needs at least one state, got none — pass every rank's state_dict()")
    odd = next((i for i, state in enumerate(states) if not isinstance(state, dict)), None)
    if odd is not None:
        raise ConfigError(
            f"merge_states needs every rank's state_dict() (a dict each), got {type(states[odd]).__name__} at index "
            f"{odd} — pass the dicts state_dict() returned (json.load a saved one)"
        )
    first = states[0]
    for state in states:
        check_state(state, {k: state.get(k) for k in _IDENTITY})
        check_state_fields(state)
    for other in states[1:]:
        check_state(other, {k: first.get(k) for k in _IDENTITY})
        if (other["step"], other["microbatch"]) != (first["step"], first["microbatch"]):
            raise ConfigError(
                f"states must be taken at the same point, got step {first['step']} microbatch {first['microbatch']} "
                f"and step {other['step']} microbatch {other['microbatch']} — checkpoint all ranks together"
            )
    made = {s["num_steps"].get("outputs") for s in states if isinstance(s.get("num_steps"), dict)} - {None}
    if len(made) > 1:  # the ranks' operators made other documents of the calibration (operators.outputs_digest)
        raise differing_outputs("on another rank (the states merged)")
    cursors: dict[str, list[int]] = {}
    for state in states:
        for lane, cursor in state["lane_cursors"].items():
            if lane in cursors and cursors[lane] != list(cursor):
                raise ConfigError(
                    f"lane {lane} must have one cursor across states, got {cursors[lane]} and {list(cursor)} — "
                    "the states are from different runs"
                )
            cursors[lane] = list(cursor)
    merged = dict(first)
    merged["lane_cursors"] = dict(sorted(cursors.items(), key=lambda kv: int(kv[0])))
    return merged


def gather_states(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` of this rank, with every rank's lane cursors merged in under torch.distributed (a collective:
    every rank calls it together); as it is without. ``Pipeline.state_dict`` and ``PipelineLoader.state_dict``."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, state)
            state = merge_states(gathered)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return state
