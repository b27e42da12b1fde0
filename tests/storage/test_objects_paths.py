"""Object-store paths, globs and settings, without a server: the spellings users paste, one-line refusals,
credentials that never show in a repr, and which override covers which object."""

from __future__ import annotations

import pytest

from zephon.errors import ConfigError, DatasetError
from zephon.specs import StoreCredentials, StoreOptions
from zephon.storage.objects.paths import ObjectPath, is_object_uri, parse_object_path
from zephon.storage.objects.stores import settings_for


@pytest.mark.parametrize(
    ("text", "uri", "account"),
    [
        ("s3://corpus/web/a.parquet", "s3://corpus/web/a.parquet", None),
        ("s3a://corpus/web/", "s3://corpus/web/", None),
        ("gcs://corpus/web/*.parquet", "gs://corpus/web/*.parquet", None),
        ("gs://corpus", "gs://corpus/", None),
        ("abfss://data@acct1.dfs.core.windows.net/web/x.jsonl", "az://data/web/x.jsonl", "acct1"),
        ("azure://data/web/", "az://data/web/", None),
    ],
)
def test_every_spelling_becomes_one_canonical_uri(text: str, uri: str, account: str | None) -> None:
    path = parse_object_path(text)
    assert path.uri == uri and path.account == account and is_object_uri(path.uri)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s3:///web/", r"path must name a bucket \(or container\) without wildcards, got ''"),
        ("s3://buck*/web/", r"path must name a bucket \(or container\) without wildcards, got 'buck\*'"),
        ("s3://b/web//x.parquet", r"path keys must not hold empty, '\.' or '\.\.' segments"),
        ("s3://b/web/../x.parquet", r"path keys must not hold empty"),
        ("abfs://data@not a host/x", r"path must be abfs://CONTAINER@ACCOUNT\.dfs\.core\.windows\.net/KEY"),
    ],
)
def test_malformed_paths_are_one_line(text: str, message: str) -> None:
    with pytest.raises(DatasetError, match=rf"^dataset 'web': {message}"):
        parse_object_path(text, "web")


def test_globs_follow_pythons_rules_on_keys() -> None:
    path = ObjectPath(cloud="s3", bucket="b", key="web/**/part-[0-2]?.parquet")
    assert path.listing_prefix() == "web/"
    match = path.matcher().match
    assert match("web/part-01.parquet") and match("web/2024/05/part-29.parquet")
    assert not match("web/part-31.parquet") and not match("web/part-1.parquet") and not match("other/part-01.parquet")
    star = ObjectPath(cloud="s3", bucket="b", key="web/*.jsonl").matcher().match
    assert star("web/a.jsonl") and not star("web/sub/a.jsonl")
    assert ObjectPath(cloud="s3", bucket="b", key="w*b/x").listing_prefix() == ""


def test_credentials_never_show_their_values() -> None:
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    cred = StoreCredentials(prefix="s3://team-b", env={"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": secret})
    options = StoreOptions(credentials=(cred,))
    for text in (repr(cred), str(cred), repr(options), str(options)):
        assert secret not in text and "AKIA" not in text
    assert "AWS_SECRET_ACCESS_KEY" in repr(cred)
    with pytest.raises(ConfigError, match=r"StoreCredentials.env for s3://team-b must map the clouds' variables"):
        StoreCredentials(prefix="s3://team-b", env={"AWS_SECRET": "x"})
    with pytest.raises(ConfigError, match=r"StoreCredentials.prefix must be s3://BUCKET"):
        StoreCredentials(prefix="/local/dir", env={})
    with pytest.raises(ConfigError, match=r'StoreOptions.remote_read must be "auto", "cache" or "range", got \'ranges\''):
        StoreOptions(remote_read="ranges")


def test_the_longest_covering_prefix_wins_and_replaces_the_whole_environment(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")
    bucket = StoreCredentials(prefix="s3://corpus", env={"AWS_ACCESS_KEY_ID": "bucket-key"})
    deeper = StoreCredentials(prefix="s3://corpus/private/", env={"AWS_ACCESS_KEY_ID": "private-key"})
    creds = (bucket, deeper)
    assert settings_for(parse_object_path("s3://corpus/private/a.parquet"), creds) == {
        "AWS_ACCESS_KEY_ID": "private-key"
    }
    # The override replaces the environment: the environment's session token is not inherited.
    assert settings_for(parse_object_path("s3://corpus/public/a.parquet"), creds) == {"AWS_ACCESS_KEY_ID": "bucket-key"}
    assert settings_for(parse_object_path("s3://corpusx/a.parquet"), creds)["AWS_ACCESS_KEY_ID"] == "env-key"
    assert settings_for(parse_object_path("gs://corpus/a.parquet"), creds) == {}
