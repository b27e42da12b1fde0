"""The one source of randomness of the demo generators: :class:`Draw`, uniform values from a numpy Generator.

Every random decision of :mod:`demo_grammar.prose`, :mod:`demo_grammar.code` and :mod:`demo_grammar.short`
goes through ``Draw.u()``, so the documents are a pure function of the generator's seed and of the order of
the decisions.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

from demo_grammar.vocabulary import WeightedWords

__all__ = ["Draw"]


class Draw:
    """Uniform draws from one numpy Generator, buffered so per-word draws stay cheap.

    The buffer is refilled in fixed-size chunks, so the sequence of values is a pure function of the
    generator's seed.
    """

    __slots__ = ("_buf", "_pos", "_rng")

    _CHUNK = 8192

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._buf: list[float] = []
        self._pos = 0

    def u(self) -> float:
        """The next uniform value in ``[0, 1)``."""
        if self._pos >= len(self._buf):
            self._buf = self._rng.random(self._CHUNK).tolist()
            self._pos = 0
        value = self._buf[self._pos]
        self._pos += 1
        return value

    def chance(self, p: float) -> bool:
        """True with probability ``p``."""
        return self.u() < p

    def int(self, lo: int, hi: int) -> int:
        """A uniform integer in ``[lo, hi]`` (both ends included)."""
        return lo + min(int(self.u() * (hi - lo + 1)), hi - lo)

    def log_int(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``, uniform in log-space (many small values, a long tail)."""
        return min(hi, max(lo, int(math.exp(math.log(lo) + self.u() * (math.log(hi + 1) - math.log(lo))))))

    def one(self, items: Sequence[str]) -> str:
        """One of ``items``, uniformly."""
        return items[self.int(0, len(items) - 1)]

    def word(self, vocab: WeightedWords) -> str:
        """One word of ``vocab``, by its weights."""
        return vocab.words[min(bisect.bisect_right(vocab.cdf, self.u() * vocab.total), len(vocab.words) - 1)]
