"""Node output is untrusted: clean its text once, check its shape before anything reads it.

A node (hostile, or just broken) decides every byte of what its tools print. Two things keep
that from reaching further than its own findings:

- ``clean_text`` / ``clean_tree``: every string, dictionary keys included, with each control
  character (C0, DEL, C1: ESC, NUL, VT, newline...), lone surrogate, Unicode line or paragraph
  separator and bidirectional override written as a visible escape (``\\x1b``, ``\\n``,
  ``\\u2028``), and cut to a length. Clean text cannot move the terminal's cursor, add a
  line to a table, make XML ill-formed or fail to encode as UTF-8; cleaning it again changes
  nothing.
- ``Shape`` (``Int``, ``Str``, ``Maybe``, ``ListOf``, ``MapOf``, ``Record``...): the types and
  nesting a reader relies on, checked before it reads; ``problem`` names the first value that
  does not fit by its path (``gpus[0].retired_pages.single_bit: 'x' is not an integer``).
- ``parse_json``: a node's JSON, refused (a ValueError, as for text that is not JSON) when it
  nests deeper than ``MAX_DEPTH``: Python's parser and every reader after it (copy.deepcopy,
  repr) recurse once per level, and a few kilobytes of brackets made a RecursionError, a
  crash where the section should be unreadable; ``nested_deeper_than`` says the same of a
  value already parsed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# Long enough for the longest text a rule compares whole (a firewall ruleset listing, a
# config file), short enough that one node cannot make the control side hold gigabytes.
MAX_FACT_TEXT_CHARS = 1 << 20
# What a report line can show of one value: an operator reads it, a table must stay a table.
MAX_REPORT_TEXT_CHARS = 1000
# Deeper than any report a tool prints; a hostile document nested deeper is not walked.
MAX_DEPTH = 32
CUT_MARK = " ...[cut]"
TOO_DEEP = "(nested too deep: not read)"

_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_BIDI_CONTROLS = [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C]
_UNSAFE = [
    *range(0x00, 0x20),  # C0: NUL, BEL, BS, TAB, LF, VT, FF, CR, ESC...
    *range(0x7F, 0xA0),  # DEL and C1 (CSI, NEL, OSC...)
    *range(0xD800, 0xE000),  # lone surrogates: not encodable as UTF-8
    0x2028,  # line separator
    0x2029,  # paragraph separator
    *_BIDI_CONTROLS,  # reorder what the terminal shows
]
_ESCAPES = {
    code: _NAMED_ESCAPES.get(chr(code), f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    for code in _UNSAFE
}


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def clean_text(text: str, limit: int = MAX_FACT_TEXT_CHARS) -> str:
    """``text`` with every unsafe character escaped, at most ``limit`` characters long."""
    if not text.isprintable():  # the fast path: printable text has nothing to escape
        text = text.translate(_ESCAPES)
        if not text.isprintable():  # the rarer rest: other spaces, format, unassigned
            text = "".join(char if char.isprintable() else _escape(char) for char in text)
    if len(text) > limit:
        text = text[: max(0, limit - len(CUT_MARK))] + CUT_MARK
    return text


def clean_tree(value: Any, limit: int = MAX_FACT_TEXT_CHARS, depth: int = 0) -> Any:
    """A copy of JSON-like data (dicts, lists, scalars) with every string cleaned.

    Tuples become lists; containers nested deeper than ``MAX_DEPTH`` become ``TOO_DEEP``,
    which no shape accepts where a reader looks.
    """
    if isinstance(value, str):
        return clean_text(value, limit)
    if isinstance(value, Mapping):
        if depth >= MAX_DEPTH:
            return TOO_DEEP
        cleaned: dict[Any, Any] = {}
        for key, item in value.items():
            name = clean_text(key, limit) if isinstance(key, str) else key
            cleaned.setdefault(name, clean_tree(item, limit, depth + 1))
        return cleaned
    if isinstance(value, list | tuple):
        if depth >= MAX_DEPTH:
            return TOO_DEEP
        return [clean_tree(item, limit, depth + 1) for item in value]
    return value


# --- JSON from a node ------------------------------------------------------------------------

# A JSON string (RFC 8259: no raw quote or backslash inside, an escape is a backslash and what
# follows), taken out before the brackets that nest are counted; then all but the brackets.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# An innermost array or object: each pass that takes them all away takes one level off.
_INNERMOST = re.compile(r"\[\]|\{\}")


class NestedTooDeep(json.JSONDecodeError):
    """A JSON document nested deeper than its readers walk: refused before it is parsed."""

    def __init__(self, max_depth: int, document: str) -> None:
        ValueError.__init__(self, f"nested deeper than {max_depth} levels: not read")
        self.max_depth = max_depth
        self.msg, self.doc, self.pos, self.lineno, self.colno = str(self), document, 0, 1, 1

    def __reduce__(self) -> Any:
        return NestedTooDeep, (self.max_depth, self.doc)


def parse_json(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)``; NestedTooDeep (a json.JSONDecodeError) where its arrays and
    objects nest deeper than ``max_depth``, found without recursion before it is parsed."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    for _ in range(max_depth):
        brackets, taken = _INNERMOST.subn("", brackets)
        if not taken:
            break
    if _INNERMOST.search(brackets):
        raise NestedTooDeep(max_depth, text)
    return json.loads(text)


def nested_deeper_than(value: Any, max_depth: int = MAX_DEPTH) -> bool:
    """Whether lists, tuples and dicts nest deeper than ``max_depth`` in ``value`` (walked
    without recursion, never below that depth)."""
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth >= max_depth:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


# --- shapes -----------------------------------------------------------------------------------


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


class Shape:
    """What a value must be for its reader; ``problem`` says where and why it is not."""

    description = "a value"

    def problem(self, value: Any, where: str = "") -> str | None:
        if self.fits(value):
            return None
        return f"{where or 'the value'}: {_show(value)} is not {self.description}"

    def fits(self, value: Any) -> bool:
        return True


class _Kind(Shape):
    def __init__(self, description: str, *types: type) -> None:
        self.description = description
        self.types = types

    def fits(self, value: Any) -> bool:
        # bool is an int to Python, never to a reader expecting a count.
        if isinstance(value, bool) and bool not in self.types:
            return False
        return isinstance(value, self.types)


Anything = Shape()
Int = _Kind("an integer", int)
Num = _Kind("a number", int, float)
Str = _Kind("a string", str)
Bool = _Kind("true or false", bool)


class Maybe(Shape):
    """None, or ``shape``."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.description = f"null or {shape.description}"

    def problem(self, value: Any, where: str = "") -> str | None:
        return None if value is None else self.shape.problem(value, where)


