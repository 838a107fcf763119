"""JSON for the state files (tickets, slot holder records, history), the
stream and the requests.

Reading: `from_json`, with a depth limit (callers bound the size). It
parses with the standard library's C scanner (`_json`, what `json` itself
uses; about ten times faster) once `load_scanner()` was called. Everything
that meets other users' or another host's data calls it first: every
command but `run`, the remote transports, the host side of a remote run,
a run once it waits (its reports read the line, other users' records and
the history), a run that buries a dead ticket. Before that -- the start of
a local run that gets its slot at once, reading only its own thread's
stream and its own cache -- a small hand-written parser does: importing
`_json` costs about 0.5 ms, every run's, and `json` itself pulls in `re`.
Both refuse the same malformed input with a ValueError.

Writing: `to_json`, likewise: the C encoder once loaded, before it a
hand-written one.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeGuard

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
    """Encode dicts (str keys), lists, tuples, str, int, float, bool, None
    (NaN and the infinities as null). With the C scanner comes the C
    encoder; it writes non-ASCII text as \\u escapes."""
    encode = _encode
    if encode is not None:
        try:
            return "".join(encode(value, 0))
        except (ValueError, TypeError):
            pass  # NaN or an infinity (null, below), or a type neither knows (said below)
    return _to_json(value)


def _to_json(value: object) -> str:
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
        return "{" + ",".join(_string(str(k)) + ":" + _to_json(v) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_to_json(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


MAX_DEPTH = 32

# The C scanner and encoder, once loaded (load_scanner).
_scan: Callable[[str, int], tuple[object, int]] | None = None
_encode: Callable[[object, int], Iterable[str]] | None = None

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


def _int(token: str) -> int:
    """A JSON integer that fits in 64 bits (every count, pid, tick and
    time we write does); a longer one is corrupt or hostile, and as a
    Python int it would raise OverflowError where a reader mixes it with
    a float."""
    if len(token) > 20:
        raise ValueError(f"number out of range: {token[:24]}...")
    value = int(token)
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"number out of range: {token}")
    return value


def _float(token: str) -> float:
    """A JSON number with a fraction or exponent, finite (1e400 is not)."""
    value = float(token)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number out of range: {token[:24]}")
    return value


class _Strict:
    """The scanner's settings (what `json.JSONDecoder` passes it): plain
    JSON only -- no control characters in strings, no NaN or Infinity,
    no number out of range (`_int`, `_float`)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = staticmethod(_float)
    parse_int = staticmethod(_int)

    @staticmethod
    def parse_constant(name: str) -> object:
        raise ValueError(f"{name} is not JSON")


def load_scanner() -> None:
    """Parse (and encode) with the standard library's C code from now on."""
    global _scan, _encode
    if _scan is None:
        try:
            from _json import encode_basestring_ascii, make_encoder, make_scanner
        except ImportError:  # a Python built without it: the hand-written code serves
            return
        _scan = make_scanner(_Strict())  # type: ignore[arg-type]  # (typeshed: a JSONDecoder-like context)
        # No circular-reference markers (what we encode is made here), no
        # default, ASCII out, no indent, compact separators, keys in order,
        # no keys skipped, NaN refused (and then written as null, above).
        _encode = make_encoder(None, _refuse, encode_basestring_ascii, None, ":", ",", False, False, False)


def _refuse(value: object) -> object:
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def from_json(text: str, max_depth: int = MAX_DEPTH) -> object:
    """Parse JSON. Raises ValueError on malformed input, and on nesting
    deeper than `max_depth` (state files are flat; a deep one is corrupt or
    hostile, and must not cost a RecursionError). Callers bound the size."""
    scan = _scan
    if scan is None:
        value, end = _parse(text, _skip(text, 0), max_depth)
    else:
        if _too_deep(text, max_depth):
            raise ValueError("nested too deeply")
        start = len(text) - len(text.lstrip(_WS))
        try:
            value, end = scan(text, start)
        except (StopIteration, ValueError, RecursionError, SystemError):
            raise ValueError(_why(scan, text, start)) from None
    if _skip(text, end) != len(text):
        raise ValueError(f"extra data at {end}")
    return value


_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


