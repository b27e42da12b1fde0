"""Tokenizer engines: the fastest way to run a tokenizer.json that gives exactly ``tokenizers``' ids.

``base`` (the interface: ``Engine.encode`` → ``TokenIds``), ``hf`` (``tokenizers``, the reference),
``tiktoken`` and ``vendors`` (fastokens, gigatoken, kitoken: optional), ``verify`` (the comparison and the
probes), ``choose`` (``EngineChoice``: candidates in speed order, verdicts cached, ``ZEPHON_TOKENIZER_ENGINE``).
"""

from zephon.executor.engines.base import Engine, EngineUnavailable, TokenIds, encode_on
from zephon.executor.engines.choose import CANDIDATES, ENGINE_ENV, EngineChoice, engine_setting

__all__ = [
    "CANDIDATES",
    "ENGINE_ENV",
    "Engine",
    "EngineChoice",
    "EngineUnavailable",
    "TokenIds",
    "encode_on",
    "engine_setting",
]
