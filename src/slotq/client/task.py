"""`slotq task`: run a whole job under a `Deadline`.

The command runs in its own session (its own process group) under a keeper
(process.py), with the caller's stdin, stdout and stderr. When the deadline
keeper says the job is over, the group is ended (TERM, grace, KILL).
"""

from __future__ import annotations

import json
import os
import select
from collections.abc import Callable

from .. import signals as signal
from ..durations import format_duration
from ..host.process import Command, KeeperPlan, Streams, spawn
from ..outcome import Outcome, exit_code_for
from .deadline import Deadline, Extension


class TaskResult:
    def __init__(self, outcome: Outcome, command_code: int | None, message: str, elapsed: float,
                 deadline: Deadline, not_started: bool = False) -> None:
        self.outcome = outcome
        self.not_started = not_started  # the command could not be started (not found, not executable)
        self.command_code = command_code
        self.message = message
        self.elapsed = elapsed
        self.deadline = deadline

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.outcome, self.command_code)

    @property
    def said_when_quiet(self) -> bool:
        """As RunResult.said_when_quiet."""
        return self.outcome.decided_by_slotq or self.not_started

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "outcome": self.outcome.value, "blame": self.outcome.blame, "exit_code": self.exit_code,
            "command_exit_code": self.command_code, "message": self.message,
            "elapsed_s": round(self.elapsed, 3),
        }
        d.update(self.deadline.to_dict())
        d.pop("reason", None)
        return d

    def to_json(self, one_line: bool = False) -> str:
        return json.dumps(self.to_dict(), indent=None if one_line else 2, separators=(",", ":") if one_line else None)


def describe_extension(ext: Extension) -> str:
    n = len(ext.wait_ids)
    return (f"slotq task: budget extended by {format_duration(ext.seconds)} for {n} wait{'s' * (n != 1)} "
            f"(ids {', '.join(map(str, ext.wait_ids))}); budget now {format_duration(ext.new_budget)}")


def run_task(argv: list[str], deadline: Deadline, *, grace: float = 10.0,
             say: Callable[[str], None] | None = None, handle_signals: bool = True) -> TaskResult:
    """Run argv until it ends or `deadline` says the job is over."""
    say = say or (lambda line: None)
    clock = deadline.clock
    start = clock.monotonic()
    sig_r, sig_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    cancelled = False
    old: dict[int, object] = {}
    old_wakeup = -1

    def on_signal(signum: int, frame: object) -> None:
        nonlocal cancelled
        cancelled = True

    if handle_signals:
        old_wakeup = signal.set_wakeup_fd(sig_w)
        old = signal.catch_stops(on_signal)
    try:
        if handle_signals and signal.early:  # a stop signal while slotq started (signals.hold_stops): no job
            return TaskResult(Outcome.CANCELLED, None, f"cancelled ({signal.stop_name(signal.early[0])}) "
                              "before the job started; nothing ran", clock.monotonic() - start, deadline)
        child = spawn(KeeperPlan(Command(argv, grace=grace), Streams(os.dup(1), os.dup(2), os.dup(0))))
        reason: Outcome | None = None
        while child.end is None:
            timeout = None if reason is not None else deadline.remaining()
            ready, _, _ = select.select([child.done_fd, sig_r], [], [], timeout)
            if sig_r in ready:
                try:
                    os.read(sig_r, 64)
                except BlockingIOError:
                    pass
            if child.done_fd in ready and child.on_readable():
                break
            if reason is None and cancelled:
                reason = Outcome.CANCELLED
                child.stop()
            elif reason is None and deadline.over():
                reason = deadline.reason
                child.stop()
    finally:
        if handle_signals:
            signal.set_wakeup_fd(old_wakeup)
            for signum, handler in old.items():
                signal.signal(signum, handler)  # type: ignore[arg-type]
        os.close(sig_r)
        os.close(sig_w)
    for err in deadline.credit_errors[:1]:
        say(f"slotq task: warning: {err}")
    end = child.end
    assert end is not None
    elapsed = clock.monotonic() - start
    if end.exec_errno is not None:
        return TaskResult(Outcome.FAILED, end.exit_code, end.describe(argv[0]), elapsed, deadline, not_started=True)
    if reason is not None and end.stopped:
        if reason is Outcome.DEADLINE:
            msg = f"delivery deadline of {format_duration(deadline.delivery.length if deadline.delivery else 0)} reached"
        elif reason is Outcome.BUDGET_EXHAUSTED:
            msg = (f"budget exhausted after {format_duration(elapsed)} "
                   f"({format_duration(deadline.credited)} of it credited for waits)")
        else:
            msg = "cancelled"
        return TaskResult(reason, end.exit_code, msg, elapsed, deadline)
    code = end.exit_code
    return TaskResult(Outcome.PASSED if code == 0 else Outcome.FAILED, code, end.describe(argv[0]), elapsed, deadline)
