"""The state after the batches training took, not after the ones a framework fetched ahead.

Lightning's loop fetches one batch ahead (to know the last one); Accelerate's ``DataLoaderShard`` does too; a
user's own prefetching thread may hold several. A loader's state after the last batch *handed out* is then
ahead of the model, and resuming from it skips those batches. ``ConsumedLoader`` keeps this rank's own state
(``PipelineLoader.local_state``, no collective) after each microbatch it hands out, and ``state_after(k)``
gives the one after the ``k``-th of the iteration — ``k`` counted by the framework's own training loop —
gathered over the ranks (a collective under torch.distributed, like ``Pipeline.state_dict``).

Invariant: ``state_after(k)`` resumes at microbatch ``k`` of the iteration, whatever was fetched beyond it.

Worked example: Lightning ran 3 training steps of one microbatch each and fetched the 4th. ``state_after(3)``
is the state after the 3rd (a resume yields the 4th next); ``loader.state_dict()`` would be after the 4th.

Only the last ``WINDOW`` states are kept (a framework fetches a few batches ahead, not more); an older one is
refused in one line.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from zephon.errors import ConfigError
from zephon.executor.state import gather_states
from zephon.torch_loader import PipelineLoader, Tensors

#: States kept: how far ahead of the training step a framework may fetch.
WINDOW = 64


class ConsumedLoader:
    """Iterates a ``PipelineLoader`` and remembers the state after each microbatch. Not ``Stateful`` on purpose:
    a framework that checkpoints stateful loaders itself (Lightning) would save the fetched-ahead state."""

    def __init__(self, loader: PipelineLoader) -> None:
        self.loader = loader
        self._states: deque[dict[str, Any]] = deque(maxlen=WINDOW + 1)  # [0]: after microbatch _first()
        self._handed = 0

    def __iter__(self) -> Iterator[Tensors]:
        states, local_state = self._states, self.loader.local_state  # looked up once, not per microbatch
        states.clear()
        states.append(local_state())  # where this iteration starts: after 0 microbatches
        self._handed = 0
        for tensors in self.loader:
            self._handed += 1
            states.append(local_state())  # the deque drops the oldest beyond WINDOW + 1
            yield tensors

    def _first(self) -> int:
        """The microbatch count the oldest kept state is after: the deque ends at ``_handed``."""
        return self._handed + 1 - len(self._states)

    @property
    def handed(self) -> int:
        """Microbatches handed out in this iteration."""
        return self._handed

    def local_state_after(self, consumed: int) -> dict[str, Any]:
        """This rank's state after ``consumed`` microbatches of the iteration (before iterating: the start)."""
        if not self._states:
            return self.loader.local_state()
        first = self._first()
        if not first <= consumed <= self._handed:
            raise ConfigError(
                f"the training loop's count of batches taken must be within the {WINDOW} latest of the "
                f"{self._handed} handed out, got {consumed} — the framework fetched further ahead than Zephon "
                "expects; report this with the framework's version"
            )
        return self._states[consumed - first]

    def state_after(self, consumed: int) -> dict[str, Any]:
        """The rank-independent state after ``consumed`` microbatches (a collective under torch.distributed)."""
        return gather_states(self.local_state_after(consumed))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration starts at ``state`` (validated now)."""
        self.loader.load_state_dict(state)
        self._states.clear()
