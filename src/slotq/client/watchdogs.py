"""The client's clocks, each started at the moment it should be:
- the backstop (budget + BACKSTOP_MARGIN) is created when the `slot` event
  arrives, and moved later by the time a prepare step took;
- the no-output watchdog (`idle`) is armed when `started` arrives and reset
  by every output frame. Quiet time before the command starts never counts.
The queue itself has no limit here: waiting is not executing."""

from __future__ import annotations

from .. import protocol
from ..clock import INF, Clock, Timer
from ..durations import seconds_in
from ..outcome import Outcome

BACKSTOP_MARGIN = 90.0


class Watchdogs:
    """The client's timers, as pure logic over a clock."""

    def __init__(self, clock: Clock, idle: float | None, margin: float = BACKSTOP_MARGIN) -> None:
        self.clock = clock
        self.idle = idle
        self.margin = margin
        self.backstop: Timer | None = None
        self.idle_timer: Timer | None = None
        self.slot_at: float | None = None

    def on_event(self, name: str, ev: dict[str, object], at: float | None) -> None:
        """The clocks' one rule, for the caller and a kept run's stand-in
        alike: the backstop from `slot` (budget + margin), moved on by the
        time a prepare step took (`prepared`: it has its own limit); the
        no-output watchdog from `started`. Nothing before the slot: waiting
        is not executing."""
        if name == protocol.SLOT:
            self.slot_at = at
            self.on_slot(seconds_in(ev.get("budget")))
        elif name == protocol.PREPARED and at is not None and self.slot_at is not None:
            self.on_prepared(at - self.slot_at)
        elif name == protocol.STARTED:
            self.on_started()

    def on_slot(self, budget: float) -> None:
        self.backstop = self.clock.timer("backstop", budget + self.margin)

    def on_prepared(self, took: float) -> None:
        if self.backstop is not None:
            self.backstop.extend(took)  # the prepare step has its own limit

    def on_started(self) -> None:
        if self.idle is not None:
            self.idle_timer = self.clock.timer("idle", self.idle)

    def on_output(self) -> None:
        t = self.idle_timer
        if t is not None and self.idle is not None:
            t.extend(self.clock.monotonic() + self.idle - t.deadline)

    def next_deadline(self) -> float:
        return min((t.deadline for t in (self.backstop, self.idle_timer) if t is not None), default=INF)

    def expired(self) -> Outcome | None:
        """The outcome whose clock ran out, if any. The idle watchdog fires
        once (the runner is then asked to stop the command)."""
        now = self.clock.monotonic()
        if self.backstop is not None and self.backstop.remaining(now) <= 0:
            return Outcome.BACKSTOP
        if self.idle_timer is not None and self.idle_timer.remaining(now) <= 0:
            self.idle_timer = None
            return Outcome.IDLE_TIMEOUT
        return None
