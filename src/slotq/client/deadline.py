"""The deadline keeper: a job's budget, extended by the time its work waited.

    budget runs out ─► ask the ledger for the waits of the credit dir since the start
        ├─ waits not yet credited ─► extend by them (each wait credited once)
        ├─ a wait still in progress ─► look again after `recheck`
        └─ nothing new ─► over: `budget_exhausted`
    a delivery deadline (if any) is never extended ─► over: `deadline`

Limits are absolute deadlines on the clock (`Timer`s), set once at the start
and only ever moved later. Used by `slotq task`, and directly by harnesses:

    d = Deadline(budget=1800, credit_dir=workdir)
    while not d.over():
        ...  # d.remaining() is the time to the next decision point
    d.reason  # Outcome.BUDGET_EXHAUSTED or Outcome.DEADLINE
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..clock import INF, Clock, Timer
from ..outcome import Outcome
from .ledger import Ledger, union_seconds

CREDIT_MODES = ("union", "sum")
DEFAULT_RECHECK = 60.0


class Extension:
    """One extension of the budget: when, by how much, for which waits."""

    __slots__ = ("at", "seconds", "wait_ids", "new_budget")

    def __init__(self, at: float, seconds: float, wait_ids: list[int], new_budget: float) -> None:
        self.at = at  # wall clock
        self.seconds = seconds
        self.wait_ids = wait_ids
        self.new_budget = new_budget  # the budget with every credit so far

    def to_dict(self) -> dict[str, object]:
        return {"at": self.at, "seconds": round(self.seconds, 3), "wait_ids": self.wait_ids,
                "new_budget_s": round(self.new_budget, 3)}


def _seconds(name: str, value: object) -> None:
    """A duration argument: seconds, a finite number above zero (a NaN
    budget never ran out; a string failed deep inside, as a comparison)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be seconds (an int or float), not {type(value).__name__} {value!r}")
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a finite number of seconds above zero, got {value!r}")


