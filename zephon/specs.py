"""The settings of the pipeline's stages, as frozen values both engines import without runtime code.

``TokenizeSpec`` (``Pipeline.tokenize``), ``PackSpec`` (``Pipeline.pack_flat``), ``BatchSpec``
(``Pipeline.batch``) and the storage options ``CacheOptions`` / ``StoreOptions`` (``Pipeline.options``) are
read by the planner (exact plans are planned with a tokenizer and a packing) and by the executor. This module
imports only the standard library and ``zephon.errors``: importing a spec never loads a tokenizer, pyarrow or
torch. Each spec validates itself when it is made, with an error that says what to pass instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from zephon.checks import local_directory, plain_numbers, require_bool, require_positive
from zephon.errors import ConfigError
from zephon.keywords import known_keywords

#: ``TokenizeSpec.special_tokens`` modes: BOS and EOS, one of them, none, or what the tokenizer itself adds.
SPECIAL_TOKENS = ("bos_eos", "bos", "eos", "none", "tokenizer_default")
#: ``TokenizeSpec.long_documents``: a document past ``max_tokens`` is cut there, or split into several.
LONG_DOCUMENTS = ("truncate", "split")
#: ``ChatSpec.layout``: how a record becomes a list of ``{role, content}`` messages.
CHAT_LAYOUTS = ("messages", "alpaca", "sharegpt")
#: ``TokenizeSpec.field`` when it is not given: the column each chat layout reads (text: ``"text"``).
CHAT_FIELDS = {"messages": "messages", "alpaca": "instruction", "sharegpt": "conversations"}
#: ``ChatSpec.loss_on``: the tokens the loss mask covers.
LOSS_ON = ("assistant", "all")


@known_keywords
@dataclass(frozen=True, kw_only=True, slots=True)
class ChatSpec:
    """Settings of ``Pipeline.tokenize_chat`` (``zephon.executor.encode.chat_render``).

    Attributes:
        layout: ``"messages"`` (a list of ``{role, content}`` in ``TokenizeSpec.field``), ``"alpaca"`` (columns
            ``instruction``, optional ``input``, ``output``) or ``"sharegpt"`` (a list of ``{from, value}`` in
            ``TokenizeSpec.field``, roles ``human``/``gpt``/``system``).
        chat_template: a Jinja chat template; None uses the tokenizer's (``chat_template`` in
            tokenizer_config.json, or ``chat_template.jinja`` beside it).
        loss_on: ``"assistant"`` (the loss mask covers assistant turns only) or ``"all"``.
    """

    layout: str = "messages"
    chat_template: str | None = None
    loss_on: str = "assistant"

    def __post_init__(self) -> None:
        if self.layout not in CHAT_LAYOUTS:
            raise ConfigError(f"tokenize_chat layout must be one of {', '.join(CHAT_LAYOUTS)}, got {self.layout!r}")
        if self.loss_on not in LOSS_ON:
            raise ConfigError(f'tokenize_chat loss_on must be "assistant" or "all", got {self.loss_on!r}')
        if self.chat_template is not None and (not isinstance(self.chat_template, str) or not self.chat_template):
            raise ConfigError(f"chat_template must be a non-empty Jinja string or None, got {self.chat_template!r}")


@known_keywords
@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizeSpec:
    """Settings of ``Pipeline.tokenize`` (and ``Pipeline.tokenize_chat``, with ``chat`` set).

    Attributes:
        tokenizer_id: Hub id, local directory, or tokenizer.json path.
        field: the text column (Parquet) or key (JSONL); for chat, the messages column. None (the default)
            follows ``chat``: ``"text"`` without it, else the layout's column (``CHAT_FIELDS``: ``"messages"``,
            alpaca ``"instruction"``, sharegpt ``"conversations"``); after construction it is always a string.
        add_bos: None follows the tokenizer's convention; True/False force it.
        eos_token: EOS token string; None uses the tokenizer's.
        special_tokens: None (default) is BOS by ``add_bos`` and one EOS per document; ``"bos_eos"``,
            ``"bos"``, ``"eos"``, ``"none"`` add exactly those; ``"tokenizer_default"`` adds what the tokenizer's
            own post-processor adds (GPT-2: nothing, Llama: ``<s>``).
        max_tokens: None, or the most tokens a document may have (special tokens included).
        long_documents: ``"truncate"`` cuts a longer document to ``max_tokens`` (its last special tokens kept);
            ``"split"`` cuts it into documents of at most ``max_tokens`` tokens, each with the special tokens.
        chat: None for text; the chat settings for ``tokenize_chat``.
    """

    tokenizer_id: str
    field: str | None = None
    add_bos: bool | None = None
    eos_token: str | None = None
    special_tokens: str | None = None
    max_tokens: int | None = None
    long_documents: str = "truncate"
    chat: ChatSpec | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tokenizer_id, os.PathLike):  # a local directory or file given as a Path: its str
            object.__setattr__(self, "tokenizer_id", os.fspath(self.tokenizer_id))
        if not isinstance(self.tokenizer_id, str) or not self.tokenizer_id:
            raise ConfigError(f"tokenizer_id must be a non-empty string or path, got {self.tokenizer_id!r}")
        plain_numbers(self, "add_bos", "max_tokens")
        require_bool(self.add_bos, "add_bos", optional=True)
        if isinstance(self.chat, dict):  # a spec read back from JSON (count workers): its chat part too
            object.__setattr__(self, "chat", ChatSpec(**self.chat))
        if self.chat is not None and not isinstance(self.chat, ChatSpec):
            raise ConfigError(f"chat must be a ChatSpec or None, got {type(self.chat).__name__}")
        if self.field is None:  # the layout's own column: a hand-built chat spec reads what tokenize_chat reads
            object.__setattr__(self, "field", "text" if self.chat is None else CHAT_FIELDS[self.chat.layout])
        if not isinstance(self.field, str) or not self.field:
            raise ConfigError(f"field must be a non-empty column name, got {self.field!r}")
        if self.special_tokens is not None and self.special_tokens not in SPECIAL_TOKENS:
            raise ConfigError(f"special_tokens must be one of {', '.join(SPECIAL_TOKENS)}, got {self.special_tokens!r}")
        if self.special_tokens is not None and self.add_bos is not None:
            raise ConfigError(
                f"add_bos must be None when special_tokens is set, got add_bos={self.add_bos!r} and "
                f"special_tokens={self.special_tokens!r} — use special_tokens alone"
            )
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 2):
            raise ConfigError(f"max_tokens must be an integer ≥ 2 or None, got {self.max_tokens!r}")
        if self.long_documents not in LONG_DOCUMENTS:
            raise ConfigError(f'long_documents must be "truncate" or "split", got {self.long_documents!r}')
        if self.chat is not None and self.special_tokens not in (None, "none"):
            raise ConfigError(
                f"special_tokens must be unset for chat (the template places them), got {self.special_tokens!r}"
            )

    @property
    def plain(self) -> bool:
        """The documented API's tokenization: text, BOS by ``add_bos``, one EOS, no length limit (``Encoder`` alone)."""
        return self.chat is None and self.special_tokens is None and self.max_tokens is None


