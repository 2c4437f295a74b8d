"""A small typed-schema engine: builds frozen dataclasses from untrusted inventory data.

Every problem is collected (not just the first), each naming the key path, the bad value and
what is accepted, so an operator fixes a whole inventory in one pass.
"""

from __future__ import annotations

import dataclasses
import re
import types
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from gpunode.sanitize import clean_text

T = TypeVar("T")

# A field check returns None when the value is fine, else the reason it is not.
Check = Callable[[Any], str | None]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one key of one host's data."""

    key: str
    value: Any
    reason: str
    accepted: str

    def render(self, inventory: str, host: str) -> str:
        """One line for the operator's terminal: every part is inventory data, so no part
        may carry a control character (an ESC sequence, a newline forging another line)."""
        shown = repr(self.value)
        if len(shown) > 72:
            shown = shown[:60] + "...(truncated)"
        return clean_text(
            f"{inventory}: host {host}: {self.key} = {shown}: {self.reason}; "
            f"accepted: {self.accepted}"
        )


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions and swaps of
    two neighbouring characters each count one (``drvier`` is one edit from ``driver``)."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[len(b)]


# A typo is one or two edits away; a key shorter than that many letters is not a typo of
# anything (``ab`` is two edits from every two-letter key).
MAX_TYPO_EDITS = 2


def unknown_key(key: str, known: Sequence[str]) -> str:
    """The reason an unknown key is refused, with the known keys one or two edits away:
    ``unknown key (did you mean 'port'?)``."""
    if not isinstance(key, str):
        return "unknown key"
    distances = {name: edit_distance(key, name) for name in known}
    limit = min(MAX_TYPO_EDITS, len(key) - 1)
    best = min((d for d in distances.values() if d <= limit), default=None)
    if best is None:
        return "unknown key"
    close = [f"{name!r}" for name in sorted(known) if distances[name] == best]
    return f"unknown key (did you mean {' or '.join(close)}?)"


def unprintable_character(text: str) -> str | None:
    """Why ``text`` may not reach a node or a terminal, or None if it may.

    Refused anywhere in inventory data: C0 controls (newline, tab, ESC, NUL), DEL, C1
    controls, the Unicode line and paragraph separators, lone surrogates, format characters
    (bidirectional overrides that make text read differently from what it is), unassigned
    code points and any space other than the plain space; in short everything Python does not
    call printable, but the space.
    """
    for index, char in enumerate(text):
        if char != " " and not char.isprintable():
            category = unicodedata.category(char)
            kind = {
                "Cc": "control character",
                "Cs": "lone surrogate",
                "Zl": "line separator",
                "Zp": "paragraph separator",
                "Zs": "space other than ' '",
                "Cf": "format character",
            }.get(category, "non-printing character")
            return f"contains a {kind} (U+{ord(char):04X}) at position {index}"
    return None


def one_line(text: str) -> str:
    """``text``, which a renderer puts on one line of a node's file: validation guarantees
    it has no control character, and a renderer asserts it rather than write a second line."""
    refused = unprintable_character(text)
    if refused:
        raise ValueError(f"refusing to render {clean_text(repr(text))}: it {refused}")
    return text


def spec(
    doc: str,
    *,
    accepts: str = "",
    check: Check | None = None,
    min: float | None = None,
    max: float | None = None,
    pattern: str | None = None,
    required: bool = False,
) -> dict[str, Any]:
    """Field metadata: what the key means, what it accepts and how it is checked."""
    return {
        "doc": doc,
        "accepts": accepts,
        "check": check,
        "min": min,
        "max": max,
        "pattern": re.compile(pattern) if pattern else None,
        "required": required,
    }


