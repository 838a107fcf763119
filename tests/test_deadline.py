"""The deadline keeper on a fake clock, with a real ledger file."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from slotq.clock import FakeClock
from slotq.client.deadline import Deadline
from slotq.client.ledger import Ledger
from slotq.outcome import Outcome


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(str(tmp_path / "ledger.sqlite"))


def run_until_over(d: Deadline, clock: FakeClock, limit: float = 10_000) -> list[float]:
    """Jump from decision point to decision point; returns the check times."""
    checks = []
    start = clock.monotonic()
    while not d.over():
        clock.advance(d.remaining())
        checks.append(clock.monotonic() - start)
        assert clock.monotonic() - start < limit, "never ended"
    return checks


def test_a_300s_wait_is_credited_once(ledger: Ledger, tmp_path: Path) -> None:
    clock = FakeClock()
    t0 = clock.wall()
    d = Deadline(600, credit_dir=tmp_path, clock=clock, ledger=ledger)
    wid = ledger.open_wait(run_id="r", workdir=str(tmp_path), host="h", kind="queue", start=t0 + 10)
    ledger.close_wait(wid, t0 + 310)
    clock.advance(600)
    assert not d.over()  # credited: 300 s more
    assert [(e.seconds, e.wait_ids) for e in d.extensions] == [(300, [wid])]
    assert d.remaining() == pytest.approx(300)
    clock.advance(300)
    assert d.over() and d.reason is Outcome.BUDGET_EXHAUSTED
    assert len(d.extensions) == 1  # not extended again by the same wait


def test_while_a_wait_is_in_progress_the_keeper_checks_again_every_60s(ledger: Ledger, tmp_path: Path) -> None:
    clock = FakeClock()
    t0 = clock.wall()
    d = Deadline(100, credit_dir=tmp_path, clock=clock, ledger=ledger)
    # A live process (this one) is still waiting.
    wid = ledger.open_wait(run_id="r", workdir=str(tmp_path), host="h", kind="queue", start=t0 + 50)
    checks = []
    for _ in range(3):
        clock.advance(d.remaining())
        assert not d.over()
        checks.append(clock.monotonic() - 1000)
    assert checks == [100, 160, 220]
    assert d.extensions == []
    ledger.close_wait(wid, t0 + 250)  # its wait ends at 250: 200 s waited
    clock.advance(d.remaining())  # the check at 280 credits it
    assert not d.over()
    assert [e.seconds for e in d.extensions] == [200]
    # budget 100 + 200 credited = 300; nothing new after that
    assert run_until_over(d, clock) == [20]
    assert d.reason is Outcome.BUDGET_EXHAUSTED


def test_with_no_new_wait_the_budget_is_not_extended(ledger: Ledger, tmp_path: Path) -> None:
    clock = FakeClock()
    d = Deadline(30, credit_dir=tmp_path, clock=clock, ledger=ledger)
    assert run_until_over(d, clock) == [30]
    assert d.reason is Outcome.BUDGET_EXHAUSTED and d.extensions == []


def test_the_delivery_deadline_is_never_extended(ledger: Ledger, tmp_path: Path) -> None:
    clock = FakeClock()
    t0 = clock.wall()
    d = Deadline(60, deadline=100, credit_dir=tmp_path, clock=clock, ledger=ledger)
    wid = ledger.open_wait(run_id="r", workdir=str(tmp_path), host="h", kind="queue", start=t0)
    ledger.close_wait(wid, t0 + 500)
    checks = run_until_over(d, clock)
    assert checks == [60, 100]  # extended at 60, but the deadline holds at 100
    assert d.reason is Outcome.DEADLINE


@pytest.mark.parametrize("mode,credited", [("union", 150), ("sum", 200)])
def test_overlapping_waits_are_credited_by_the_chosen_measure(
        ledger: Ledger, tmp_path: Path, mode: str, credited: float) -> None:
    clock = FakeClock()
    t0 = clock.wall()
    d = Deadline(10, credit_dir=tmp_path, clock=clock, ledger=ledger, credit=mode)
    for start, end in ((0, 100), (50, 150)):
        wid = ledger.open_wait(run_id="r", workdir=str(tmp_path), host="h", kind="queue", start=t0 + start)
        ledger.close_wait(wid, t0 + end)
    clock.advance(200)  # the job looks at its deadline only now: both waits are over
    run_until_over(d, clock)
    assert d.credited == credited


def test_union_credit_across_two_extensions_counts_an_overlap_once(ledger: Ledger, tmp_path: Path) -> None:
    clock = FakeClock()
    t0 = clock.wall()
    d = Deadline(100, credit_dir=tmp_path, clock=clock, ledger=ledger)
    a = ledger.open_wait(run_id="a", workdir=str(tmp_path), host="h", kind="queue", start=t0)
    ledger.close_wait(a, t0 + 80)
    clock.advance(100)
    assert not d.over()
    b = ledger.open_wait(run_id="b", workdir=str(tmp_path), host="h", kind="queue", start=t0 + 40)
    ledger.close_wait(b, t0 + 120)  # overlaps a by 40 s
    run_until_over(d, clock)
    assert [e.seconds for e in d.extensions] == [80, 40]


def test_without_a_credit_dir_the_budget_is_final() -> None:
    clock = FakeClock()
    d = Deadline(5, clock=clock)
    assert run_until_over(d, clock) == [5]
    assert d.reason is Outcome.BUDGET_EXHAUSTED


def test_an_unreadable_ledger_gives_no_credit_and_says_so(tmp_path: Path) -> None:
    clock = FakeClock()
    blocker = tmp_path / "file"
    blocker.write_text("")

    d = Deadline(5, clock=clock, credit_dir=tmp_path, ledger=lambda: Ledger(str(blocker / "x.sqlite")))
    run_until_over(d, clock)
    assert d.reason is Outcome.BUDGET_EXHAUSTED
    assert d.credit_errors and "ledger" in d.credit_errors[0]


def test_relative_limits_become_absolute_deadlines_once(tmp_path: Path) -> None:
    clock = FakeClock()
    d = Deadline(50, deadline=80, clock=clock)
    assert [(t.name, t.length, t.created) for t in clock.timers] == [("budget", 50, 1000), ("deadline", 80, 1000)]
    clock.advance(20)
    assert d.remaining() == 30 and d.budget_left() == 30


@pytest.mark.parametrize("bad, error, needle", [
    (dict(budget=0), ValueError, "budget must be a finite number of seconds above zero, got 0"),
    (dict(budget=5, credit="max"), ValueError, "credit must be one of"),
    # A NaN budget never ran out; a string failed as a comparison, deep inside.
    (dict(budget=float("nan")), ValueError, "budget must be a finite number of seconds above zero, got nan"),
    (dict(budget=float("inf")), ValueError, "budget must be a finite"),
    (dict(budget="10m"), TypeError, "budget must be seconds .an int or float., not str '10m'"),
    (dict(budget=True), TypeError, "budget must be seconds"),
    (dict(budget=5, deadline=-1), ValueError, "deadline must be a finite number of seconds above zero, got -1"),
    (dict(budget=5, deadline=0), ValueError, "deadline must be"),  # it meant "no deadline"; None says that
    (dict(budget=5, recheck=0), ValueError, "recheck must be"),  # looked again at once, for ever
    # Refused as `slotq task --credit-dir` refuses it: no wait would ever count.
    (dict(budget=5, credit_dir="/nonexistent-credit-dir"), ValueError,
     "credit_dir '/nonexistent-credit-dir' is not a directory"),
])
def test_bad_deadline_arguments_are_rejected(bad: dict[str, object], error: type[Exception], needle: str) -> None:
    with pytest.raises(error, match=needle):
        Deadline(**bad)  # type: ignore[arg-type]


@pytest.mark.timeout(10)
def test_asyncio_use_ends_the_job_with_its_reason(tmp_path: Path) -> None:
    d = Deadline(0.05, credit_dir=tmp_path, ledger=Ledger(str(tmp_path / "l.sqlite")))
    assert asyncio.run(d.wait_async()) is Outcome.BUDGET_EXHAUSTED
    assert d.budget_left() <= 0
    assert os.path.exists(tmp_path / "l.sqlite")
