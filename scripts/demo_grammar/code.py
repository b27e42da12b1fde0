"""Code documents: Python-like snippets that parse (``ast.parse``) but are not meant to run.

A snippet is optional imports and a constant, then 1-3 units, each a function or a class with 1-3 methods.
Bodies nest assignments, ``for`` loops, ``if``/``else`` and calls up to three levels deep; names come from the
vocabulary (``code_verbs``, ``code_name_suffixes``, nouns, adjectives) and comments and docstrings are
clauses of :mod:`demo_grammar.prose`. Python syntax (operators, comparisons, literals, type annotations)
stays here; the words are in ``vocabulary.json``.
"""

from __future__ import annotations

from demo_grammar.draw import Draw
from demo_grammar.prose import clause
from demo_grammar.vocabulary import ADJECTIVES, NOUNS, WORDS, capitalize, plural

__all__ = ["code_document"]

_OPS = ("+", "-", "*", "//", "%")
_COMPARE = ("<", ">", "<=", ">=", "==", "!=")
_CONSTANTS = ("None", "True", "False", "[]", "{}")
_TYPES = ("int", "str", "float", "list[int]", "dict[str, int]")


def _ident(d: Draw) -> str:
    noun = d.word(NOUNS)
    roll = d.u()
    if roll < 0.5:
        return noun
    if roll < 0.8:
        return f"{d.word(ADJECTIVES)}_{noun}"
    return f"{noun}_{d.one(WORDS.code_name_suffixes)}"


def _func_name(d: Draw) -> str:
    noun = d.word(NOUNS)
    return f"{d.one(WORDS.code_verbs)}_{plural(noun) if d.chance(0.2) else noun}"


def _literal(d: Draw) -> str:
    roll = d.u()
    if roll < 0.45:
        return str(d.int(0, 9))
    if roll < 0.75:
        return str(d.log_int(10, 100000))
    if roll < 0.85:
        return f"{d.int(0, 99)}.{d.int(0, 999):03d}"
    if roll < 0.95:
        return repr(d.word(NOUNS))
    return d.one(_CONSTANTS)


def _expr(d: Draw, names: list[str]) -> str:
    left = d.one(names) if names and d.chance(0.7) else _literal(d)
    roll = d.u()
    if roll < 0.4:
        return left
    if roll < 0.7:
        return f"{left} {d.one(_OPS)} {_literal(d) if d.chance(0.6) or not names else d.one(names)}"
    if roll < 0.85:
        return f"len({d.one(names) if names else _ident(d)})"
    return f"{_func_name(d)}({left})"


def _comment(d: Draw) -> str:
    roll = d.u()
    if roll < 0.15:
        return f"# TODO: {d.one(WORDS.code_verbs)} the {d.word(NOUNS)} before {d.int(2, 9)} retries"
    text = clause(d, in_past=False)
    return f"# {capitalize(text)}."


def _block(d: Draw, indent: int, names: list[str], lines: list[str], depth: int, budget: int) -> None:
    pad = "    " * indent
    start = len(lines)
    for _ in range(d.int(1, 4 if depth else 6)):
        if len(lines) >= budget:
            break
        roll = d.u()
        if roll < 0.15:
            lines.append(pad + _comment(d))
        elif roll < 0.45 or depth >= 3:
            name = _ident(d)
            op = " += " if name in names and d.chance(0.5) else " = "
            lines.append(f"{pad}{name}{op}{_expr(d, names)}")
            names.append(name)
        elif roll < 0.6:
            var = d.one(WORDS.code_loop_variables)
            lines.append(f"{pad}for {var} in range({d.int(1, 64)}):")
            _block(d, indent + 1, [*names, var], lines, depth + 1, budget)
        elif roll < 0.72 and names:
            item = _ident(d)
            lines.append(f"{pad}for {item} in {d.one(names)}:")
            _block(d, indent + 1, [*names, item], lines, depth + 1, budget)
        elif roll < 0.88:
            cond = f"{_expr(d, names)} {d.one(_COMPARE)} {_literal(d)}"
            lines.append(f"{pad}if {cond}:")
            _block(d, indent + 1, names, lines, depth + 1, budget)
            if d.chance(0.35):
                lines.append(f"{pad}else:")
                _block(d, indent + 1, names, lines, depth + 1, budget)
        else:
            call = f"{_func_name(d)}({', '.join(d.one(names) for _ in range(d.int(0, 2))) if names else ''})"
            lines.append(pad + call)
    if len(lines) == start or all(line.lstrip().startswith("#") for line in lines[start:]):
        lines.append(f"{pad}{_ident(d)} = {_expr(d, names)}" if depth < 2 or d.chance(0.5) else f"{pad}pass")


def _function(d: Draw, indent: int, lines: list[str], *, method: bool) -> None:
    pad = "    " * indent
    args = [_ident(d) for _ in range(d.int(0, 3))]
    sig_args = (["self"] if method else []) + [f"{a}: {d.one(_TYPES)}" if d.chance(0.4) else a for a in args]
    lines.append(f"{pad}def {_func_name(d)}({', '.join(sig_args)}):")
    if d.chance(0.6):
        lines.append(f'{pad}    """{capitalize(clause(d, in_past=False))}."""')
    names = list(args)
    _block(d, indent + 1, names, lines, 0, len(lines) + d.log_int(3, 40))
    lines.append(f"{pad}    return {_expr(d, names)}")


def code_document(d: Draw) -> str:
    """One snippet, newline-terminated."""
    lines: list[str] = []
    if d.chance(0.5):
        for module in sorted({d.one(WORDS.code_modules) for _ in range(d.int(1, 3))}):
            lines.append(f"import {module}")
        lines.extend(["", ""])
    if d.chance(0.3):
        lines.append(f"{_ident(d).upper()} = {d.log_int(2, 65536)}")
        lines.extend(["", ""])
    for unit in range(d.int(1, 3)):
        if unit:
            lines.extend(["", ""])
        if d.chance(0.25):
            lines.append(f"class {capitalize(d.word(ADJECTIVES))}{capitalize(d.word(NOUNS))}:")
            for m in range(d.int(1, 3)):
                if m:
                    lines.append("")
                _function(d, 1, lines, method=True)
        else:
            _function(d, 0, lines, method=False)
    return "\n".join(lines) + "\n"
