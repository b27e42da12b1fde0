"""The candidate engines by name: how each is built from a tokenizer.json text (``zephon.executor.engines.choose``
picks among them; ``zephon.executor.engines.trial`` builds one in a trial process)."""

from __future__ import annotations

from collections.abc import Callable

from zephon.executor.engines.base import Engine


def builders(eos_text: str | None) -> dict[str, Callable[[str], Engine]]:
    from zephon.executor.engines.tiktoken import TiktokenEngine
    from zephon.executor.engines.vendors import FastokensEngine, GigatokenEngine, KitokenEngine

    return {
        "fastokens": FastokensEngine,
        "gigatoken": GigatokenEngine,
        "tiktoken": lambda config: TiktokenEngine(config, eos_text),
        "kitoken": KitokenEngine,
    }


def crash_prone(name: str) -> bool:
    """Whether candidate ``name`` loads a tokenizer it has no verdict for in a trial process first
    (``Engine.crash_prone``)."""
    from zephon.executor.engines.tiktoken import TiktokenEngine
    from zephon.executor.engines.vendors import FastokensEngine, GigatokenEngine, KitokenEngine

    classes: dict[str, type[Engine]] = {
        "fastokens": FastokensEngine,
        "gigatoken": GigatokenEngine,
        "tiktoken": TiktokenEngine,
        "kitoken": KitokenEngine,
    }
    return classes[name].crash_prone