#: The longest packed row: 2^24 tokens, 16× a 2^20 context; beyond it a row's buffers alone pass gigabytes.
MAX_LENGTH_BOUND = 2**24


@known_keywords
@dataclass(frozen=True, kw_only=True, slots=True)
class PackSpec:
    """Settings of ``Pipeline.pack_flat``.

    Attributes:
        max_length: tokens per packed row: context length + 1 (labels are shifted by one).
        algorithm: ``"wrap"`` concatenates documents and cuts rows, splitting documents at row ends;
            ``"best_fit"`` (exact plans only) places whole documents into rows planned offline, minimizing
            padding; ``"homogeneous"`` (exact plans only) packs each dataset into its own rows and interleaves
            the rows by weight, so every window of rows holds the mixture within one row per end whatever the
            document lengths (``zephon.planner.homogeneous``; docs/curricula.md).
        pad_token_id: pads short rows; None uses the tokenizer's pad token, else EOS.
        oversize: best_fit only: a document longer than ``max_length`` is ``"split"`` into pieces of at most
            ``max_length`` tokens or ``"drop"``ped; either way it is counted in plan.json.
    """

    max_length: int
    algorithm: str = "wrap"
    pad_token_id: int | None = None
    oversize: str = "split"

    def __post_init__(self) -> None:
        plain_numbers(self, "max_length")
        if not isinstance(self.max_length, int) or self.max_length < 2:
            raise ConfigError(f"max_length must be an integer ≥ 2, got {self.max_length!r} — use context + 1")
        if self.max_length > MAX_LENGTH_BOUND:
            raise ConfigError(
                f"max_length must be ≤ {MAX_LENGTH_BOUND} (2^24 tokens a row: contexts of 2^20 and beyond fit), got "
                f"{self.max_length} — use the context length + 1"
            )
        if self.algorithm not in ("wrap", "best_fit", "homogeneous"):
            raise ConfigError(
                f'pack_flat algorithm must be "wrap", "best_fit" or "homogeneous", got {self.algorithm!r}'
            )
        if self.oversize not in ("split", "drop"):
            raise ConfigError(f'pack_flat oversize must be "split" or "drop", got {self.oversize!r}')


