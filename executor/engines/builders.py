"""The candidate engines by name: how each is built from a tokenizer.json text (``zephon.executor.engines.choose``
picks among them; ``zephon.executor.engines.trial`` builds one in a trial process)."""

from __future__ import annotations

from collections.abc import Callable

from zephon.executor.engines.base import Engine


def engine_classes() -> dict[str, type[Engine]]:
    """Each candidate's engine class (imported on first use: the vendors' packages are optional)."""
    from zephon.executor.engines.tiktoken import TiktokenEngine
    from zephon.executor.engines.vendors import FastokensEngine, GigatokenEngine, KitokenEngine

    return {
        "fastokens": FastokensEngine,
        "gigatoken": GigatokenEngine,
        "tiktoken": TiktokenEngine,
        "kitoken": KitokenEngine,
    }


def builders(eos_text: str | None) -> dict[str, Callable[[str], Engine]]:
    """How each candidate is built from a tokenizer.json text (tiktoken also needs the EOS text)."""
    built: dict[str, Callable[[str], Engine]] = dict(engine_classes())
    tiktoken = built["tiktoken"]
    built["tiktoken"] = lambda config: tiktoken(config, eos_text)  # type: ignore[call-arg]
    return built


def build(name: str, config_text: str, eos_text: str | None) -> Engine:
    """Candidate ``name`` built on the tokenizer.json text: on a thread of its own when its class is
    ``confined`` (``zephon.executor.engines.owned``), else here. Raises ``EngineUnavailable``."""
    cls = engine_classes()[name]
    args: tuple[str | None, ...] = (eos_text,) if name == "tiktoken" else ()
    if cls.confined:
        from zephon.executor.engines.owned import OwnedEngine

        return OwnedEngine(cls, config_text, *args)
    return cls(config_text, *args)  # type: ignore[call-arg]


def crash_prone(name: str) -> bool:
    """Whether candidate ``name`` loads a tokenizer it has no verdict for in a trial process first
    (``Engine.crash_prone``)."""
    return engine_classes()[name].crash_prone
