"""A corpus of real text from this machine's own files, for ``bench_executor.py --corpus local``.

The demo corpus is generated; tokenizer speed depends on the text, so the benchmark can also run on text
people wrote. With no network, the real text at hand is what the OS and Python installations ship:

* ``prose`` — Markdown, reStructuredText and plain-text files (READMEs, changelogs, licences, manuals) under
  ``/usr/share/doc`` and the Python installation, split at blank lines into documents of about 2 KB or more;
* ``code`` — the Python installation's ``.py`` files (standard library and site-packages), one per document;
* ``short`` — the first paragraph of every docstring in those ``.py`` files (20-400 characters).

Files are visited in sorted path order and each kind is capped (``limit`` documents, ``code_limit`` for
code, whose files are long), so a machine gives the
same corpus every time (another machine gives another one: the benchmark prints its size). Files that are not
UTF-8 or fail to parse are left out. Shards: ``OUT/{kind}/part-NNNNN.parquet``, 2,000 documents each, a
``text`` column, zstd.
"""

from __future__ import annotations

import ast
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SHARD_ROWS = 2_000
PROSE_SUFFIXES = (".md", ".rst", ".txt")


def _files(roots: list[Path], suffixes: tuple[str, ...], lo: int, hi: int) -> Iterator[Path]:
    seen: set[Path] = set()
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix in suffixes and path.is_file() and not path.is_symlink() and lo <= path.stat().st_size <= hi:
                real = path.resolve()
                if real not in seen:
                    seen.add(real)
                    yield path


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def _prose(roots: list[Path]) -> Iterator[str]:
    for path in _files(roots, PROSE_SUFFIXES, 1_024, 512 * 1024):
        text = _text(path)
        if text is None:
            continue
        doc: list[str] = []
        size = 0
        for para in text.split("\n\n"):
            doc.append(para)
            size += len(para)
            if size >= 2_048:
                yield "\n\n".join(doc)
                doc, size = [], 0
        if size >= 256:
            yield "\n\n".join(doc)


def _code_and_docstrings(roots: list[Path]) -> Iterator[tuple[str, list[str]]]:
    for path in _files(roots, (".py",), 1_024, 256 * 1024):
        text = _text(path)
        if text is None:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        docs = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    first = doc.split("\n\n", 1)[0].strip()
                    if 20 <= len(first) <= 400:
                        docs.append(first)
        yield text, docs


def _write(out: Path, kind: str, docs: list[str]) -> None:
    (out / kind).mkdir(parents=True, exist_ok=True)
    for k, start in enumerate(range(0, len(docs), SHARD_ROWS)):
        table = pa.table({"text": docs[start : start + SHARD_ROWS]})
        pq.write_table(table, out / kind / f"part-{k:05d}.parquet", compression="zstd")


def build(out: Path, *, limit: int = 40_000, code_limit: int = 8_000) -> Path:
    """Write the corpus under ``out`` (once: an existing one is reused) and return ``out``."""
    if (out / "done").is_file():
        return out
    python = Path(sysconfig.get_paths()["stdlib"])
    prose: list[str] = []
    for doc in _prose([Path("/usr/share/doc"), python]):
        prose.append(doc)
        if len(prose) >= limit:
            break
    code: list[str] = []
    short: list[str] = []
    for text, docs in _code_and_docstrings([python]):
        if len(code) < code_limit:
            code.append(text)
        short += docs[: max(0, limit - len(short))]
        if len(code) >= code_limit and len(short) >= limit:
            break
    for kind, docs in (("prose", prose), ("code", code), ("short", short)):
        if not docs:
            raise RuntimeError(f"local corpus: no {kind} documents found on this machine")
        _write(out, kind, docs)
    (out / "done").write_text(f"prose {len(prose)}\ncode {len(code)}\nshort {len(short)}\n")
    return out


def repeated(base: Path, out: Path, times: int) -> Path:
    """``out/{kind}/``: the shards of ``base`` ``times`` times over (hard links, renumbered), so a corpus of real
    text can grow for ``bench_executor.py``'s second size (peak RSS flat in dataset size); ``times == 1``:
    ``base`` itself."""
    if times == 1:
        return base
    if (out / "done").is_file():
        return out
    for kind_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        shards = sorted(kind_dir.glob("*.parquet"))
        (out / kind_dir.name).mkdir(parents=True, exist_ok=True)
        for k in range(times):
            for i, shard in enumerate(shards):
                target = out / kind_dir.name / f"part-{k * len(shards) + i:05d}.parquet"
                if not target.exists():
                    target.hardlink_to(shard)
    (out / "done").write_text(f"{times} x {base}\n")
    return out