#: ``SamplePackSpec.oversize``: a sample costlier than ``max_cost`` stops the plan, or is left out and counted.
SAMPLE_OVERSIZE = ("refuse", "drop")


@known_keywords
@dataclass(frozen=True, kw_only=True, slots=True)
class SamplePackSpec:
    """Settings of ``Pipeline.pack_samples``: samples grouped into rows at plan time by their costs.

    Attributes:
        max_cost: the most a row's samples may cost together (each sample's ``cost=``, docs/records.md).
        algorithm: ``"best_fit"``, the only one: each sample goes into the open row with the least room that
            still holds it (``zephon.planner.best_fit``).
        oversize: a sample costing more than ``max_cost`` is ``"refuse"``d at plan time (one line naming its
            dataset, shard and row) or ``"drop"``ped: in no row, counted in plan.json ``sample_packing``.
    """

    max_cost: int
    algorithm: str = "best_fit"
    oversize: str = "refuse"

    def __post_init__(self) -> None:
        if isinstance(self.max_cost, bool) or not isinstance(self.max_cost, int) or self.max_cost < 1:
            raise ConfigError(
                f"pack_samples max_cost must be an integer ≥ 1, got {self.max_cost!r} — use the most one row may "
                "cost, e.g. max_cost=4096"
            )
        if self.algorithm != "best_fit":
            raise ConfigError(f'pack_samples algorithm must be "best_fit", got {self.algorithm!r}')
        if self.oversize not in SAMPLE_OVERSIZE:
            raise ConfigError(f'pack_samples oversize must be "refuse" or "drop", got {self.oversize!r}')

    def normalized(self) -> dict[str, object]:
        """The settings a plan depends on (plan.json ``config.sample_packing``)."""
        return {"algorithm": self.algorithm, "max_cost": self.max_cost, "oversize": self.oversize}


@known_keywords
@dataclass(frozen=True, kw_only=True, slots=True)
class BatchSpec:
    """Settings of ``Pipeline.batch``.

    Attributes:
        microbatch_size: packed rows per batch (per rank).
        global_batch_size: rows per optimizer step over all data-parallel ranks; None means
            microbatch_size × dp_size (no gradient accumulation). Keep it fixed to change dp_size mid-run.
        drop_last: stop before the plan's final, incomplete step (default keeps it, padded: no data lost).
    """

    microbatch_size: int
    global_batch_size: int | None = None
    drop_last: bool = False

    def __post_init__(self) -> None:
        plain_numbers(self, "microbatch_size", "global_batch_size", "drop_last")
        require_positive(self.microbatch_size, "microbatch_size")
        require_bool(self.drop_last, "drop_last")
        g = self.global_batch_size
        if g is not None and (not isinstance(g, int) or g < self.microbatch_size):
            raise ConfigError(f"global_batch_size must be an integer ≥ microbatch_size, got {g!r}")


@known_keywords
@dataclass(frozen=True, kw_only=True, slots=True)
class CacheOptions:
    """The local shard cache that remote shards are downloaded into before they are read.

    Attributes:
        enabled: download remote shards into ``root`` (required for hf:// datasets).
        root: cache directory; ranks of one node may share it.
        limit_bytes: upper bound of the cache's total size; None means unbounded.
    """

    enabled: bool = False
    root: str | None = None
    limit_bytes: int | None = None

    def __post_init__(self) -> None:
        require_bool(self.enabled, "CacheOptions.enabled")
        if self.enabled or self.root is not None:  # a local directory (a Path: its str); needed when enabled
            root = local_directory(
                self.root, "CacheOptions.root", example="'/scratch/zephon-cache' (ranks of one node may share it)",
                remote_fix="the cache holds local copies of remote shards: pass a local folder",
            )  # fmt: skip
            object.__setattr__(self, "root", root)
        if self.limit_bytes is not None and self.limit_bytes <= 0:
            raise ConfigError(
                f"CacheOptions.limit_bytes must be > 0 or None, got {self.limit_bytes} — pass a size in bytes"
            )


