"""One size text, one number of bytes, in the planner and the executor (``zephon.checks.size_bytes``): SI units are
powers of 1000 as DuckDB reads its ``memory_limit``, IEC units powers of 1024, a plain number bytes."""

from __future__ import annotations

import duckdb
import pytest

from zephon.checks import size_bytes, size_setting
from zephon.errors import ConfigError
from zephon.executor.read.memory_release import release_slack
from zephon.executor.read.spill import budget
from zephon.planner.selection.results import duckdb_limit, memory_bytes


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2GB", 2 * 10**9),
        ("2G", 2 * 10**9),
        ("2 gb", 2 * 10**9),
        ("1.5GB", 1_500_000_000),
        ("2GiB", 2 << 30),
        (" 1.5 GiB ", 3 << 29),
        ("512MB", 512 * 10**6),
        ("512MiB", 512 << 20),
        ("300KB", 300_000),
        ("300KiB", 307_200),
        ("1TB", 10**12),
        ("1TiB", 1 << 40),
        ("1000000", 1_000_000),
        ("1000000B", 1_000_000),
    ],
)
def test_a_size_reads_as_duckdb_reads_it_in_every_layer(text: str, size: int, monkeypatch) -> None:
    assert size_bytes(text) == size
    assert memory_bytes(text) == size  # the planner's ZEPHON_SELECT_MEMORY arithmetic
    monkeypatch.setenv("ZEPHON_RELEASE_MEMORY", text)
    assert release_slack() == size  # the executor's settings read it alike
    monkeypatch.setenv("ZEPHON_DECODED_MEMORY", text)
    assert budget() == size
    con = duckdb.connect()  # and DuckDB is given exactly those bytes
    con.execute(f"SET memory_limit = '{duckdb_limit(text)}'")
    ours = con.execute("SELECT current_setting('memory_limit')").fetchone()
    if text != "1000000":  # DuckDB's own parser refuses a plain number (not "1000000B"): compare every other text
        con.execute(f"SET memory_limit = '{text.strip()}'")
        assert con.execute("SELECT current_setting('memory_limit')").fetchone() == ours


@pytest.mark.parametrize("text", ["lots", "2GX", "GB", "-1GB", "1e9", "2 Gigs", ""])
def test_a_text_that_is_not_a_size_is_refused_in_one_line(text: str) -> None:
    assert size_bytes(text) is None
    with pytest.raises(ConfigError, match=r"^ZEPHON_SELECT_MEMORY must be a size such as 2GB or 512MiB \(GB = 10\^9 "):
        memory_bytes(text)
    with pytest.raises(ConfigError) as raised:
        size_setting("ZEPHON_RELEASE_MEMORY", text, {"on": 1, "off": None}, "256MiB")
    assert str(raised.value) == (
        f'ZEPHON_RELEASE_MEMORY must be a size such as 256MiB (GB = 10^9 bytes, GiB = 2^30), or "on" or "off", '
        f"got {text.strip()!r} — unset it or set one"
    )