def _too_deep(text: str, max_depth: int) -> bool:
    """Whether `text` nests more than `max_depth` deep -- checked before
    the C scanner, which nests as deep as the recursion limit allows."""
    if text.count("[") + text.count("{") <= max_depth:
        return False
    # Brackets in strings do not nest: take the strings out (escaped
    # backslashes first, then escaped quotes), then follow the brackets.
    outside = text.replace("\\\\", "").replace('\\"', "").split('"')[0::2]
    brackets = "".join(outside).encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS)
    depth = 0
    for b in brackets:
        if b in b"[{":
            depth += 1
            if depth > max_depth:
                return True
        else:
            depth -= 1
    return False


def _why(scan: Callable[[str, int], tuple[object, int]], text: str, start: int) -> str:
    """What is wrong with `text`, in the scanner's words. Its messages
    need `json.decoder`; without it, a bad string ends in a bare
    SystemError. Imported here, on bad input only."""
    import json.decoder  # noqa: F401

    try:
        scan(text, start)
    except StopIteration as e:
        return f"expected a JSON value at {e.value}"
    except (ValueError, RecursionError) as e:
        return str(e)
    return "malformed JSON"


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
    if not _is_number(token):
        raise ValueError(f"bad number {token!r} at {i}")
    try:
        return (_int(token) if token.lstrip("-").isdigit() else _float(token)), j
    except ValueError as e:  # out of range
        raise ValueError(f"{e} at {i}") from None


def _is_number(token: str) -> bool:
    """JSON's number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?"""
    mantissa, e, exponent = token.removeprefix("-").replace("E", "e").partition("e")
    whole, dot, fraction = mantissa.partition(".")
    if not whole.isdigit() or (whole[0] == "0" and len(whole) > 1) or (dot and not fraction.isdigit()):
        return False
    if not e:
        return True
    digits = exponent[1:] if exponent[:1] in ("+", "-") else exponent
    return digits.isdigit()


def _string_at(s: str, i: int) -> tuple[str, int]:
    out = []
    i += 1
    while True:
        j = i
        while j < len(s) and s[j] not in '"\\':
            j += 1
        chunk = s[i:j]
        if chunk and min(chunk) < " ":
            raise ValueError(f"control character in a string at {i}")
        out.append(chunk)
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


def is_pid(v: object) -> TypeGuard[int]:
    """A pid a process can have: a positive pid_t (not a bool). A record's
    pid that is not one names no process -- and 0 or -1 handed to kill(2)
    would ask about a whole group, or everyone."""
    return type(v) is int and 0 < v < 2 ** 31


def is_number(v: object) -> bool:
    """A time or a duration from a record: an int or a float (not a bool),
    finite and under 1e12 in size (year 33658 as epoch seconds)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) < 1e12


_STATE_INTS = ("pid", "pid_start", "keeper", "keeper_start", "cmd", "cmd_start", "uid", "ticket")
_STATE_NUMBERS = ("since", "budget", "grace", "kept")
_STATE_TEXT = ("run_id", "label", "cls", "host", "phase")


def clean_state(info: dict[str, object]) -> dict[str, object]:
    """A ticket's or a slot holder's record (another user may have written
    it) with the types its readers rely on: pids, start ticks and the uid
    ints >= 0; times and durations numbers in [0, 1e12); names and the
    phase text. A field of any other type or range becomes None -- shown
    as unknown, never a crash in a waiting run or in `status`."""
    out = dict(info)
    for k in _STATE_INTS:
        v = out.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            out[k] = None
    for k in _STATE_NUMBERS:
        v = out.get(k)
        if v is not None and not (is_number(v) and v >= 0):  # type: ignore[operator]
            out[k] = None
    for k in _STATE_TEXT:
        if not isinstance(out.get(k), (str, type(None))):
            out[k] = None
    return out


def valid_text(text: str) -> str:
    """`text` as valid Unicode, which SQLite (history index, wait ledger)
    and strict JSON readers need. An argument or path that was not UTF-8
    reaches Python with lone surrogates (surrogateescape): each such byte
    becomes `\\xNN` (another lone surrogate `\\uNNNN`). Valid text is
    returned as it is, at the cost of one encode."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return "".join(ch if not "\ud800" <= ch <= "\udfff" else
                       f"\\x{ord(ch) - 0xdc00:02x}" if "\udc80" <= ch <= "\udcff" else f"\\u{ord(ch):04x}"
                       for ch in text)


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
