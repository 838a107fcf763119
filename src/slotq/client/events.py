"""What each event of the host runner's stream means to the caller: the
order the stream must keep (check_sequence), and what an event changes in
the run's result, its watchdogs and its status lines (on_event)."""

from __future__ import annotations

from .. import protocol
from ..durations import format_duration, seconds_in
from ..errors import NoSuchRun, ProtocolError, StateDirError, UsageError, WorkTreeError
from ..outcome import Outcome
from ..spec import RunSpec
from .result import RunResult, detached_message
from .watchdogs import Watchdogs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


# Outcomes that say the command ran: never believed unless the host showed
# the command starting.
_RAN = {Outcome.PASSED, Outcome.FAILED, Outcome.EXEC_TIMEOUT, Outcome.IDLE_TIMEOUT}


def check_sequence(ev: dict[str, object], seen: set[str]) -> None:
    """The order of events: hello first, nothing after exited; an outcome
    that says the command ran only after `started` (a host cannot report
    `passed` for a command it never started)."""
    name = str(ev.get("event"))
    if not seen and name != protocol.HELLO:
        raise ProtocolError(f"the host runner's stream began with {name!r}, not hello")
    if protocol.EXITED in seen:
        raise ProtocolError("the host runner sent more after its final event")
    if name == protocol.EXITED and Outcome(str(ev["outcome"])) in _RAN and protocol.STARTED not in seen \
            and not (ev["outcome"] == "failed" and ev.get("not_started") is True):  # (127/126, found before its turn)
        raise ProtocolError(f"the host runner reported {ev['outcome']!r} for a command it never showed starting")
    seen.add(name)


def collect_from_now_on() -> None:
    """Garbage collection back on, once the run waits or its command runs
    (bin/slotq starts with it off: collections walking the objects slotq's
    imports make cost about 1 ms of every run, and those objects live as
    long as the process). What exists now is frozen first: collections
    from here on walk only what is made later -- and never write to the
    pages a forked keeper shares with us."""
    import gc

    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def silent(line: str) -> None:
    """Where status lines go with -q."""


def wait_end(ev: dict[str, object], start: float, now: float, remote: bool) -> float:
    """When a queue wait ended (the ledger's record, and `waited_s`): the
    host's own time of the slot, where the host's clock is ours (this
    machine), else now. Now alone would count the time this caller took to
    read the event (a busy machine, a stopped caller) as waiting, and
    credit it to an outer task."""
    at = ev.get("at")
    if remote or not isinstance(at, (int, float)) or isinstance(at, bool) or not start <= at <= now:
        return now
    return float(at)


def first_says_id(result: RunResult) -> str:
    """The run's first status line names its run id (for `slotq attach`,
    `cancel`, `status`); the others do not repeat it."""
    if result.announced:
        return ""
    result.announced = True
    return f"; run {result.run_id}"


def on_event(ev: dict[str, object], result: RunResult, dogs: Watchdogs,
              say: Callable[[str], None], spec: RunSpec, live: Callable[[str], None] | None = None,
              others_as_data: bool = False, attach_options: list[str] | None = None) -> bool:
    """Apply one event; True when it is the final `exited`. `others_as_data`:
    status lines without what other users wrote (waitlines.format_queued)."""
    name = ev.get("event")
    at = ev.get("at")
    at = float(at) if isinstance(at, (int, float)) else None
    if name in (protocol.QUEUED, protocol.STARTED):
        collect_from_now_on()
    dogs.on_event(str(name), ev, at)  # the clocks: watchdogs.py
    if name == protocol.QUEUED:
        _on_queued(ev, result, say, live, others_as_data)
    elif name == protocol.SLOT:
        result.phases["slot"] = at
        result.slot = str(ev.get("slot"))
        ticket = ev.get("ticket")
        result.ticket = ticket if isinstance(ticket, int) else None
        budget = seconds_in(ev.get("budget"))
        result.budget = budget
        waited = result.waited_s or 0.0
        say(f"slotq: slot {result.slot} acquired after {format_duration(waited)}"
            + (f" (budget {format_duration(budget)} starts with the command)" if budget else "")
            + first_says_id(result))
    elif name == protocol.PREPARED:
        result.phases["prepared"] = at
    elif name == protocol.STARTED:
        result.phases["started"] = at
    elif name == protocol.EXITED:
        _on_exited(ev, result)
        return True
    elif name == protocol.ERROR:
        from ..records import printable

        message = printable(ev.get("message") or "error", 2000)
        if ev.get("kind") == "usage":
            raise UsageError(message)
        if ev.get("kind") == "no_run":
            raise NoSuchRun(message)
        if ev.get("kind") == "worktree":  # (late binding: the winner's transfer, transports/bound.py)
            raise WorkTreeError(message)
        if ev.get("kind") == "state":
            # The host's state directory is unusable (missing, full, read-only,
            # an odd file in it): exit 73, as documented.
            raise StateDirError(f"host {result.host}: {message}", result.host)
        result.outcome = Outcome.UNAVAILABLE
        result.message = f"host {result.host}: {message}"
    elif name == protocol.HELLO:
        from ..records import printable

        for w in ev.get("warnings") or []:  # type: ignore[attr-defined]
            say(f"slotq: warning: {printable(w, 1000)}")
    elif name == protocol.DETACHED:
        result.outcome = Outcome.DETACHED
        result.message = detached_message(ev, attach_options)
        return True
    return False


def _on_queued(ev: dict[str, object], result: RunResult, say: Callable[[str], None],
               live: Callable[[str], None] | None, others_as_data: bool) -> None:
    """A report from the line: the ticket and budget it names, said."""
    ticket, budget = ev.get("ticket"), ev.get("budget")
    if result.ticket is None and isinstance(ticket, int) and not isinstance(ticket, bool):
        result.ticket = ticket  # known in line: a run cancelled there still has its place's number
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        result.budget = float(budget)
    if live is not None or say is not silent:  # (-q: a report every 30 s, formatted for nobody)
        from .waitlines import format_queued

        if live is not None:
            live(format_queued(ev, compact=True))
        else:
            say(format_queued(ev, others_as_data=others_as_data) + first_says_id(result))


def _on_exited(ev: dict[str, object], result: RunResult) -> None:
    """The run's end: its outcome, code, message and the host's phases."""
    result.outcome = Outcome(str(ev.get("outcome")))
    code = ev.get("exit_code")
    result.command_code = code if isinstance(code, int) else None
    result.message = str(ev.get("message") or "")
    result.not_started = ev.get("not_started") is True
    phases = ev.get("phases")
    if isinstance(phases, dict):
        # The host's phases, `submitted` too: when the host took the run
        # (its history says so), on the clock its other phases are on.
        for k in ("submitted", "slot", "prepared", "started", "ended"):
            if isinstance(phases.get(k), (int, float)) and not isinstance(phases.get(k), bool):
                result.phases[k] = float(phases[k])

