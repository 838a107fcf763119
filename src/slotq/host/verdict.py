"""How a run's end reads: from how its command ended (`ChildEnd`) and why
slotq stopped it, if it did, the run's outcome and the line its history
keeps (and its caller shows).

Pure: the runner gathers what it knows of the run (its link to the caller
says who cancelled it) and asks here.
"""

from __future__ import annotations

import time

from ..durations import format_duration
from ..outcome import WHILE_RUNNING, Outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .callerlink import CallerLink
    from .child import ChildEnd

# What stopped a running command, as the host's history says it (the
# caller's own line may say more: the --idle limit, the signal).
STOPPED = {
    Outcome.IDLE_TIMEOUT: "stopped by the caller's --idle watchdog: no output for its limit",
    Outcome.CANCELLED: "cancelled by the caller (Ctrl-C or a stop signal)",
    Outcome.CALLER_GONE: "the caller went away (its connection closed): stopped",
    Outcome.BACKSTOP: "no result within budget + 90 s after the slot was acquired (the detached run's backstop, "
                      "kept on the host): stopped",
}


def stop_message(link: CallerLink, reason: Outcome, phase: str) -> str | None:
    """A cancel's history line, naming who cancelled (`slotq cancel`) or the
    stop signal (the caller's, or one to the runner), if `link` knows, and
    the phase (outcome.WHILE_WAITING...); None for any other ending."""
    if reason is Outcome.CALLER_GONE and link.lapsed is not None:
        return f"{link.lapsed} {phase}"
    if reason is not Outcome.CANCELLED:
        return None
    if link.cancel_note is not None:
        return f"{link.cancel_note} {phase}"
    if link.stopped_by is not None:
        return f"cancelled ({link.stopped_by}) {phase}"
    return None


def left_line(reason: Outcome, kept: bool) -> str:
    """The history line of a run that left the line before its slot, when
    nothing more is known of why: a plain run whose caller went away lost
    its place with it, and the line says how to keep it next time."""
    if reason is Outcome.CALLER_GONE and not kept:
        from ..outcome import KEEP_PLACE

        return f"the caller went away while the run waited in line; nothing ran ({KEEP_PLACE})"
    return "left the queue before getting a slot"


class Ran:
    """What a verdict's words name of the run: its command (`argv0`), the
    host, the budget, when its slot and its command began, the
    scheduler's grant of a Slurm run (`allocation`), and what the runner
    found when the keeper was killed (`lost_message`)."""

    __slots__ = ("argv0", "host", "budget", "slot_at", "started_at", "allocation", "lost_message")

    def __init__(self, argv0: str, host: str, budget: float, slot_at: float | None = None,
                 started_at: float | None = None, allocation: str | None = None,
                 lost_message: str | None = None) -> None:
        self.argv0 = argv0
        self.host = host
        self.budget = budget
        self.slot_at = slot_at
        self.started_at = started_at
        self.allocation = allocation
        self.lost_message = lost_message


def judge(end: ChildEnd, reason: Outcome | None, link: CallerLink, ran: Ran) -> tuple[Outcome, str]:
    """The outcome and message of a command that ran (or could not start):
    `reason` is why the runner stopped it (a limit, a cancel), if it did;
    `link` says who cancelled it."""
    argv0, host, budget, slot_at, allocation = ran.argv0, ran.host, ran.budget, ran.slot_at, ran.allocation
    slot_clock = time.strftime("%H:%M:%S", time.localtime(slot_at or 0))
    if end.setup_error:
        return Outcome.UNAVAILABLE, f"slotq could not set the command up on host {host}: {end.setup_error}; nothing ran"
    if end.lost:
        return Outcome.UNAVAILABLE, ran.lost_message or "the command's keeper was killed"
    if reason is Outcome.CANCELLED and link.cancel_note is not None:
        return reason, f"{link.cancel_note} while the command ran" + (": stopped" if end.stopped else "")
    if end.exec_errno is not None:
        return Outcome.FAILED, end.describe(argv0)
    # A limit is reported only if it really ended the command (anyio's
    # rule): a command that exited on its own just then keeps its code.
    if reason is not None and end.stopped:
        if reason is Outcome.EXEC_TIMEOUT and allocation is not None:
            return reason, (f"command ran past its budget of {format_duration(budget)} "
                            f"({allocation} started on {host} at {slot_clock}; the budget counted "
                            f"from the command's start)")
        if reason is Outcome.EXEC_TIMEOUT:
            # The wait is the summary line's (the client's clock): not restated here.
            started = time.strftime("%H:%M:%S", time.localtime(ran.started_at or 0))
            return reason, (f"command ran past its budget of {format_duration(budget)} "
                            f"(slot acquired at {slot_clock}; the budget counted from the command's start "
                            f"at {started})")
        return reason, stop_message(link, reason, WHILE_RUNNING) or STOPPED.get(reason, f"stopped: {reason.value}")
    return Outcome.PASSED if end.exit_code == 0 else Outcome.FAILED, end.describe(argv0)
