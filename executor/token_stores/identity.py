"""Which tokenizer a token store's ids were made with, recorded at plan time and checked before a run's first batch.

A store's ids mean something only under the tokenizer that made them. The plan records, per token-store
dataset, that tokenizer's *identity* — what a run must agree on for the ids to read the same: the vocabulary
size (added tokens included) and the EOS, BOS and PAD ids (``TokenizerIdentity``) — in plan.json
``datasets[i].token_store.identity``. The tokenizer is the store's own record (datatrove's
``.ds.metadata``), else the dataset's ``tokenizer=``, else the plan's ``tokenize(tokenizer_id=...)``; the
planner loads it (``zephon.planner.counts.stores``: its tokenizer.json and special tokens; no text is
tokenized) when it loads — a local path, or a Hub id the Hub or its cache has. One that does not load leaves
``identity`` null, with a warning, and the run then checks only that each id read is below its vocabulary
(``zephon.executor.token_stores.store``).

The run compares the identity with its own tokenizer's (``identity_of``: the same four numbers, from the encoder
it built) before its first batch (``check_store_tokenizers``), and refuses in one line naming the dataset, both
tokenizers, what differs and the fix. The special ids are the encoder's: EOS is ``tokenize(eos_token=)``, else the
tokenizer's, else the first of ``EOS_GUESSES`` it has; PAD falls back to EOS — as ``Encoder`` decides them.

Example: a Megatron store planned with ``tokenizer="meta-llama/Llama-3.1-8B"`` records ``{"tokenizer":
"meta-llama/Llama-3.1-8B", "vocab_size": 128256, "eos_token_id": 128001, "bos_token_id": 128000, "pad_token_id":
128001}``; a run with ``gpt2`` stops before its first batch: ``dataset 'web': token store ... must run with the
tokenizer its ids were made with, got 'gpt2' (vocab_size 50257, eos_token_id 50256, ...) where the store's is
'meta-llama/Llama-3.1-8B' (vocab_size 128256, ...) — ...``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from zephon.errors import ConfigError

__all__ = ["TokenizerIdentity", "check_store_tokenizers", "identity_of"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizerIdentity:
    """What a run's tokenizer must share with a store's for the store's ids to mean the same.

    Attributes:
        tokenizer: the tokenizer's name as given (a Hub id or path): informational, never compared.
        vocab_size: ids it can make, added tokens included (``Tokenizer.get_vocab_size(with_added_tokens=True)``).
        eos_token_id / bos_token_id / pad_token_id: its special ids as the encoder uses them (None: it has none).
    """

    tokenizer: str
    vocab_size: int
    eos_token_id: int | None
    bos_token_id: int | None
    pad_token_id: int | None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> TokenizerIdentity:
        return cls(**{f.name: entry.get(f.name) for f in fields(cls)})

    def differences(self, other: TokenizerIdentity) -> list[str]:
        """The compared fields whose values differ, as ``name other (store self)``."""
        out = []
        for name in ("vocab_size", "eos_token_id", "bos_token_id", "pad_token_id"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                out.append(f"{name} {theirs} (store {mine})")
        return out


def identity_of(encoder: Any, name: str) -> TokenizerIdentity | None:
    """The identity of an encoder's tokenizer (any of the executor's encoders), or None for one without a
    ``tokenizers`` tokenizer (a test double)."""
    tokenizer = getattr(encoder, "tokenizer", None)
    size = getattr(tokenizer, "get_vocab_size", None)
    if size is None:
        return None
    return TokenizerIdentity(
        tokenizer=name,
        vocab_size=int(size(with_added_tokens=True)),
        eos_token_id=getattr(encoder, "eos_id", None),
        bos_token_id=getattr(encoder, "bos_id", None),
        pad_token_id=getattr(encoder, "pad_id", None),
    )


def check_store_tokenizers(datasets: Sequence[Any], encoder: Any, tokenizer_id: str) -> None:
    """Refuse a run whose tokenizer differs from a token store's recorded one (see the module): one line naming
    the dataset, both tokenizers and what differs. ``datasets``: plan.json's (``PlanDataset``)."""
    run: TokenizerIdentity | None = None
    for d in datasets:
        recorded = (d.token_store or {}).get("identity")
        if not recorded:
            continue
        if run is None:
            run = identity_of(encoder, tokenizer_id)
            if run is None:
                return
        store = TokenizerIdentity.from_json(recorded)
        differences = store.differences(run)
        if differences:
            raise ConfigError(
                f"dataset {d.name!r}: token store {d.pinned!r} must run with the tokenizer its ids were made with, "
                f"got {tokenizer_id!r} whose {', '.join(differences)} differ from {store.tokenizer!r}'s — run with "
                f"tokenize(tokenizer_id={store.tokenizer!r}) (or one of the same vocabulary and special tokens), or "
                "tokenize the store again with this tokenizer"
            )