class ListOf(Shape):
    def __init__(self, item: Shape) -> None:
        self.item = item
        self.description = "a list"

    def problem(self, value: Any, where: str = "") -> str | None:
        if not isinstance(value, list):
            return super().problem(value, where)
        for position, item in enumerate(value):
            if found := self.item.problem(item, f"{where}[{position}]"):
                return found
        return None

    def fits(self, value: Any) -> bool:
        return isinstance(value, list)


class MapOf(Shape):
    """An object whose every key is a string and every value ``item``."""

    def __init__(self, item: Shape) -> None:
        self.item = item
        self.description = "an object"

    def problem(self, value: Any, where: str = "") -> str | None:
        if not isinstance(value, dict):
            return super().problem(value, where)
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where or 'the value'}: key {_show(key)} is not a string"
            if found := self.item.problem(item, _join(where, key)):
                return found
        return None

    def fits(self, value: Any) -> bool:
        return isinstance(value, dict)


class Record(Shape):
    """An object: each key of ``fields``, where present, fits its shape (a missing key reads as
    None, which readers handle); other keys fit ``rest``, by default anything."""

    def __init__(self, fields: Mapping[str, Shape], rest: Shape = Anything) -> None:
        self.fields = dict(fields)
        self.rest = rest
        self.description = "an object"

    def problem(self, value: Any, where: str = "") -> str | None:
        if not isinstance(value, dict):
            return super().problem(value, where)
        for key, item in value.items():
            shape = self.fields.get(key, self.rest) if isinstance(key, str) else self.rest
            if found := shape.problem(item, _join(where, str(key))):
                return found
        return None

    def fits(self, value: Any) -> bool:
        return isinstance(value, dict)
