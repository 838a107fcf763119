"""JSON for the state files (tickets, slot holder records, history) without
importing `json`, which pulls in `re`: every `slotq run` writes these, and
that import alone costs a noticeable share of its start-up (benchmarks/).
Readers (`slotq status`) use the `json` module; the output is plain JSON.
"""

from __future__ import annotations

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string(s: str) -> str:
    if s.isprintable() and '"' not in s and "\\" not in s:
        return '"' + s + '"'
    out = []
    for ch in s:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch < " " or ch == "\x7f" or "\ud800" <= ch <= "\udfff":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def to_json(value: object) -> str:
    """Encode dicts (str keys), lists, tuples, str, int, float, bool, None."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):  # NaN, infinities
            return "null"
        return repr(value)
    if isinstance(value, dict):
        return "{" + ",".join(_string(str(k)) + ":" + to_json(v) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


MAX_DEPTH = 32


def from_json(text: str, max_depth: int = MAX_DEPTH) -> object:
    """Parse JSON (what `to_json` writes, and any other plain JSON) without
    the `json` module. Raises ValueError on malformed input, and on nesting
    deeper than `max_depth` (state files are flat; a deep one is corrupt or
    hostile, and must not cost a RecursionError). Callers bound the size."""
    value, end = _parse(text, _skip(text, 0), max_depth)
    if _skip(text, end) != len(text):
        raise ValueError(f"extra data at {end}")
    return value


_WS = " \t\n\r"
_UNESCAPE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _parse(s: str, i: int, depth: int) -> tuple[object, int]:
    if i >= len(s):
        raise ValueError("unexpected end")
    c = s[i]
    if c in "{[" and depth <= 0:
        raise ValueError(f"nested too deeply at {i}")
    if c == "{":
        out: dict[str, object] = {}
        i = _skip(s, i + 1)
        if i < len(s) and s[i] == "}":
            return out, i + 1
        while True:
            if i >= len(s) or s[i] != '"':
                raise ValueError(f"expected a key at {i}")
            key, i = _string_at(s, i)
            i = _skip(s, i)
            if i >= len(s) or s[i] != ":":
                raise ValueError(f"expected ':' at {i}")
            out[key], i = _parse(s, _skip(s, i + 1), depth - 1)
            i = _skip(s, i)
            if i < len(s) and s[i] == ",":
                i = _skip(s, i + 1)
            elif i < len(s) and s[i] == "}":
                return out, i + 1
            else:
                raise ValueError(f"expected ',' or '}}' at {i}")
    if c == "[":
        items: list[object] = []
        i = _skip(s, i + 1)
        if i < len(s) and s[i] == "]":
            return items, i + 1
        while True:
            item, i = _parse(s, i, depth - 1)
            items.append(item)
            i = _skip(s, i)
            if i < len(s) and s[i] == ",":
                i = _skip(s, i + 1)
            elif i < len(s) and s[i] == "]":
                return items, i + 1
            else:
                raise ValueError(f"expected ',' or ']' at {i}")
    if c == '"':
        return _string_at(s, i)
    for word, value in (("true", True), ("false", False), ("null", None)):
        if s.startswith(word, i):
            return value, i + len(word)
    j = i
    while j < len(s) and s[j] in "+-0123456789.eE":
        j += 1
    token = s[i:j]
    if not token:
        raise ValueError(f"unexpected {c!r} at {i}")
    try:
        return (int(token) if token.lstrip("-").isdigit() else float(token)), j
    except ValueError:
        raise ValueError(f"bad number {token!r} at {i}") from None


def _string_at(s: str, i: int) -> tuple[str, int]:
    out = []
    i += 1
    while True:
        j = i
        while j < len(s) and s[j] not in '"\\':
            j += 1
        out.append(s[i:j])
        if j >= len(s):
            raise ValueError("unterminated string")
        if s[j] == '"':
            return "".join(out), j + 1
        esc = s[j + 1 : j + 2]
        if esc == "u":
            hexdigits = s[j + 2 : j + 6]
            if len(hexdigits) != 4 or not all(h in "0123456789abcdefABCDEF" for h in hexdigits):
                raise ValueError(f"bad \\u escape at {j}")
            code = int(hexdigits, 16)
            i = j + 6
            if 0xD800 <= code < 0xDC00 and s[i : i + 2] == "\\u":  # a surrogate pair
                lowdigits = s[i + 2 : i + 6]
                low = int(lowdigits, 16) if len(lowdigits) == 4 and all(
                    h in "0123456789abcdefABCDEF" for h in lowdigits) else -1
                if 0xDC00 <= low < 0xE000:
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    i += 6
            out.append(chr(code))
        elif esc in _UNESCAPE:
            out.append(_UNESCAPE[esc])
            i = j + 2
        else:
            raise ValueError(f"bad escape at {j}")


def printable(value: object, limit: int = 200) -> str:
    """`value` as text safe to print on a terminal: control characters
    (newlines, escapes, bidi overrides...) become '?', and it is cut at
    `limit` characters. Labels and names come from other users' files."""
    text = str(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else "?" for ch in text)
