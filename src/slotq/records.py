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
