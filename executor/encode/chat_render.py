"""Chat records to rendered conversations with the character spans the loss mask covers.

A record becomes a list of ``{role, content}`` messages by its layout (``ChatSpec.layout``):

* ``messages``: the field holds the list itself (roles ``system``, ``user``, ``assistant``, ``tool``);
* ``alpaca``: ``instruction``, optional ``input``, ``output`` → user ``instruction`` (a blank line, then
  ``input`` when it is not empty), assistant ``output``;
* ``sharegpt``: the field holds ``[{from, value}]`` with ``from`` in ``system``, ``human``/``user``,
  ``gpt``/``assistant``, ``tool``/``function``/``observation``.

The messages are rendered with the Jinja chat template (Hugging Face's conventions: ``messages``,
``bos_token``, ``eos_token``, ``add_generation_prompt``, ``raise_exception``, ``trim_blocks`` and
``lstrip_blocks``) in a sandbox, and the assistant spans found in one of two ways:

1. ``{% generation %}…{% endgeneration %}`` tags in the template mark the spans exactly (each block's output
   is fenced by two private-use characters while rendering, then the fences are removed);
2. otherwise, prefix diffing: for assistant turn ``i``, render the turns before it with
   ``add_generation_prompt=True`` (P) and the turns up to it (R); R must extend P and the whole conversation
   must extend R, and the span is R after P, less trailing whitespace (the template's separator between turns).

Invariant: with ``loss_on="assistant"`` a conversation yields at least one non-empty span, and the spans never
cover the whole text — a template that gives neither tags nor consistent prefixes is refused, never turned into
an all-zero or all-one mask.

Example, ChatML (``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per turn, generation prompt
``<|im_start|>assistant\\n``), messages user "Hi", assistant "Hello!": the text is
``<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n``; P ends with
``assistant\\n``, R is the whole text, so the span is ``Hello!<|im_end|>``.

Problems with a record are ``BadRecord`` (a skip reason and what was expected); the shard reader adds dataset,
shard and row (``zephon.executor.read.bad_documents``). Rendering runs where the reader runs: on the read-ahead
thread during training, in the count workers when planning.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from zephon.specs import ChatSpec

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
#: Skip reasons of chat records (``RunStats.skipped`` keys under ``on_bad_document="skip"``).
CHAT_SKIP_REASONS = ("bad_messages", "unknown_role", "empty_conversation", "no_assistant_turn", "template_error")
_OPEN, _CLOSE = "\ue000", "\ue001"
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
#: A word of a message's content, looked for in its rendering (``_shows_content``).
_WORD = re.compile(r"\w{3,}")
#: ``strftime_now`` in templates formats this fixed instant: a rendering must not depend on the day it runs.
FIXED_NOW = datetime(2024, 1, 1, tzinfo=UTC)


class BadRecord(Exception):
    """A record that cannot become a conversation: ``reason`` (a skip reason) and ``expected`` ("X must be Y,
    got Z — fix", without the location)."""

    def __init__(self, reason: str, expected: str) -> None:
        super().__init__(expected)
        self.reason = reason
        self.expected = expected


@dataclass(frozen=True, slots=True)
class RenderedChat:
    """A conversation rendered to text, and the ``(start, end)`` character spans under the loss mask."""

    text: str
    spans: tuple[tuple[int, int], ...]


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _content(value: object, where: str) -> str:
    if not isinstance(value, str):
        if isinstance(value, list) and value and all(isinstance(p, dict) and "type" in p for p in value):
            raise BadRecord(  # the OpenAI / Hugging Face multimodal shape: its text is for the user to join
                "bad_messages",
                f"{where} must be a string, got a list of {len(value)} content part(s) ({{type, ...}}) — join the "
                "text parts into one string in a map_transform (docs/operators.md, content parts)",
            )
        raise BadRecord("bad_messages", f"{where} must be a string, got {_kind(value)} — fix the record")
    return value


def to_messages(record: dict[str, Any], spec: ChatSpec, field: str) -> list[dict[str, str]]:
    """The record's messages by ``spec.layout``, checked: a non-empty list of ``{role, content}`` strings."""
    if spec.layout == "alpaca":
        instruction = _content(record.get("instruction"), "alpaca column 'instruction'")
        output = _content(record.get("output"), "alpaca column 'output'")
        extra = record.get("input")
        if extra is not None and not isinstance(extra, str):
            raise BadRecord("bad_messages", f"alpaca column 'input' must be a string, got {_kind(extra)} — fix it")
        prompt = f"{instruction}\n\n{extra}" if extra else instruction
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    turns = record.get(field)
    key_role, key_content = ("from", "value") if spec.layout == "sharegpt" else ("role", "content")
    shape = f"a list of {{{key_role}, {key_content}}} objects"
    if not isinstance(turns, list):
        if turns is None and field not in record:
            raise BadRecord(
                "bad_messages",
                f"field {field!r} must be {shape}, got a record without it (keys {sorted(record)}) — name the "
                "conversation's key as the chat field (field=), or choose the layout that fits it (layout='sharegpt' "
                "for turns of {from, value})",
            )
        raise BadRecord("bad_messages", f"field {field!r} must be {shape}, got {_kind(turns)} — fix the record")
    if not turns:
        raise BadRecord(
            "empty_conversation",
            f"field {field!r} must hold at least one message, got an empty list — drop or fix the record",
        )
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or key_role not in turn or key_content not in turn:
            got = sorted(turn) if isinstance(turn, dict) else _kind(turn)
            raise BadRecord(
                "bad_messages",
                f"field {field!r} message {i} must be {{{key_role}, {key_content}}}, got {got} — fix the record "
                + ("or use layout='sharegpt'" if got == ["from", "value"] else "or the layout"),
            )
        role = turn[key_role]
        if spec.layout == "sharegpt":
            mapped = SHAREGPT_ROLES.get(role) if isinstance(role, str) else None
            if mapped is None:
                raise BadRecord(
                    "unknown_role",
                    f"field {field!r} message {i} 'from' must be one of {', '.join(SHAREGPT_ROLES)}, got {role!r} "
                    "— fix the record",
                )
            role = mapped
        elif role not in ROLES:
            raise BadRecord(
                "unknown_role",
                f"field {field!r} message {i} role must be one of {', '.join(ROLES)}, got {role!r} — fix the record",
            )
        text = _content(turn[key_content], f"field {field!r} message {i} {key_content}")
        if _OPEN in text or _CLOSE in text:
            raise BadRecord(
                "bad_messages", f"field {field!r} message {i} must not hold U+E000/U+E001, got one — remove them"
            )
        out.append({"role": role, "content": text})
    return out


class _Generation(Extension):
    """``{% generation %}…{% endgeneration %}``: the block's output, fenced so its span can be found."""

    tags = {"generation"}  # noqa: RUF012  # jinja2's Extension API

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_fence"), [], [], body).set_lineno(lineno)

    def _fence(self, caller: Any) -> str:
        return f"{_OPEN}{caller()}{_CLOSE}"


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """Hugging Face's ``tojson`` filter: not HTML-escaped, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = FIXED_NOW.strftime
    return env


class ChatRenderer:
    """Renders conversations with one template and finds their assistant spans (see the module docstring)."""

    def __init__(self, template: str, spec: ChatSpec, specials: dict[str, str]) -> None:
        self.spec = spec
        self.tagged = _GENERATION_TAG.search(template) is not None
        try:
            self._template = _environment().from_string(template)
        except TemplateError as exc:
            raise BadRecord("template_error", f"chat_template must be valid Jinja, got {exc}") from exc
        self._specials = {k: specials.get(k, "") for k in ("bos_token", "eos_token", "pad_token", "unk_token")}

    def _render(self, messages: list[dict[str, str]], prompt: bool) -> str:
        try:
            return self._template.render(messages=messages, add_generation_prompt=prompt, **self._specials)
        except Exception as exc:  # a template raises anything: raise_exception, TypeError, UndefinedError
            raise BadRecord(
                "template_error",
                f"the chat template must render the conversation, got {type(exc).__name__}: {exc} — fix the record "
                "or the template",
            ) from exc

    def render(self, messages: list[dict[str, str]]) -> RenderedChat:
        """The conversation's text and loss spans (``loss_on="all"``: the whole text)."""
        raw = self._render(messages, False)
        text, spans = _unfence(raw)
        if not _shows_content(messages, text):
            raise BadRecord(
                "template_error",
                f"the chat template must render the messages' content, got a rendering without any of it "
                f"({text[:60]!r}) — does it read another key (m.text for m.content, which Jinja renders as "
                "nothing)? fix the template",
            )
        if self.spec.loss_on == "all":
            return RenderedChat(text, ((0, len(text)),) if text else ())
        if not any(m["role"] == "assistant" for m in messages):
            raise BadRecord(
                "no_assistant_turn",
                "a conversation must have an assistant turn to train on with loss_on='assistant', got none — "
                "drop such records or use loss_on='all'",
            )
        if not self.tagged:
            spans = self._diff_spans(messages, text)
        spans = tuple((a, b) for a, b in spans if b > a)
        if not spans:
            raise BadRecord(
                "template_error",
                "the chat template must show the assistant turns, got no assistant text in its rendering — add "
                "{% generation %} tags to the template or use loss_on='all'",
            )
        if spans == ((0, len(text)),):
            raise BadRecord(
                "template_error",
                "the assistant spans must leave the prompt out, got the whole conversation — fix the "
                "{% generation %} tags or use loss_on='all'",
            )
        return RenderedChat(text, spans)

    def _diff_spans(self, messages: list[dict[str, str]], text: str) -> tuple[tuple[int, int], ...]:
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = _unfence(self._render(messages[:i], True))[0]  # i == 0 too: a default system prompt
            upto = _unfence(self._render(messages[: i + 1], False))[0]
            if not upto.startswith(before) or not text.startswith(upto):
                raise BadRecord(
                    "template_error",
                    f"the chat template must render each turn as a prefix of the next to find assistant turn {i} "
                    "without {% generation %} tags, got a rendering that changes earlier turns — add {% generation "
                    "%} tags to the template or use loss_on='all'",
                )
            end = len(upto.rstrip())
            spans.append((len(before), max(end, len(before))))
        return tuple(spans)


def _shows_content(messages: list[dict[str, str]], text: str) -> bool:
    """Whether ``text`` holds a word (3 or more word characters, case aside) of some message's content — what any
    template that renders the conversation does, whatever it trims or drops; True when no message has such a word.
    A template reading a key the messages lack renders nothing for it and fails this."""
    folded = text.casefold()
    words = (w.group() for m in messages for w in _WORD.finditer(m["content"].casefold()))
    first = next(words, None)
    return first is None or first in folded or any(w in folded for w in words)


def _unfence(raw: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The text without generation fences, and the spans they enclosed (nested fences count once)."""
    if _OPEN not in raw:
        return raw.replace(_CLOSE, ""), ()
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    at, depth, opened = 0, 0, 0
    for piece in re.split(f"([{_OPEN}{_CLOSE}])", raw):
        if piece == _OPEN:
            depth += 1
            if depth == 1:
                opened = at
        elif piece == _CLOSE:
            depth = max(0, depth - 1)
            if depth == 0:
                spans.append((opened, at))
        else:
            out.append(piece)
            at += len(piece)
    return "".join(out), tuple(spans)
