"""Durations as people type them: `45`, `45s`, `1.5s`, `15m`, `1h30m`, `250ms`."""

from __future__ import annotations

_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
# No slotq duration is longer: a budget, a grace or a wait of more than
# 30 days is a typo (or an attack on the arithmetic), not a plan.
MAX_DURATION = 30 * 24 * 3600.0


def parse_duration(text: str, *, what: str = "", allow_zero: bool = False, limit: float | None = None) -> float:
    """Return `text` as seconds.

    A bare number is seconds. Units h, m, s, ms may be combined in that order
    of size (`1h30m`, `2m30s`). Raises ValueError with a message naming
    `what` and the text for anything else, and for negative values (and zero
    unless `allow_zero`).
    """
    prefix = f"{what}: " if what else ""
    s = text.strip().lower()
    if not s:
        raise ValueError(f"{prefix}empty duration")
    if any(c.isspace() for c in s):
        raise ValueError(f"{prefix}cannot read {text!r} as a duration (no spaces: 45s, 15m, 1h30m)")
    if s.startswith("-"):
        raise ValueError(f"{prefix}negative duration {text!r}")
    total = 0.0
    i, n = 0, len(s)
    last_scale = float("inf")
    while i < n:
        j = i
        while j < n and (s[j].isdigit() or s[j] == "."):
            j += 1
        if j == i:
            raise ValueError(f"{prefix}cannot read {text!r} as a duration (try 45s, 15m, 1h30m)")
        try:
            value = float(s[i:j])
        except ValueError:
            raise ValueError(f"{prefix}cannot read {text!r} as a duration (try 45s, 15m, 1h30m)") from None
        k = j
        while k < n and s[k].isalpha():
            k += 1
        unit = s[j:k]
        if unit == "":
            if k != n or i != 0:
                raise ValueError(f"{prefix}a number without a unit must stand alone in {text!r}")
            unit = "s"
        if unit not in _UNITS:
            raise ValueError(f"{prefix}unknown unit {unit!r} in {text!r} (use d, h, m, s or ms)")
        scale = _UNITS[unit]
        if scale >= last_scale:
            raise ValueError(f"{prefix}units out of order in {text!r} (write 1h30m, not 30m1h)")
        last_scale = scale
        total += value * scale
        i = k
    if total == 0 and not allow_zero:
        raise ValueError(f"{prefix}must be more than zero, got {text!r}")
    limit = MAX_DURATION if limit is None else limit
    if not total <= limit:  # also catches inf and nan
        days = f"{limit / 86400:g} days"
        raise ValueError(f"{prefix}{text!r} is longer than the limit of {days}")
    return total


def exact(seconds: float) -> str:
    """`seconds` as a duration that parse_duration reads back to the very
    same number: `1036800.0s`, never `1.0368e+06` (which `:g` wrote, and
    which read back as the unknown unit 'e'). For every duration one slotq
    process hands another on a command line."""
    text = repr(float(seconds))
    if "e" in text or "E" in text:
        from decimal import Decimal

        text = format(Decimal(text), "f")  # the same decimal number, written out positionally
    return text + "s"


def check_seconds(value: object, what: str, *, allow_zero: bool = False) -> float:
    """A duration in seconds from a request or a file: a finite number,
    more than zero (or zero with `allow_zero`), at most MAX_DURATION.
    Raises ValueError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number of seconds, got {type(value).__name__}")
    v = float(value)
    if not (v > 0 or (allow_zero and v == 0)) or not v <= MAX_DURATION:
        low = "at least 0" if allow_zero else "more than 0"
        raise ValueError(f"{what} must be {low} and at most {MAX_DURATION:.0f} seconds (30 days), got {value!r}")
    return v


def seconds_in(value: object) -> float:
    """A duration field of a decoded message (waited_s, held_s, budget...)
    as seconds: its number, or 0 when it is missing or not a number (a
    bool is not one)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def format_duration(seconds: float) -> str:
    """A short human form: `850ms`, `12.3s`, `4m05s`, `1h02m`, `29d03h`."""
    if seconds != seconds or seconds == float("inf"):
        return "∞"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        m, s = divmod(int(seconds), 60)
        return f"{m}m{s:02d}s"
    if seconds < 86400:
        h, rest = divmod(int(seconds), 3600)
        return f"{h}h{rest // 60:02d}m"
    d, rest = divmod(int(seconds), 86400)
    return f"{d}d{rest // 3600:02d}h"


LAST_TIME = 253402300799.0  # 9999-12-31 23:59:59 UTC: the last time `time.localtime` and ISO dates show


def parse_when(text: str, now: float, *, what: str = "") -> float:
    """A point in time as epoch seconds: a duration ago (`1h`, `90m`), an
    ISO 8601 date/time (`2026-11-30T09:00`, local time unless it has an
    offset), or epoch seconds (`1796000000`)."""
    from .errors import shown as quote

    prefix = f"{what}: " if what else ""
    shown = quote(text)
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        value = None
    if value is not None and value >= 1e9:
        if not value <= LAST_TIME:  # inf, or past what the clock and the calendar can show
            raise ValueError(f"{prefix}{shown} is beyond the year 9999 (epoch seconds up to {LAST_TIME:.0f})")
        return value
    if value is None and ("-" in s[1:] or ":" in s):
        from datetime import datetime

        try:
            return datetime.fromisoformat(s).timestamp()
        except ValueError:
            raise ValueError(f"{prefix}cannot read {shown} as a time (try 1h, 2026-11-30T09:00 "
                             "or epoch seconds)") from None
    try:
        return now - parse_duration(s, allow_zero=True, limit=100 * 365 * 86400.0)
    except ValueError:
        raise ValueError(f"{prefix}cannot read {shown} as a time (try 1h, 2026-11-30T09:00 "
                         "or epoch seconds)") from None
