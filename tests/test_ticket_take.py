"""Taking a ticket (host/ticket.py), with real files and real flock: its
name, and the counter's lock."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from slotq.host.line import list_tickets, pool_dir, probe


def test_a_status_look_leaves_a_ticket_being_made_alone(tmp_path: Path) -> None:
    # A ticket's temp is unlocked from its creation to its creator's flock:
    # a look at the line (`slotq status`, a host survey) in that moment
    # removed it, and the caller failed ("state directory ... is not
    # usable: No such file or directory", benchmarks/binding.py, 12-06).
    from slotq.host.line import STALE_TEMP_S, remove_stale_temps

    pdir = tmp_path / "tickets" / "shared"
    pdir.mkdir(parents=True)
    being_made, left = pdir / ".0000000000000001.123.ab.tmp", pdir / ".0000000000000002.124.cd.tmp"
    held = pdir / ".0000000000000003.125.ef.tmp"
    for p in (being_made, left, held):
        p.write_text("")
    now = time.time()
    for p in (left, held):
        os.utime(p, (now - STALE_TEMP_S - 1, now - STALE_TEMP_S - 1))
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        remove_stale_temps(str(pdir), now)
        assert sorted(p.name for p in pdir.iterdir()) == [being_made.name, held.name]  # the dead one is gone
    finally:
        os.close(fd)


def test_a_ticket_whose_temp_vanished_before_its_lock_is_named_anew(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # An older slotq's status, in a shared line, may still remove a temp
    # in the moment before its creator locks it: the caller takes the next
    # name, rather than failing.
    from slotq.host import ticket
    from slotq.statefile import share_created as real

    removed: list[str] = []

    def share_then_lose(fd: int, path: str, *, writable: bool = True) -> None:
        real(fd, path, writable=writable)
        temps = [n for n in os.listdir(path) if n.endswith(".tmp")]  # (the first call shares the counter)
        if temps and not removed:
            os.unlink(os.path.join(path, temps[0]))
            removed.append(temps[0])

    monkeypatch.setattr("slotq.host.ticket.share_created", share_then_lose)
    t = ticket.take_ticket(str(tmp_path), "shared", {"run_id": "r-1"})
    try:
        assert removed and removed[0].startswith(".") and removed[0].endswith(".tmp")
        assert [os.path.basename(p) for _, p in list_tickets(pool_dir(str(tmp_path), "shared"))] == [
            os.path.basename(t.path)]
        assert probe(t.path) is True
    finally:
        os.close(t.fd)


@pytest.mark.timeout(30)
def test_the_ticket_counter_wait_goes_on_without_the_lock_only_when_nobody_takes_tickets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A crowd (a thousand callers started at once on two cores) keeps the
    # counter moving: waiting longer than the limit is then no reason to
    # go on without the lock. A holder that sits on it, the counter still, is.

    from slotq.host import ticket

    monkeypatch.setattr(ticket, "SEQ_LOCK_LIMIT", 0.3)
    seq = tmp_path / "seq"
    seq.write_text("%020d\n" % 0)
    holder = os.open(seq, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    stop = threading.Event()

    def crowd() -> None:  # tickets taken all the time, the lock never free to us
        n = 0
        while not stop.wait(0.05):
            n += 1
            os.pwrite(holder, b"%020d\n" % n, 0)

    t = threading.Thread(target=crowd)
    t.start()
    mine = os.open(seq, os.O_RDWR)
    try:
        def crowd_done() -> None:
            stop.set()
            fcntl.flock(holder, fcntl.LOCK_UN)

        threading.Timer(1.5, crowd_done).start()
        t0 = time.monotonic()
        assert ticket._lock_seq(mine, str(seq), None)  # 5x the limit, and it is ours
        assert time.monotonic() - t0 >= 1.4
        fcntl.flock(mine, fcntl.LOCK_UN)
        t.join()
        fcntl.flock(holder, fcntl.LOCK_EX)  # now a holder that sits still
        t0 = time.monotonic()
        assert ticket._lock_seq(mine, str(seq), None) is False  # not ours: the run goes on without it
        assert time.monotonic() - t0 >= 0.3
    finally:
        stop.set()
        os.close(mine)
        os.close(holder)


@pytest.mark.timeout(30)
def test_a_machine_that_stood_still_is_not_a_stuck_ticket_counter(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # A paused VM: the clock jumps past the limit between two looks. That
    # is not a holder sitting on the counter (seen once in a benchmark run
    # on a stalled machine: one of 1000 callers refused at the counter).
    import types

    from slotq.host import ticket

    seq = tmp_path / "seq"
    seq.write_text("%020d\n" % 0)
    holder = os.open(seq, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    jump = [0.0]
    monkeypatch.setattr(ticket, "time", types.SimpleNamespace(monotonic=lambda: time.monotonic() + jump[0],
                                                              sleep=time.sleep))
    looks: list[float] = []

    def wait(seconds: float) -> None:
        looks.append(seconds)
        if len(looks) == 1:
            jump[0] = ticket.SEQ_LOCK_LIMIT + 1  # the machine stood still here
        if len(looks) == 5:
            fcntl.flock(holder, fcntl.LOCK_UN)  # the honest holder's microseconds end
        # No real pause: the clock above says how long the looks took.

    mine = os.open(seq, os.O_RDWR)
    try:
        ticket._lock_seq(mine, str(seq), wait)  # ours, not an error
        assert len(looks) == 5
    finally:
        os.close(mine)
        os.close(holder)


def test_a_run_of_planted_names_at_the_present_microsecond_is_passed_in_one_listing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from slotq.host import ticket

    now_us = 1_800_000_000_000_000
    monkeypatch.setattr(ticket, "time", types.SimpleNamespace(time_ns=lambda: now_us * 1000,
                                                              monotonic=time.monotonic, sleep=time.sleep))
    pdir = tmp_path / "tickets" / "shared"
    pdir.mkdir(parents=True)
    for i in range(now_us, now_us + 500):
        (pdir / f"{i:016d}.t").touch()  # planted: nobody holds them
    listings: list[str] = []
    real = ticket.ticket_names  # type: ignore[attr-defined]

    def names(path: str) -> list[tuple[int, str]]:
        listings.append(path)
        return real(path)

    monkeypatch.setattr(ticket, "ticket_names", names)
    t = ticket.take_ticket(str(tmp_path), "shared", {"run_id": "r-1"})
    try:
        # (The dead names it looked at above the present are removed as it
        # goes: ours. Another member's stay, and are passed all the same.)
        assert now_us < t.seq <= now_us + 500 and os.path.basename(t.path) == f"{t.seq:016d}.t"
        assert len(listings) == 2  # the highest live one, and the one listing of the names taken
    finally:
        os.close(t.fd)


@pytest.mark.timeout(30)
def test_a_ticket_named_long_after_its_number_takes_a_new_one_and_is_never_placed_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A caller not run for seconds between taking its number and naming its
    # ticket (a thousand started at once on two cores), while others went
    # on without the counter's lock and named higher numbers first: named
    # that late, its ticket was taken for a renamed one and placed last --
    # then back in its place once those left, ahead of waiters that had
    # listed the line meanwhile, who were in turn ahead of it in its own
    # listing: a line of 1000 stood still, its heads passed over (12-08).
    from slotq.host import line, ticket

    monkeypatch.setattr(line, "FORGED_SLACK_NS", 100_000_000)  # 0.1 s: the stall below need not be long
    monkeypatch.setattr(ticket, "STALE_NAMING_NS", 50_000_000, raising=False)
    real_name = ticket._name_ticket
    others: list[ticket.Ticket] = []

    def late(pdir: str, seq: int, info: dict[str, object]) -> int:
        if not others:  # meanwhile, another caller numbers after us and names before us
            others.append(ticket.Ticket(os.path.join(pdir, f"{seq + 1000:016d}.t"),
                                        real_name(pdir, seq + 1000, dict(info, run_id="other")), seq + 1000,
                                        "shared", {}))
            time.sleep(0.3)  # sleep-ok: we are not run for a while (the stall this test is about)
        return real_name(pdir, seq, info)

    monkeypatch.setattr(ticket, "_name_ticket", late)
    mine = ticket.take_ticket(str(tmp_path), "shared", {"run_id": "mine"})
    try:
        entries = line.scan(pool_dir(str(tmp_path), "shared"))
        assert not [e.path for e in entries if e.forged], "no honest ticket is placed last"
        assert [e.path for e in entries] == [others[0].path, mine.path], "a new number, behind the one named first"
        assert mine.seq > others[0].seq
    finally:
        for t in (mine, *others):
            t.withdraw()