#: The variables an object store reads, by each cloud's own conventions (``StoreCredentials.env`` keys).
CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "STORAGE_EMULATOR_HOST",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
)
_PREFIX = re.compile(r"^(s3|gs|gcs|az|abfs|abfss)://[^/]+(/.*)?$")
READ_MODES = ("auto", "cache", "range")


@known_keywords
@dataclass(frozen=True, kw_only=True, slots=True)
class StoreCredentials:
    """Credentials or an endpoint for the objects under one URL prefix, replacing the environment there.

    For a user with two accounts: ``StoreCredentials(prefix="s3://team-b-corpus", env={"AWS_ACCESS_KEY_ID":
    ..., "AWS_SECRET_ACCESS_KEY": ..., "AWS_ENDPOINT_URL": ...})``. The keys are the cloud's own environment
    variables (``CREDENTIAL_VARIABLES``); an object under ``prefix`` is read with the environment's variables
    of that cloud replaced by ``env`` (the longest matching prefix wins). Values never appear in a repr,
    plan, log or error: the repr shows the variable names only.

    Attributes:
        prefix: ``s3://bucket[/key prefix]``, ``gs://...`` or ``az://container[/...]``.
        env: variable name → value.
    """

    prefix: str
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not _PREFIX.match(self.prefix):
            raise ConfigError(
                f"StoreCredentials.prefix must be s3://BUCKET[/PREFIX], gs://... or az://CONTAINER[/...], got "
                f"{self.prefix!r} — name the bucket the credentials are for"
            )
        unknown = sorted(k for k in self.env if k not in CREDENTIAL_VARIABLES)
        if unknown or not all(isinstance(v, str) for v in self.env.values()):
            raise ConfigError(
                f"StoreCredentials.env for {self.prefix} must map the clouds' variables "
                f"({', '.join(CREDENTIAL_VARIABLES)}) to strings, got {unknown or 'a value that is not a string'}"
                " — use those names"
            )
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    def __repr__(self) -> str:
        return f"StoreCredentials(prefix={self.prefix!r}, env=<{', '.join(sorted(self.env)) or 'empty'}>)"


@known_keywords
@dataclass(frozen=True, kw_only=True, slots=True)
class StoreOptions:
    """How the executor reaches shards.

    Attributes:
        cache: the shard cache settings.
        remote_read: how object-store shards (``s3://``, ``gs://``, ``az://``) are read at train time:
            ``"cache"`` downloads each whole object into the shard cache (``cache`` must be enabled);
            ``"range"`` reads Parquet row groups by range requests, ahead of use, with no local copy
            (JSONL objects are read whole into memory); ``"auto"`` (default) is ``"cache"`` when the cache is
            enabled, else ``"range"`` — so a run over an object store needs no options and no disk. ``hf://``
            shards always go through the cache. The mode never changes the data (docs/storage.md).
        read_ahead_bytes: range mode: the bytes of row groups fetched ahead at most (memory bound).
        credentials: per-prefix overrides of the environment's credentials and endpoints.
    """

    cache: CacheOptions = field(default_factory=CacheOptions)
    remote_read: str = "auto"
    read_ahead_bytes: int = 256 << 20
    credentials: tuple[StoreCredentials, ...] = ()

    def __post_init__(self) -> None:
        if self.remote_read not in READ_MODES:
            raise ConfigError(
                f'StoreOptions.remote_read must be "auto", "cache" or "range", got {self.remote_read!r} — pick one'
            )
        if (
            isinstance(self.read_ahead_bytes, bool)
            or not isinstance(self.read_ahead_bytes, int)
            or (self.read_ahead_bytes < 1 << 20)
        ):
            raise ConfigError(f"StoreOptions.read_ahead_bytes must be an int ≥ 1 MiB, got {self.read_ahead_bytes!r}")
        creds = tuple(self.credentials)
        if not all(isinstance(c, StoreCredentials) for c in creds):
            raise ConfigError("StoreOptions.credentials must hold StoreCredentials, got another type — wrap them")
        object.__setattr__(self, "credentials", creds)

    def ranged(self) -> bool:
        """Object-store shards are read by range requests (``remote_read``: ``"range"``, or ``"auto"`` with the
        shard cache disabled)."""
        return self.remote_read == "range" or (self.remote_read == "auto" and not self.cache.enabled)
