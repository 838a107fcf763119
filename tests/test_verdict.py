"""How a run's end reads (host/verdict.py): pure logic, a table of endings."""

from __future__ import annotations

import errno
import signal
from types import SimpleNamespace
from typing import Any

import pytest

from slotq.host.child import ChildEnd
from slotq.host.verdict import Ran, judge
from slotq.outcome import Outcome

EXIT_3 = 3 << 8  # raw wait status of `exit 3`
KILLED_BY_TERM = signal.SIGTERM  # raw wait status of a process a SIGTERM ended


def link(cancel_note: str | None = None, stopped_by: str | None = None) -> Any:
    return SimpleNamespace(cancel_note=cancel_note, stopped_by=stopped_by)


CASES = [
    # (how it ended, why slotq stopped it, the caller link) -> outcome, words in the message
    (ChildEnd(0, None, False), None, link(), Outcome.PASSED, ""),
    (ChildEnd(EXIT_3, None, False), None, link(), Outcome.FAILED, "exited 3"),
    (ChildEnd(None, errno.ENOENT, False), None, link(), Outcome.FAILED, "not found"),
    (ChildEnd(None, None, False, setup_error="cannot enter the work dir"), None, link(), Outcome.UNAVAILABLE,
     "could not set the command up on host h: cannot enter the work dir; nothing ran"),
    (ChildEnd(None, None, False, lost=True), Outcome.EXEC_TIMEOUT, link(), Outcome.UNAVAILABLE, "keeper was killed"),
    # A limit counts only if it ended the command (anyio's rule).
    (ChildEnd(KILLED_BY_TERM, None, True), Outcome.EXEC_TIMEOUT, link(), Outcome.EXEC_TIMEOUT,
     "ran past its budget of 5.0s (slot acquired at"),
    (ChildEnd(0, None, False), Outcome.EXEC_TIMEOUT, link(), Outcome.PASSED, ""),
    (ChildEnd(EXIT_3, None, False), Outcome.CANCELLED, link(stopped_by="SIGTERM"), Outcome.FAILED, "exited 3"),
    (ChildEnd(KILLED_BY_TERM, None, True), Outcome.IDLE_TIMEOUT, link(), Outcome.IDLE_TIMEOUT, "--idle watchdog"),
    (ChildEnd(KILLED_BY_TERM, None, True), Outcome.CANCELLED, link(stopped_by="SIGTERM"), Outcome.CANCELLED,
     "cancelled (SIGTERM) while the command ran: stopped"),
    (ChildEnd(KILLED_BY_TERM, None, True), Outcome.CANCELLED, link(), Outcome.CANCELLED,
     "cancelled by the caller (Ctrl-C or a stop signal)"),
    (ChildEnd(KILLED_BY_TERM, None, True), Outcome.CANCELLED, link(cancel_note="cancelled by slotq cancel (pid 7)"),
     Outcome.CANCELLED, "cancelled by slotq cancel (pid 7) while the command ran: stopped"),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("end,reason,caller,outcome,words", CASES)
def test_a_runs_end_reads_as_its_outcome_and_message(end: ChildEnd, reason: Outcome | None, caller: Any,
                                                      outcome: Outcome, words: str) -> None:
    got, message = judge(end, reason, caller, Ran("cmd", "h", 5.0, slot_at=1e9, started_at=1e9))
    assert got is outcome and words in message, (got, message)


@pytest.mark.timeout(10)
def test_a_scheduler_runs_budget_names_its_allocation() -> None:
    got, message = judge(ChildEnd(KILLED_BY_TERM, None, True), Outcome.EXEC_TIMEOUT, link(),
                         Ran("cmd", "node1", 5.0, slot_at=1e9, started_at=1e9, allocation="slurm:42"))
    assert got is Outcome.EXEC_TIMEOUT and "(slurm:42 started on node1 at" in message, message
