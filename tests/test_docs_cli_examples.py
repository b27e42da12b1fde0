"""The fenced CLI examples of docs/cli.md and README.md run, and print what the docs show.

How the examples are marked (docs/cli.md, "Examples", says the same for readers):

* A ```` ```console ```` block is a terminal session. A line ``$ COMMAND`` is a command (a line ending in
  `` \\`` continues it on the next one); the lines after it, up to the next command, are exactly what it
  prints (stdout and stderr, as a terminal shows them), where a line ``...`` stands for any number of lines.
  Hex strings of 12 digits or more (config hashes, fingerprints) match any hex string of their length: they
  depend on where the data lies. A command must exit 0, unless the next command is ``echo $?``, whose shown
  output is the exit status.
* A ```` ```yaml file=NAME ```` block is the file NAME, written before the commands that follow it run.

Each document is one session in its own directory, in document order. ``zephon ...`` commands (also
``echo TEXT | zephon ...``) run in-process with click's ``CliRunner``; other commands (``python -c``, ``cp``,
``sed``) run with bash in that directory. README.md's session starts from what docs/cli.md's examples set up
first (the demo dataset, the demo tokenizer, the ``file=`` blocks).

Any other fenced block in these documents that holds a ``zephon`` command must be a synopsis (placeholders
such as ``PLAN_DIR`` or ``[--workers N]``), so an example cannot slip in unmarked and untested.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from zephon.cli import cli

REPO = Path(__file__).resolve().parents[1]
CLI_DOC = REPO / "docs" / "cli.md"
README = REPO / "README.md"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
_HEX = re.compile(r"(?<![0-9a-f])[0-9a-f]{12,}(?![0-9a-f])")
_PIPED = re.compile(r"echo (?P<text>.+?) \| (?P<command>zephon .*)")
_PLACEHOLDER = re.compile(r"\[|\b[A-Z][A-Z_]+\b")


@dataclass(frozen=True, slots=True)
class Block:
    """A fenced block: its info string (``console``, ``yaml file=config.yaml``), its lines, where it starts."""

    info: str
    lines: tuple[str, ...]
    line: int


@dataclass(slots=True)
class Command:
    text: str
    line: int
    output: list[str] = field(default_factory=list)


def fenced_blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in _FENCE.finditer(text):
        indent = match.group("indent")
        lines = tuple(line.removeprefix(indent) for line in match.group("body").splitlines())
        blocks.append(Block(match.group("info").strip(), lines, text.count("\n", 0, match.start()) + 1))
    return blocks


def session(block: Block) -> list[Command]:
    """The commands of a ``console`` block, each with the output shown under it."""
    commands: list[Command] = []
    pending: Command | None = None
    for offset, line in enumerate(block.lines, start=block.line + 1):
        if pending is not None:  # a continued command
            pending.text += " " + line.strip().removesuffix("\\").strip()
            if not line.endswith("\\"):
                pending = None
        elif line.startswith("$ "):
            commands.append(Command(line[2:].removesuffix("\\").strip(), offset))
            if line.endswith("\\"):
                pending = commands[-1]
        else:
            assert commands, f"line {offset}: a console block must start with a `$ ` command, got {line!r}"
            commands[-1].output.append(line)
    return commands


def _masked(line: str) -> str:
    return _HEX.sub(lambda m: "#" * len(m.group()), line.rstrip())


def matches(expected: list[str], printed: str) -> bool:
    """Whether ``printed`` is ``expected`` line for line, ``...`` lines standing for any lines."""
    pattern = "".join(
        r"(?:[^\n]*\n)*?" if line.strip() == "..." else re.escape(_masked(line)) + "\n" for line in expected
    )
    actual = "".join(_masked(line) + "\n" for line in printed.splitlines())
    return re.fullmatch(pattern, actual) is not None


def run(command: str, cwd: Path) -> tuple[int, str]:
    """Run one documented command in ``cwd``: exit status and what it printed."""
    piped = _PIPED.fullmatch(command)
    if command.startswith("zephon ") or piped:
        text = piped.group("command") if piped else command
        stdin = " ".join(shlex.split(piped.group("text"))) + "\n" if piped else None
        result = CliRunner().invoke(cli, shlex.split(text)[1:], input=stdin, prog_name="zephon")
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"`{command}` raised {result.exception!r}") from result.exception
        return result.exit_code, result.output
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def run_document(path: Path, cwd: Path, blocks: list[Block] | None = None) -> int:
    """Run every example of ``path`` (or of ``blocks``) in ``cwd``; return how many commands ran."""
    ran = 0
    for block in fenced_blocks(path) if blocks is None else blocks:
        language, _, attributes = block.info.partition(" ")
        if attributes.startswith("file="):
            (cwd / attributes.removeprefix("file=")).write_text("\n".join(block.lines) + "\n", encoding="utf-8")
            continue
        if language != "console":
            continue
        commands = session(block)
        status = 0
        for i, command in enumerate(commands):
            where = f"{path.name}:{command.line}: `{command.text}`"
            if command.text == "echo $?":
                printed = f"{status}\n"
            else:
                status, printed = run(command.text, cwd)
                checked_next = i + 1 < len(commands) and commands[i + 1].text == "echo $?"
                assert status == 0 or checked_next, f"{where} exited {status} (show `$ echo $?` after it):\n{printed}"
            assert matches(command.output, printed), (
                f"{where} printed what the document does not show — update the document or the code.\n"
                f"--- printed:\n{printed}--- shown:\n" + "\n".join(command.output)
            )
            ran += 1
    return ran


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cli_doc_examples_run_and_print_what_the_doc_shows(workdir: Path) -> None:
    ran = run_document(CLI_DOC, workdir)
    assert ran >= 25, f"docs/cli.md must keep its console examples, ran only {ran}"


def test_readme_commands_run(workdir: Path) -> None:
    setup = [b for b in fenced_blocks(CLI_DOC) if b.info.startswith("yaml file=")]
    demo = next(b for b in fenced_blocks(CLI_DOC) if b.info == "console" and "write_demo_dataset" in "".join(b.lines))
    run_document(CLI_DOC, workdir, [demo, *setup])
    assert run_document(README, workdir) >= 2


def unmarked_examples(path: Path) -> list[str]:
    """``zephon`` command lines in fenced blocks other than ``console`` that are not synopses."""
    found = []
    for block in fenced_blocks(path):
        if block.info == "console":
            continue
        for line in block.lines:
            unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", line)
            if re.match(r"\s*(\$ )?zephon ", line) and not _PLACEHOLDER.search(unquoted):
                found.append(f"{path.name}:{block.line}: {line.strip()}")
    return found


@pytest.mark.parametrize("path", [CLI_DOC, README], ids=["cli.md", "README.md"])
def test_every_zephon_example_is_marked(path: Path) -> None:
    assert unmarked_examples(path) == [], (
        "these are examples outside a ```console block — mark them ```console (with `$ ` and their output) so "
        "tests/test_docs_cli_examples.py runs them, or write them as synopses with placeholders"
    )


def test_an_unmarked_example_is_found(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```\nzephon plan CONFIG -o PLAN_DIR [--overwrite]\n```\n\n"
        '```sh\nzephon sql plans/demo "SELECT 1"\n```\n\n'
        "```console\n$ zephon --version\nzephon 0.1.0\n```\n",
        encoding="utf-8",
    )
    assert unmarked_examples(doc) == ['doc.md:5: zephon sql plans/demo "SELECT 1"']


def test_output_matching() -> None:
    assert matches(["a", "...", "d"], "a\nb\nc\nd\n")
    assert matches(["a", "...", "b"], "a\nb\n")
    assert not matches(["a", "d"], "a\nb\nd\n")
    assert not matches([], "something\n")
    assert matches(["config 0123456789ab"], "config fedcba987654\n")
    assert not matches(["config 0123456789ab"], "config fedcba98765\n")
    block = Block("console", ("$ zephon sql p \\", '  "SELECT 1"', "x", "$ echo $?", "0"), 1)
    assert [(c.text, c.output) for c in session(block)] == [('zephon sql p "SELECT 1"', ["x"]), ("echo $?", ["0"])]
