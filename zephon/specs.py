"""The settings of the pipeline's stages, as frozen values both engines import without runtime code.

``TokenizeSpec`` (``Pipeline.tokenize``), ``PackSpec`` (``Pipeline.pack_flat``), ``BatchSpec``
(``Pipeline.batch``) and the storage options ``CacheOptions`` / ``StoreOptions`` (``Pipeline.options``) are
read by the planner (exact plans are planned with a tokenizer and a packing) and by the executor. This module
imports only the standard library and ``zephon.errors``: importing a spec never loads a tokenizer, pyarrow or
torch. Each spec validates itself when it is made, with an error that says what to pass instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from zephon.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizeSpec:
    """Settings of ``Pipeline.tokenize``.

    Attributes:
        tokenizer_id: Hub id, local directory, or tokenizer.json path.
        field: the text column (Parquet) or key (JSONL).
        add_bos: None follows the tokenizer's convention; True/False force it.
        eos_token: EOS token string; None uses the tokenizer's.
    """

    tokenizer_id: str
    field: str = "text"
    add_bos: bool | None = None
    eos_token: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tokenizer_id, str) or not self.tokenizer_id:
            raise ConfigError(f"tokenizer_id must be a non-empty string, got {self.tokenizer_id!r}")
        if not isinstance(self.field, str) or not self.field:
            raise ConfigError(f"field must be a non-empty column name, got {self.field!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class PackSpec:
    """Settings of ``Pipeline.pack_flat``.

    Attributes:
        max_length: tokens per packed row: context length + 1 (labels are shifted by one).
        algorithm: ``"wrap"`` concatenates documents and cuts rows, splitting documents at row ends;
            ``"best_fit"`` (exact plans only) places whole documents into rows planned offline, minimizing
            padding.
        pad_token_id: pads short rows; None uses the tokenizer's pad token, else EOS.
        oversize: best_fit only: a document longer than ``max_length`` is ``"split"`` into pieces of at most
            ``max_length`` tokens or ``"drop"``ped; either way it is counted in plan.json.
    """

    max_length: int
    algorithm: str = "wrap"
    pad_token_id: int | None = None
    oversize: str = "split"

    def __post_init__(self) -> None:
        if not isinstance(self.max_length, int) or self.max_length < 2:
            raise ConfigError(f"max_length must be an integer ≥ 2, got {self.max_length!r} — use context + 1")
        if self.algorithm not in ("wrap", "best_fit"):
            raise ConfigError(f'pack_flat algorithm must be "wrap" or "best_fit", got {self.algorithm!r}')
        if self.oversize not in ("split", "drop"):
            raise ConfigError(f'pack_flat oversize must be "split" or "drop", got {self.oversize!r}')


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
        if not isinstance(self.microbatch_size, int) or self.microbatch_size < 1:
            raise ConfigError(f"microbatch_size must be an integer ≥ 1, got {self.microbatch_size!r}")
        g = self.global_batch_size
        if g is not None and (not isinstance(g, int) or g < self.microbatch_size):
            raise ConfigError(f"global_batch_size must be an integer ≥ microbatch_size, got {g!r}")


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
        if self.enabled and not self.root:
            raise ConfigError("CacheOptions.root must be a directory when enabled=True, got None — pass root=...")
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
READ_MODES = ("cache", "range")


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


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreOptions:
    """How the executor reaches shards.

    Attributes:
        cache: the shard cache settings.
        remote_read: how object-store shards (``s3://``, ``gs://``, ``az://``) are read at train time:
            ``"cache"`` downloads each whole object into the shard cache (``cache`` must be enabled);
            ``"range"`` reads Parquet row groups by range requests, ahead of use, with no local copy
            (JSONL objects are read whole into memory). ``hf://`` shards always go through the cache.
        read_ahead_bytes: range mode: the bytes of row groups fetched ahead at most (memory bound).
        credentials: per-prefix overrides of the environment's credentials and endpoints.
    """

    cache: CacheOptions = field(default_factory=CacheOptions)
    remote_read: str = "cache"
    read_ahead_bytes: int = 256 << 20
    credentials: tuple[StoreCredentials, ...] = ()

    def __post_init__(self) -> None:
        if self.remote_read not in READ_MODES:
            raise ConfigError(f'StoreOptions.remote_read must be "cache" or "range", got {self.remote_read!r}')
        if isinstance(self.read_ahead_bytes, bool) or not isinstance(self.read_ahead_bytes, int) or (
            self.read_ahead_bytes < 1 << 20
        ):
            raise ConfigError(f"StoreOptions.read_ahead_bytes must be an int ≥ 1 MiB, got {self.read_ahead_bytes!r}")
        creds = tuple(self.credentials)
        if not all(isinstance(c, StoreCredentials) for c in creds):
            raise ConfigError("StoreOptions.credentials must hold StoreCredentials, got another type — wrap them")
        object.__setattr__(self, "credentials", creds)
