"""How a run ends: one set of values everywhere (CLI, JSON, library, host
history), each naming whom it blames, so a harness retries the model only
when the work itself is at fault, and mapping to one exit code through
`EXIT_CODES`.

`Outcome` behaves like a string enum (`Outcome.PASSED`, `Outcome("passed")
is Outcome.PASSED`, `.value`, iteration over `Outcome.members()`), without
importing `enum`: that import alone is a noticeable share of `slotq run`'s
start-up (benchmarks/).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar


class Outcome(str):
    __slots__ = ()
    _members: ClassVar[dict[str, Outcome]] = {}

    PASSED: ClassVar[Outcome]
    FAILED: ClassVar[Outcome]
    EXEC_TIMEOUT: ClassVar[Outcome]
    IDLE_TIMEOUT: ClassVar[Outcome]
    BACKSTOP: ClassVar[Outcome]
    UNAVAILABLE: ClassVar[Outcome]
    PREPARE_FAILED: ClassVar[Outcome]
    CALLER_GONE: ClassVar[Outcome]
    CANCELLED: ClassVar[Outcome]
    BUDGET_EXHAUSTED: ClassVar[Outcome]
    DEADLINE: ClassVar[Outcome]
    NOT_ADMITTED: ClassVar[Outcome]
    DETACHED: ClassVar[Outcome]

    def __new__(cls, value: str) -> Outcome:
        try:
            return cls._members[value]
        except KeyError:
            raise ValueError(f"{value!r} is not an outcome") from None

    @classmethod
    def _define(cls, value: str) -> Outcome:
        member = str.__new__(cls, value)
        cls._members[value] = member
        return member

    @classmethod
    def members(cls) -> tuple[Outcome, ...]:
        return tuple(cls._members.values())

    @property
    def value(self) -> str:
        return str.__str__(self)

    @property
    def blame(self) -> str:
        return BLAME[self.value]

    @property
    def decided_by_slotq(self) -> bool:
        """slotq ended it (a limit, a policy, a cancel, the host), not the
        command's own exit: `-q` still says such an ending in one line."""
        return self.value not in ("passed", "failed")

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"Outcome.{self.value.upper()}"

    def __reduce__(self) -> tuple[type[Outcome], tuple[str]]:
        return Outcome, (self.value,)


Outcome.PASSED = Outcome._define("passed")
Outcome.FAILED = Outcome._define("failed")
Outcome.EXEC_TIMEOUT = Outcome._define("exec_timeout")
Outcome.IDLE_TIMEOUT = Outcome._define("idle_timeout")
Outcome.BACKSTOP = Outcome._define("backstop")
Outcome.UNAVAILABLE = Outcome._define("unavailable")
Outcome.PREPARE_FAILED = Outcome._define("prepare_failed")
Outcome.CALLER_GONE = Outcome._define("caller_gone")
Outcome.CANCELLED = Outcome._define("cancelled")
Outcome.BUDGET_EXHAUSTED = Outcome._define("budget_exhausted")
Outcome.DEADLINE = Outcome._define("deadline")
Outcome.NOT_ADMITTED = Outcome._define("not_admitted")
# Not an ending: the caller left a kept run on purpose (--attach-for,
# `slotq attach --for`), which goes on; exit 75, EX_TEMPFAIL, "not yet".
Outcome.DETACHED = Outcome._define("detached")

BLAME: dict[str, str] = {
    "passed": "work",
    "failed": "work",
    "exec_timeout": "work",
    "idle_timeout": "work",
    "backstop": "infrastructure",
    "unavailable": "infrastructure",
    "prepare_failed": "work",
    "caller_gone": "caller",
    "cancelled": "caller",
    "budget_exhausted": "task",
    "deadline": "task",
    "not_admitted": "infrastructure",
    "detached": "none",
}

# The one exit-code table. passed/failed pass the command's own code through
# (None here). 124 matches timeout(1). The others sit in 117..123, 129, 130,
# away from 125-127 (timeout(1)'s own failure, cannot execute, not found) and
# from the small codes commands usually use. Usage errors exit 64, a bad host
# config 78 and an unusable state directory 73 (see errors.py).
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
    Outcome.NOT_ADMITTED: 117,
    Outcome.DETACHED: 75,
}


# Where a cancelled run was, as its line says it: "cancelled (SIGTERM) while
# it waited for a slot; nothing ran". The caller's line and the host's
# history say it alike.
WHILE_WAITING = "while it waited for a slot; nothing ran"
# What a run whose call was stopped in line could have done instead (its
# place went with the call): said on its `cancelled` or `caller_gone` line.
KEEP_PLACE = ("to keep the place when a harness stops the call, set SLOTQ_ATTACH_FOR=D (or --attach-for D): the "
              "run outlives the call (exit 75) and `slotq attach RUN_ID` comes back to it")
WHILE_PREPARING = "in its --prepare step: stopped"
WHILE_RUNNING = "while the command ran: stopped"


def exit_code_for(outcome: Outcome, command_code: int | None) -> int:
    """The process exit code for `outcome`; `command_code` for passed/failed."""
    fixed = EXIT_CODES[outcome]
    if fixed is not None:
        return fixed
    if outcome is Outcome.PASSED:
        return 0
    return command_code if command_code else 1