def setting(default: Any, doc: str, **kwargs: Any) -> Any:
    """A dataclass field with a default and its documentation in one place."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use tuples or a default_factory for mutable defaults")
    if dataclasses.is_dataclass(default):
        return field(default_factory=lambda: default, metadata=spec(doc, **kwargs))
    return field(default=default, metadata=spec(doc, **kwargs))


def _describe(tp: Any, meta: Mapping[str, Any] | None = None) -> str:
    if meta and meta.get("accepts"):
        return str(meta["accepts"])
    origin = get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        low, high = (meta or {}).get("min"), (meta or {}).get("max")
        if low is not None and high is not None:
            return f"an integer from {low:g} to {high:g}"
        if low is not None:
            return f"an integer >= {low:g}"
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in get_args(tp))
    if origin in (Union, types.UnionType):
        inner = [arg for arg in get_args(tp) if arg is not type(None)]
        return " or ".join(_describe(arg) for arg in inner) + " or null"
    if origin in (tuple, list):
        return f"a list of {_describe(get_args(tp)[0])}"
    if origin is dict:
        return f"a mapping of {_describe(get_args(tp)[0])} to {_describe(get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping with keys " + ", ".join(f.name for f in dataclasses.fields(tp))
    return getattr(tp, "__name__", str(tp))


class Builder:
    """Converts raw data into a dataclass instance, recording every problem it meets."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def problem(self, key: str, value: Any, reason: str, accepted: str) -> None:
        self.problems.append(Problem(key, value, reason, accepted))

    def build(self, cls: type[T], raw: Any, path: str) -> T:
        """Build ``cls`` from ``raw``; on problems, fall back to defaults so checking goes on."""
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            self.problem(path, raw, "wrong type", _describe(cls))
            raw = {}
        hints = get_type_hints(cls)
        known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        for key in raw:
            if key not in known:
                self.problem(
                    _join(path, key),
                    raw[key],
                    unknown_key(key, list(known)),
                    f"keys of {path or 'the host data'}: " + ", ".join(sorted(known)),
                )
        values: dict[str, Any] = {}
        for name, fld in known.items():
            if name not in raw:
                if fld.metadata.get("required"):
                    self.problem(
                        _join(path, name), None, "missing", _describe(hints[name], fld.metadata)
                    )
                continue
            converted = self.convert(hints[name], raw[name], _join(path, name), fld.metadata)
            if converted is not _INVALID:
                values[name] = converted
        instance = cls(**values)
        validate = getattr(instance, "validate", None)
        if validate is not None:
            validate(self, path)
        return instance

    def convert(self, tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
        origin = get_origin(tp)
        accepted = _describe(tp, meta)
        if origin in (Union, types.UnionType):
            if value is None:
                return None
            inner = [arg for arg in get_args(tp) if arg is not type(None)]
            return self.convert(inner[0], value, path, meta)
        if origin is Literal:
            # By type as well as value: True == 1 to Python, never to a reader of the choice.
            if not any(type(value) is type(choice) and value == choice for choice in get_args(tp)):
                self.problem(path, value, "not an accepted value", accepted)
                return _INVALID
            return value
        if origin in (tuple, list):
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                self.problem(path, value, "wrong type", accepted)
                return _INVALID
            item_type = get_args(tp)[0]
            items = []
            for index, item in enumerate(value):
                converted = self.convert(item_type, item, f"{path}[{index}]", meta)
                if converted is not _INVALID:
                    items.append(converted)
            return tuple(items)
        if origin is dict:
            if not isinstance(value, Mapping):
                self.problem(path, value, "wrong type", accepted)
                return _INVALID
            key_type, value_type = get_args(tp)
            out = {}
            for key, item in value.items():
                if not isinstance(key, key_type):
                    self.problem(f"{path}.{key}", key, "wrong key type", accepted)
                    continue
                refused = unprintable_character(key) if isinstance(key, str) else None
                if refused:
                    self.problem(f"{path}.{key}", key, f"key {refused}", accepted)
                    continue
                converted = self.convert(value_type, item, f"{path}.{key}", meta)
                if converted is not _INVALID:
                    out[key] = converted
            return out
        if dataclasses.is_dataclass(tp):
            return self.build(tp, value, path)  # type: ignore[arg-type]
        return self._scalar(tp, value, path, meta, accepted)

    def _scalar(
        self, tp: Any, value: Any, path: str, meta: Mapping[str, Any], accepted: str
    ) -> Any:
        # bool is an int in Python; "true" in YAML-ish strings is not a bool here.
        if tp is bool:
            ok = isinstance(value, bool)
        elif tp is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif tp is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, tp)
        if not ok:
            self.problem(path, value, "wrong type", accepted)
            return _INVALID
        # Before any pattern or check: no string that reaches a node or a terminal may carry
        # a control character, whatever its field accepts otherwise.
        refused = unprintable_character(value) if isinstance(value, str) else None
        if refused:
            self.problem(path, value, refused, accepted)
            return _INVALID
        low, high = meta.get("min"), meta.get("max")
        if (low is not None and value < low) or (high is not None and value > high):
            self.problem(path, value, "out of range", accepted)
            return _INVALID
        pattern = meta.get("pattern")
        if pattern is not None and not pattern.fullmatch(value):
            self.problem(path, value, "malformed", accepted)
            return _INVALID
        check = meta.get("check")
        if check is not None:
            reason = check(value)
            if reason:
                self.problem(path, value, reason, accepted)
                return _INVALID
        return float(value) if tp is float else value


_INVALID: Any = object()


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def defaults_table(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, meaning) rows for every setting, nested sections flattened."""
    rows: list[tuple[str, str, str]] = []
    hints = get_type_hints(cls)
    for fld in dataclasses.fields(cls):
        key = f"{prefix}{fld.name}"
        tp = hints[fld.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(defaults_table(tp, f"{key}."))  # type: ignore[arg-type]
            continue
        if fld.default is not dataclasses.MISSING:
            default = repr(fld.default)
        elif fld.default_factory is not dataclasses.MISSING:
            default = repr(fld.default_factory())
        else:
            default = "(required)"
        rows.append((key, default, str(fld.metadata.get("doc", ""))))
    return rows