class Deadline:
    """A budget that waits recorded in the ledger extend, and an optional
    delivery deadline that nothing extends.

    budget: seconds of work allowed. deadline: seconds until delivery is due
    (None: none). credit_dir: whose waits count (None: no credit). credit:
    "union" (overlapping waits count once) or "sum". recheck: how soon to look
    again while a wait is still in progress. ledger: a `Ledger`, or a
    callable returning one (opened lazily; default: the user's ledger).
    on_extend: called with each `Extension`.
    """

    def __init__(
        self,
        budget: float,
        *,
        deadline: float | None = None,
        credit_dir: str | os.PathLike[str] | None = None,
        credit: str = "union",
        recheck: float = DEFAULT_RECHECK,
        clock: Clock | None = None,
        ledger: Ledger | Callable[[], Ledger] | None = None,
        on_extend: Callable[[Extension], None] | None = None,
    ) -> None:
        _seconds("budget", budget)
        if deadline is not None:
            _seconds("deadline", deadline)
        _seconds("recheck", recheck)
        if credit_dir is not None and not os.path.isdir(credit_dir):
            # As `slotq task --credit-dir` refuses it: no wait could ever be credited.
            raise ValueError(f"credit_dir {os.fspath(credit_dir)!r} is not a directory")
        if credit not in CREDIT_MODES:
            raise ValueError(f"credit must be one of {CREDIT_MODES}, got {credit!r}")
        self.clock = clock or Clock()
        self.started_wall = self.clock.wall()
        self.budget = self.clock.timer("budget", budget)
        self.delivery: Timer | None = self.clock.timer("deadline", deadline) if deadline is not None else None
        # Absolute (resolved once): a relative dir in a result means nothing elsewhere.
        self.credit_dir = os.path.realpath(os.fspath(credit_dir)) if credit_dir is not None else None
        self.credit_mode = credit
        self.recheck = recheck
        self._ledger = ledger
        self.on_extend = on_extend
        self.reason: Outcome | None = None
        self.extensions: list[Extension] = []
        self.credit_errors: list[str] = []
        self._credited: dict[int, tuple[float, float]] = {}
        self._next_check = self.budget.deadline

    # ------------------------------------------------------------ questions
    def over(self) -> bool:
        """Is the job over? Runs the credit check when the budget has run out."""
        if self.reason is not None:
            return True
        now = self.clock.monotonic()
        if self.delivery is not None and self.delivery.remaining(now) <= 0:
            self.reason = Outcome.DEADLINE
            return True
        while now >= self._next_check and self.reason is None:
            if self.budget.remaining(now) > 0:
                self._next_check = self.budget.deadline  # a recheck after an extension
                break
            self._claim(now)
        return self.reason is not None

    def remaining(self) -> float:
        """Seconds until the next decision point (0 when over)."""
        if self.reason is not None:
            return 0.0
        nxt = self._next_check
        if self.delivery is not None:
            nxt = min(nxt, self.delivery.deadline)
        return max(0.0, nxt - self.clock.monotonic())

    def budget_left(self) -> float:
        """Seconds of budget left, credits included (negative once spent)."""
        return self.budget.remaining(self.clock.monotonic())

    @property
    def credited(self) -> float:
        return sum(e.seconds for e in self.extensions)

    def wait(self) -> Outcome:
        """Block until the job is over; returns why."""
        while not self.over():
            self.clock.sleep(self.remaining())
        assert self.reason is not None
        return self.reason

    async def wait_async(self) -> Outcome:
        """`wait` for asyncio code."""
        import asyncio

        while not self.over():
            await asyncio.sleep(self.remaining())
        assert self.reason is not None
        return self.reason

    # ------------------------------------------------------------ credit
    def _claim(self, now: float) -> None:
        credit = self._query()
        if credit is None:
            self.reason = Outcome.BUDGET_EXHAUSTED
            return
        waits, in_progress = credit
        new = [w for w in waits if w[0] not in self._credited]
        seconds = 0.0
        if new:
            if self.credit_mode == "sum":
                seconds = sum(end - start for _, start, end in new)
            else:
                before = union_seconds(list(self._credited.values()))
                after = union_seconds(list(self._credited.values()) + [(s, e) for _, s, e in new])
                seconds = after - before
            for wid, start, end in new:
                self._credited[wid] = (start, end)
        if seconds > 0:
            self.budget.extend(seconds)
            ext = Extension(self.clock.wall(), seconds, [w[0] for w in new], self.budget.length)
            self.extensions.append(ext)
            self._next_check = self.budget.deadline
            if self.on_extend is not None:
                self.on_extend(ext)
        elif in_progress:
            self._next_check = now + self.recheck
        else:
            self.reason = Outcome.BUDGET_EXHAUSTED

    def _query(self) -> tuple[list[tuple[int, float, float]], bool] | None:
        if self.credit_dir is None:
            return None
        try:
            ledger = self._ledger
            if ledger is None or not isinstance(ledger, Ledger):
                ledger = self._ledger = ledger() if callable(ledger) else Ledger()
            c = ledger.credit(self.credit_dir, self.started_wall, self.clock.wall())
        except Exception as e:  # sqlite3.Error, OSError: no credit can be proven
            self.credit_errors.append(f"cannot read the wait ledger: {e}")
            return [], False
        return [(w.record.id, w.start, w.end) for w in c.waits], bool(c.in_progress)

    def to_dict(self) -> dict[str, object]:
        return {
            "reason": self.reason.value if self.reason else None,
            "budget_s": round(self.budget.length - self.credited, 3),
            "credited_s": round(self.credited, 3),
            "deadline_s": round(self.delivery.length, 3) if self.delivery else None,
            "credit": self.credit_mode, "credit_dir": self.credit_dir,
            "extensions": [e.to_dict() for e in self.extensions],
        }


__all__ = ["Deadline", "Extension", "CREDIT_MODES", "INF"]
