"""The shards of an object-store dataset path: one object, a directory-like prefix, or a glob.

* A key ending in ``/`` (or none: the whole bucket) is a prefix, listed recursively.
* A key with wildcards is a glob (:mod:`.paths`): the prefix before the first wildcard is listed, and keys
  are matched against the pattern.
* Any other key is one object when it exists, else a prefix (``s3://b/web`` lists ``web/``).

Listing is paginated by the client (1,000 keys a page on S3), so a bucket of any size lists in
``ceil(n / 1000)`` requests. Objects are sorted by key; under a prefix, names whose path below the prefix has
a part starting with ``.`` or ``_`` are skipped (Spark/Hive markers), and formats follow the local rules
(:func:`zephon.storage.local.shards_of`): in a prefix other files are ignored when shards are present, a
named or globbed object must be a shard, Parquet and JSONL do not mix. Each shard keeps its listing's ETag and
version id: its pin (:class:`~.reads.ObjectFile`). A "directory" holding a plan bundle's files (plan.json,
shards.parquet, samples.parquet: ``zephon.plan.format.BUNDLE_MARKER``) is not data: its objects, and its
``selected/`` copies, are left out with a ``ZephonWarning`` naming it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from zephon.errors import DatasetError, ZephonError, warn
from zephon.plan.format import looks_like_bundle
from zephon.specs import StoreCredentials
from zephon.storage.local import SUPPORTED_SUFFIXES, SourceFile, detect_format, shards_of
from zephon.storage.objects import stores
from zephon.storage.objects.errors import object_error
from zephon.storage.objects.mds import is_mds_listing, mds_objects
from zephon.storage.objects.paths import ObjectPath, parse_object_path
from zephon.storage.objects.reads import ObjectFile, count_request, quoted_etag, transient
from zephon.storage.objects.scan import remember_listing
from zephon.storage.progress import track

__all__ = ["discover_objects", "list_objects"]


def list_objects(path: ObjectPath, prefix: str, credentials: Iterable[StoreCredentials] = ()) -> list[dict[str, Any]]:
    """Every object under ``prefix`` (the client's ``ObjectMeta`` dicts), all pages."""
    import obstore

    store = stores.store_for(path, credentials)
    uri = path.child(prefix).uri
    attempts = max(1, stores.DEFAULT_RETRY.attempts)
    for attempt in range(1, attempts + 1):  # a page whose body broke: list again from the start
        try:
            out: list[dict[str, Any]] = []
            pages = obstore.list(store, prefix or None, chunk_size=1000)
            for page in track(pages, total=None, desc=f"listing {uri}", unit="page"):
                count_request("list")
                out.extend(page)
            return out
        except ZephonError:
            raise
        except Exception as exc:
            if not transient(exc) or attempt == attempts:
                raise object_error(exc, uri, path.cloud, "the listing") from None
            time.sleep(stores.DEFAULT_RETRY.base_delay * 2 ** (attempt - 1))
    raise AssertionError("unreachable")  # pragma: no cover


def _head(path: ObjectPath, credentials: Iterable[StoreCredentials]) -> dict[str, Any] | None:
    import obstore
    from obstore import exceptions as ox

    try:
        count_request("head")
        return obstore.head(stores.store_for(path, credentials), path.key)
    except (ox.NotFoundError, FileNotFoundError):
        return None
    except Exception as exc:
        error = object_error(exc, path.uri, path.cloud, "the object's metadata")
        if "HTTP 404" in str(error):  # a HEAD answer has no body: a missing key or bucket; the listing tells
            return None
        raise error from None


def discover_objects(dataset: str, text: str, credentials: Iterable[StoreCredentials] = ()) -> tuple[SourceFile, ...]:
    """The shards of an object-store dataset path, pinned (see the module docstring)."""
    creds = tuple(credentials)
    path = parse_object_path(text, dataset)
    directory = True
    if path.is_glob:
        prefix = path.listing_prefix()
        pattern = path.matcher()
        metas = [m for m in list_objects(path, prefix, creds) if pattern.match(m["path"])]
        directory = False
        if not metas:
            raise DatasetError(
                f"dataset {dataset!r}: glob {path.uri!r} must match at least one object, got none under "
                f"{path.child(prefix).uri!r} — check the pattern"
            )
    else:
        head = _head(path, creds) if path.key and not path.key.endswith("/") else None
        if head is not None:
            metas, directory = [head], False
        else:
            prefix = path.key if not path.key or path.key.endswith("/") else path.key + "/"
            metas = [m for m in list_objects(path, prefix, creds) if not _hidden(m["path"][len(prefix) :])]
            if is_mds_listing(prefix, metas):  # an MDS folder: its shards are what index.json lists
                return mds_objects(dataset, path, prefix, _outside_bundles(dataset, path, metas), creds)
            if not metas:
                raise DatasetError(
                    f"dataset {dataset!r}: path {path.uri!r} must name an object or a prefix holding shards "
                    f"({', '.join(SUPPORTED_SUFFIXES)}), got nothing there — fix the path"
                )
    metas = _outside_bundles(dataset, path, metas)
    if not metas:
        raise DatasetError(
            f"dataset {dataset!r}: path {path.uri!r} must hold shards, got only a Zephon plan bundle — point the path "
            "at the dataset's objects (a plan is not data)"
        )
    listed = []
    for meta in sorted(metas, key=lambda m: m["path"]):
        child = path.child(meta["path"])
        etag = meta.get("e_tag")
        if detect_format(child.key) is not None and not etag:
            raise DatasetError(
                f"dataset {dataset!r}: object {child.uri} must have an ETag to be pinned, got none from the store "
                "— use a store that returns ETags"
            )
        remote = ObjectFile(
            path=child,
            size=int(meta["size"]),
            etag=quoted_etag(str(etag or "")),
            version=meta.get("version") or None,
            format=detect_format(child.key) or "",
        )
        listed.append(SourceFile(uri=child.uri, format="", size=remote.size, remote=remote))
    shards = shards_of(dataset, listed, directory=directory)
    remember_listing([f.remote for f in shards if isinstance(f.remote, ObjectFile)])
    return shards


def _outside_bundles(dataset: str, path: ObjectPath, metas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``metas`` less the objects of plan bundles (their files and ``selected/`` copies), a warning per bundle."""
    names: dict[str, set[str]] = {}
    for meta in metas:
        parent, _, name = str(meta["path"]).rpartition("/")
        names.setdefault(parent, set()).add(name)
    bundles = {parent for parent, found in names.items() if looks_like_bundle(found)}
    if not bundles:
        return metas
    for bundle in sorted(bundles):
        warn(
            f"dataset {dataset!r}: skipped the plan bundle {path.child(bundle + '/').uri} (a Zephon plan, not data) "
            "— move plans out of dataset prefixes"
        )

    def inside(key: str) -> bool:
        parent = key.rpartition("/")[0]
        return parent in bundles or parent.rpartition("/")[0] in bundles

    return [m for m in metas if not inside(str(m["path"]))]


def _hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/"))
