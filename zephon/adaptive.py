"""Replayable adaptive mixing: weights decided at run time, every K steps, written into the plan.

``AdaptiveMixing`` runs a pipeline and, every ``every`` global steps, asks ``decide(step)`` for the next
weights (for example from validation losses). It writes them as a new segment of the plan — a continuation
(``zephon.planner.continuation.child``) of the current plan from that step, with the work source's mixture
replaced by the weights — and goes on from the same step on the new plan, with the run's state. The last
plan written (``AdaptiveMixing.plan``) holds every segment: running it with a plain ``Pipeline`` reproduces
every batch of the adaptive run, byte for byte, without calling ``decide`` again.

Invariant: the batches of steps ``< s`` never change when a segment is added at step ``s`` (continuations
keep their parent's first ``s`` steps), so the adaptive run and the replay of its final plan are equal.

Example, ``every=1000``: steps 0..999 follow the work source's mixture; at step 1000 ``decide(1000)``
returns ``{"web": 0.6, "code": 0.4}``; plan ``OUT/step-1000`` continues the first plan with those weights,
and steps 1000..1999 come from it; and so on. ``zephon sql OUT/step-3000 "SELECT * FROM segments"`` lists
the four segments.

Scope: one process holding every packing lane (``dp_size`` 1; an estimated plan's continuation needs all
lanes' cursors). Under ``torch.distributed`` decide and plan on rank 0, broadcast the plan directory, and
load the gathered state on every rank — the same calls, outside this helper.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from zephon.checks import require_positive
from zephon.errors import ConfigError
from zephon.executor.batch import Batch
from zephon.pipeline import Pipeline
from zephon.plan.manifest import read_manifest
from zephon.planner.build import PlanOptions
from zephon.planner.continuation.child import branch_of, continue_plan
from zephon.recipe.work_source import MixtureSpec, WorkSource
from zephon.specs import PackSpec, TokenizeSpec


class AdaptiveMixing:
    """Iterate batches of ``make_pipeline(plan)``, re-planning the mixture every ``every`` steps (see the module
    docstring). ``source`` is the work source the first plan was made from; each segment is ``source`` with
    its mixture replaced (and its phases dropped); ``tokenize``/``pack`` as when planning it."""

    def __init__(
        self,
        *,
        source: WorkSource,
        plan: str | Path,
        make_pipeline: Callable[[Path], Pipeline],
        decide: Callable[[int], Mapping[str, float]],
        every: int,
        out_dir: str | Path,
        tokenize: TokenizeSpec | None = None,
        pack: PackSpec | None = None,
    ) -> None:
        require_positive(every, "every", unit="global steps", fix="pass e.g. every=1000")
        self.source = source
        self.plan = Path(plan)
        self.make_pipeline = make_pipeline
        self.decide = decide
        self.every = every
        self.out_dir = Path(out_dir)
        self.tokenize = tokenize
        self.pack = pack
        #: The plan of each segment, in order (the first is the plan given).
        self.plans: list[Path] = [self.plan]
        #: Set once no segment can follow (a packing lane ran out): ``decide`` is not called again.
        self.ended = False

    def __iter__(self) -> Iterator[Batch]:
        pipeline = self.make_pipeline(self.plan)
        while True:
            branched = False
            batches = iter(pipeline)
            for batch in batches:
                yield batch
                state = pipeline.state_dict()
                step = int(state["step"])
                if state["microbatch"] == 0 and step % self.every == 0 and step > 0 and not self.ended:
                    following = self._branch(step, state)
                    if following is not None:
                        pipeline, branched = following, True
                        break
            close = getattr(batches, "close", None)
            if close is not None:
                close()
            if not branched:
                return

    def _branch(self, step: int, state: dict[str, object]) -> Pipeline | None:
        """The pipeline of a new segment from ``step``; None when the plan's documents up to its end are all
        kept (nothing is left to re-weight), or when a packing lane had run out (the plan's last steps: new
        documents would fill its short rows) — the run ends on the current plan, ``decide`` is not called."""
        if state.get("dp_size") != 1:
            raise ConfigError(
                f"AdaptiveMixing must run in one process holding every lane, got dp_size {state.get('dp_size')} — "
                "under torch.distributed decide and plan on rank 0 (zephon.planner.continuation.child.continue_plan) "
                "and "
                "load the gathered state on every rank"
            )
        branch = branch_of(self.plan, state=state)
        if branch.position >= read_manifest(self.plan).totals.documents:
            return None
        if branch.dry_lanes:  # continue_plan would refuse it (DryLanes): the same branch, from the same state
            self.ended = True
            return None
        weights = dict(self.decide(step))
        source = dataclasses.replace(self.source, mixture=MixtureSpec(weights), phases=())
        options = PlanOptions(tokenize=self.tokenize, pack=self.pack)
        plan = continue_plan(self.plan, source, self.out_dir / f"step-{step}", state=state, options=options)
        self.plan = plan
        self.plans.append(plan)
        pipeline = self.make_pipeline(plan)
        pipeline.load_state_dict(state)
        return pipeline
