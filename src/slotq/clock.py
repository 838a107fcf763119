"""The one place that reads time.

Durations inside a process are measured on the monotonic clock; wall-clock
time is used only for records that cross processes or hosts (events, tickets,
history). Everything that waits or measures takes a `Clock`, so tests can
substitute a fake one and a 450-second scenario takes milliseconds.

A time limit is always an absolute monotonic deadline (`math.inf` for none);
relative timeouts are turned into deadlines once, when they start.
"""

from __future__ import annotations

import time

INF = float("inf")


class Timer:
    """A named deadline on a clock's monotonic axis.

    `created` and `deadline` are monotonic seconds. A timer only ever moves
    later (`extend`): a limit that moved earlier would charge the caller for
    time it was promised.
    """

    __slots__ = ("name", "created", "deadline")

    def __init__(self, name: str, created: float, deadline: float) -> None:
        self.name = name
        self.created = created
        self.deadline = deadline

    @property
    def length(self) -> float:
        return self.deadline - self.created

    def extend(self, seconds: float) -> None:
        if seconds > 0:
            self.deadline += seconds

    def remaining(self, now: float) -> float:
        return self.deadline - now

    def __repr__(self) -> str:
        return f"Timer({self.name!r}, created={self.created:.3f}, length={self.length:.3f})"


class Clock:
    """The real clock. Subclass (or use `FakeClock`) to observe or control time."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(min(seconds, 86400.0))

    def timer(self, name: str, seconds: float) -> Timer:
        """Start a named time limit of `seconds` from now (inf for none)."""
        now = self.monotonic()
        return Timer(name, now, now + seconds)


class FakeClock(Clock):
    """A clock that moves only when told to.

    `advance(s)` moves both axes; the wall axis starts at `wall_start` so that
    records look plausible. Timers created on it are kept in `timers`.
    """

    def __init__(self, start: float = 1000.0, wall_start: float = 1_800_000_000.0) -> None:
        self._mono = start
        self._wall_offset = wall_start - start
        self.timers: list[Timer] = []

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._mono + self._wall_offset

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a fake clock does not go backwards")
        self._mono += seconds

    def timer(self, name: str, seconds: float) -> Timer:
        t = super().timer(name, seconds)
        self.timers.append(t)
        return t
