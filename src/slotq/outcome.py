"""How a run ends: one enum everywhere (CLI, JSON, library, host history).

Each outcome names whom it blames, so a harness retries the model only when
the work itself is at fault, and maps to one exit code through `EXIT_CODES`.
"""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    EXEC_TIMEOUT = "exec_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    BACKSTOP = "backstop"
    UNAVAILABLE = "unavailable"
    PREPARE_FAILED = "prepare_failed"
    CALLER_GONE = "caller_gone"
    CANCELLED = "cancelled"
    BUDGET_EXHAUSTED = "budget_exhausted"
    DEADLINE = "deadline"

    @property
    def blame(self) -> str:
        return BLAME[self]

    def __str__(self) -> str:
        return self.value


BLAME: dict[Outcome, str] = {
    Outcome.PASSED: "work",
    Outcome.FAILED: "work",
    Outcome.EXEC_TIMEOUT: "work",
    Outcome.IDLE_TIMEOUT: "work",
    Outcome.BACKSTOP: "infrastructure",
    Outcome.UNAVAILABLE: "infrastructure",
    Outcome.PREPARE_FAILED: "work",
    Outcome.CALLER_GONE: "caller",
    Outcome.CANCELLED: "caller",
    Outcome.BUDGET_EXHAUSTED: "task",
    Outcome.DEADLINE: "task",
}

# The one exit-code table. passed/failed pass the command's own code through
# (None here). 124 matches timeout(1). The others sit in 113..123, away from
# 125-127 (timeout(1)'s own failure, cannot execute, not found) and from the
# small codes commands usually use. Usage errors exit 2, a bad host config 78
# and an unusable state directory 73 (see errors.py).
EXIT_CODES: dict[Outcome, int | None] = {
    Outcome.PASSED: None,
    Outcome.FAILED: None,
    Outcome.EXEC_TIMEOUT: 124,
    Outcome.IDLE_TIMEOUT: 123,
    Outcome.BACKSTOP: 122,
    Outcome.UNAVAILABLE: 121,
    Outcome.PREPARE_FAILED: 120,
    Outcome.CANCELLED: 130,
    Outcome.CALLER_GONE: 129,
    Outcome.BUDGET_EXHAUSTED: 119,
    Outcome.DEADLINE: 118,
}


def exit_code_for(outcome: Outcome, command_code: int | None) -> int:
    """The process exit code for `outcome`; `command_code` for passed/failed."""
    fixed = EXIT_CODES[outcome]
    if fixed is not None:
        return fixed
    if outcome is Outcome.PASSED:
        return 0
    return command_code if command_code else 1
