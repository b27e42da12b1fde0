"""The cores this process may use: its CPU affinity where the platform has one (a container or ``taskset``
limits it), else every core of the machine. Thread pools size themselves from it."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (≥ 1)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
