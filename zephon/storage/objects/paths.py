"""Object-store paths: ``s3://BUCKET/KEY``, ``gs://BUCKET/KEY`` (``gcs://``), ``az://CONTAINER/KEY`` (``abfs://``).

A dataset path names one object, a directory-like prefix or a glob; the plan records each shard by its
canonical URI (``s3://``, ``gs://`` or ``az://``, whatever spelling the user pasted), so plans made from
``gcs://b/x`` and ``gs://b/x`` are the same. ``abfs[s]://CONTAINER@ACCOUNT.dfs.core.windows.net/KEY`` keeps
the account in :attr:`ObjectPath.account` (the store's account for that path); its URI is ``az://CONTAINER/KEY``.

Globs follow Python's ``glob`` on keys: ``*`` and ``?`` never cross ``/``, ``**`` matches any depth (``**/``
also none), ``[abc]`` is a class. Only the prefix before the first wildcard is listed.

Worked example: ``gcs://corpus/web/**/part-*.parquet`` → cloud ``gs``, bucket ``corpus``, listed prefix
``web/``, pattern matching ``web/part-0.parquet`` and ``web/2024/part-1.parquet`` but not ``web/x.parquet``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from zephon.errors import DatasetError

__all__ = ["CLOUDS", "ObjectPath", "is_object_uri", "parse_object_path"]

#: Every spelling a user may paste → the cloud it names.
SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "az": "az", "azure": "az", "abfs": "az", "abfss": "az"}
CLOUDS = ("s3", "gs", "az")
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<bucket>[^/]*)(?:/(?P<key>.*))?$")
_ABFS_HOST = re.compile(r"^(?P<container>[^@]+)@(?P<account>[a-z0-9]+)\.(?:dfs|blob)\.core\.windows\.net$")
_WILDCARD = re.compile(r"[*?\[]")


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectPath:
    """A parsed object-store path. ``key`` may be empty (the whole bucket) or hold glob wildcards."""

    cloud: str
    bucket: str
    key: str
    account: str | None = None

    @property
    def uri(self) -> str:
        return f"{self.cloud}://{self.bucket}/{self.key}"

    @property
    def is_glob(self) -> bool:
        return bool(_WILDCARD.search(self.key))

    def child(self, key: str) -> ObjectPath:
        return ObjectPath(cloud=self.cloud, bucket=self.bucket, key=key, account=self.account)

    def listing_prefix(self) -> str:
        """The key prefix to list for a glob: everything before the segment holding the first wildcard."""
        m = _WILDCARD.search(self.key)
        head = self.key if m is None else self.key[: m.start()]
        return head[: head.rfind("/") + 1] if m is not None else head

    def matcher(self) -> re.Pattern[str]:
        """The glob of ``key`` as a regular expression over whole keys."""
        return re.compile(_glob_regex(self.key))


def is_object_uri(uri: str) -> bool:
    """True for a plan's object-store URI (canonical schemes only)."""
    return uri.startswith(("s3://", "gs://", "az://"))


def scheme_of(text: str) -> str | None:
    m = _URL.match(text)
    return m["scheme"].lower() if m else None


def parse_object_path(text: str, dataset: str = "") -> ObjectPath:
    """Parse ``text``; a malformed path is one ``DatasetError`` naming it and the right form."""
    where = f"dataset {dataset!r}: " if dataset else ""
    m = _URL.match(text)
    cloud = SCHEMES.get(m["scheme"].lower()) if m else None
    if m is None or cloud is None:
        raise DatasetError(
            f"{where}path must be s3://BUCKET/KEY, gs://BUCKET/KEY or az://CONTAINER/KEY, got {text!r} — fix the path"
        )
    bucket, key, account = m["bucket"], m["key"] or "", None
    if m["scheme"].lower() in ("abfs", "abfss") and "@" in bucket:
        host = _ABFS_HOST.match(bucket)
        if host is None:
            raise DatasetError(
                f"{where}path must be abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/KEY, got {text!r} — fix the path"
            )
        bucket, account = host["container"], host["account"]
    if not bucket or _WILDCARD.search(bucket) or any(c in bucket for c in " \\"):
        raise DatasetError(
            f"{where}path must name a bucket (or container) without wildcards, got {bucket!r} in {text!r} — "
            "fix the path"
        )
    if "//" in key or key.startswith("/") or any(seg in (".", "..") for seg in key.split("/")):
        raise DatasetError(
            f"{where}path keys must not hold empty, '.' or '..' segments, got {key!r} in {text!r} — fix the path"
        )
    return ObjectPath(cloud=cloud, bucket=bucket, key=key, account=account)


def _glob_regex(pattern: str) -> str:
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            body = body.replace("\\", "\\\\")
            out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "^" + "".join(out) + "$"
