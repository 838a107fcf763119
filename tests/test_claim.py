"""The claim window (host/claim.py), as pure logic: a fake clock, a lock
table made by hand. The real thing, as two users, is in
test_shared_trust.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slotq.host import claim
from slotq.host.claim import BUSY_WINDOW, CLAIM_WINDOW, HEIR_WINDOW, LOOK_EVERY, LOOK_MOST, OWNER_GRACE, Claims
from slotq.host.line import Entry

GONE = 2 ** 22 + 12345  # a pid no process has (its CPU reads as constant, its user unknown)


def _key(p: Path) -> tuple[int, int]:
    st = os.stat(p)
    return st.st_dev, st.st_ino


def _entries(*tickets: Path) -> list[Entry]:
    out = []
    for p in tickets:
        st = os.stat(p)
        out.append(Entry(int(p.name[:-2]), str(p), st.st_dev, st.st_ino, st.st_ctime_ns, st.st_uid))
    return out


@pytest.fixture
def line(tmp_path: Path) -> tuple[Claims, list[Path], Path]:
    """Two tickets ahead of ours, one slot."""
    tickets = [tmp_path / f"{i:016d}.t" for i in (1, 2)]
    slot = tmp_path / "shared.0"
    for p in (*tickets, slot):
        p.touch()
    return Claims(_entries(*tickets), [str(slot)]), tickets, slot


def _table(*held: Path, pid: int = GONE) -> dict[tuple[int, int], list[int]]:
    return {_key(p): [pid] for p in held}


@pytest.mark.timeout(10)
def test_an_idle_head_leaving_the_slot_free_is_passed_over_after_the_window(line: tuple[Claims, list[Path], Path]
                                                                           ) -> None:
    claims, (first, second), _ = line
    table = _table(first, second)
    assert claims.look(100.0, table) is None  # first seen
    assert claims.look(100.0 + CLAIM_WINDOW - 0.1, table) is None
    assert claims.look(100.0 + CLAIM_WINDOW, table) == str(first)
    assert claims.passed == {str(first)}
    # The next one is its owner's too: it has had the window already, and
    # gets the grace a run of that owner right behind needs to claim.
    assert claims.look(100.0 + CLAIM_WINDOW + OWNER_GRACE - 0.1, table) is None
    assert claims.look(100.0 + CLAIM_WINDOW + OWNER_GRACE, table) == str(second)


@pytest.mark.timeout(10)
def test_in_a_drained_pool_no_head_is_passed_over_however_long_the_slot_stays_free(tmp_path: Path) -> None:
    # The owner drained it (host/drain.py): the heads wait as they should,
    # and the line keeps its order for the resume.
    from slotq.host.drain import write

    state, pdir = tmp_path / "state", tmp_path / "state" / "tickets" / "shared"
    pdir.mkdir(parents=True)
    tickets = [pdir / f"{i:016d}.t" for i in (1, 2)]
    slot = tmp_path / "shared.0"
    for p in (*tickets, slot):
        p.touch()
    claims = Claims(_entries(*tickets), [str(slot)], None, (str(state), "shared"))
    write(str(state), "shared", "disk swap")
    table = _table(*tickets)
    for t in range(0, int(10 * (CLAIM_WINDOW + BUSY_WINDOW))):
        assert claims.look(float(t), table) is None
    os.unlink(state / "drain.shared")  # resumed: a head that then leaves the slot free is judged again
    assert claims.look(1000.0, table) is None
    assert claims.look(1000.0 + CLAIM_WINDOW, table) == str(tickets[0])


@pytest.mark.timeout(10)
def test_a_chain_of_one_owners_tickets_costs_one_window_however_long(tmp_path: Path) -> None:
    tickets = [tmp_path / f"{i:016d}.t" for i in range(1, 201)]
    slot = tmp_path / "shared.0"
    for p in (*tickets, slot):
        p.touch()
    claims = Claims(_entries(*tickets), [str(slot)])
    table = _table(*tickets)
    t = 0.0
    while t < CLAIM_WINDOW + OWNER_GRACE:
        claims.look(t, table)
        t += LOOK_EVERY
    assert claims.look(t, table) == str(tickets[-1])
    assert claims.passed == {str(p) for p in tickets}


@pytest.mark.timeout(10)
@pytest.mark.skipif(os.getuid() != 0, reason="gives tickets to other users (chown)")
def test_a_head_of_another_owner_after_a_pass_gets_the_heirs_window(tmp_path: Path) -> None:
    tickets = [tmp_path / f"{i:016d}.t" for i in (1, 2, 3)]
    slot = tmp_path / "shared.0"
    for p in (*tickets, slot):
        p.touch()
    os.chown(tickets[1], 4242, -1)  # another member's, right behind the first
    claims = Claims(_entries(*tickets), [str(slot)])
    table = _table(*tickets)
    assert claims.look(0.0, table) is None
    assert claims.look(CLAIM_WINDOW, table) == str(tickets[0])
    # An honest run there notices the free slot up to LOOK_MOST after us and
    # needs the window and the grace itself: it is given that, and more.
    assert HEIR_WINDOW > LOOK_MOST + CLAIM_WINDOW + OWNER_GRACE
    assert claims.look(CLAIM_WINDOW + HEIR_WINDOW - 0.1, table) is None
    assert str(tickets[1]) not in claims.passed
    # The first owner's other ticket behind it was struck already, its grace
    # long over: passed over at the same look.
    assert claims.look(CLAIM_WINDOW + HEIR_WINDOW, table) == str(tickets[2])
    assert claims.passed == {str(p) for p in tickets}


@pytest.mark.timeout(10)
@pytest.mark.skipif(os.getuid() != 0, reason="gives a ticket to another user (chown)")
def test_a_ticket_locked_only_by_another_user_than_its_owner_is_no_place(tmp_path: Path) -> None:
    tickets = [tmp_path / f"{i:016d}.t" for i in (1, 2)]
    slot = tmp_path / "shared.0"
    for p in (*tickets, slot):
        p.touch()
    os.chown(tickets[0], 4242, -1)  # a dead member's ticket, locked now by us (root)
    claims = Claims(_entries(*tickets), [str(slot)])
    table = {**_table(tickets[0], pid=os.getpid()), **_table(tickets[1])}
    assert claims.look(0.0, table) == str(tickets[0])  # at once
    assert claims.passed == {str(tickets[0])}


@pytest.mark.timeout(10)
def test_a_busy_slot_or_a_new_head_starts_the_window_again(line: tuple[Claims, list[Path], Path]) -> None:
    claims, (first, second), slot = line
    assert claims.look(0.0, _table(first, second)) is None
    assert claims.look(4.0, _table(first, second, slot)) is None  # the slot taken: no claim owed
    assert claims.look(6.0, _table(first, second)) is None  # free again: a new window
    assert claims.look(6.0 + CLAIM_WINDOW - 0.1, _table(first, second)) is None
    assert claims.look(20.0, _table(second, slot)) is None  # the first claimed: the episode ends
    assert claims.look(21.0, _table(second)) is None  # the second is a new head, a new episode
    assert claims.look(21.0 + CLAIM_WINDOW, _table(second)) == str(second)
    assert claims.passed == {str(second)}


@pytest.mark.timeout(10)
def test_a_head_whose_holder_uses_cpu_gets_the_busy_window(line: tuple[Claims, list[Path], Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    claims, (first, second), _ = line
    ticks = iter(range(1000))
    monkeypatch.setattr(claim, "_cpu_ticks", lambda pids: next(ticks))  # loading: a new figure every look
    table = _table(first, second)
    t = 0.0
    while t < BUSY_WINDOW:
        assert claims.look(t, table) is None, t
        t += 1.0
    assert claims.look(BUSY_WINDOW, table) == str(first)


@pytest.mark.timeout(10)
def test_nobody_is_passed_over_without_the_kernels_word(line: tuple[Claims, list[Path], Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    claims, _, _ = line
    monkeypatch.setattr("slotq.host.proclocks.raw", lambda: None)
    for t in range(0, 100, 5):
        assert claims.look(float(t)) is None
    assert not claims.passed


@pytest.mark.timeout(10)
def test_a_users_later_runs_pass_over_at_once_what_its_runs_passed_over(line: tuple[Claims, list[Path], Path],
                                                                       tmp_path: Path) -> None:
    claims, (first, second), slot = line
    shared = tmp_path / "passed"
    ahead = _entries(first, second)
    one = Claims(ahead, [str(slot)], str(shared))
    assert not one.passed
    table = _table(first, second)
    assert one.look(0.0, table) is None
    assert one.look(CLAIM_WINDOW, table) == str(first)
    assert Claims(ahead, [str(slot)], str(shared)).passed == {str(first)}  # a later run: at once
    # A ticket made anew under the same name and inode number is not it.
    e = ahead[0]
    remade = [Entry(e.seq, e.path, e.dev, e.ino, e.ctime_ns + 1, e.uid), ahead[1]]
    assert not Claims(remade, [str(slot)], str(shared)).passed
    # Nor is a file someone else could have written trusted.
    shared.chmod(0o666)
    assert not Claims(ahead, [str(slot)], str(shared)).passed


@pytest.mark.timeout(10)
def test_far_back_a_waiter_checks_rarely_and_looks_only_at_a_free_slot(tmp_path: Path) -> None:
    import fcntl

    tickets = [tmp_path / f"{i:016d}.t" for i in range(1, 13)]
    slot = tmp_path / "shared.0"
    for p in (*tickets, slot):
        p.touch()
    fds = {p: os.open(p, os.O_RDONLY) for p in tickets}
    try:
        for fd in fds.values():
            fcntl.flock(fd, fcntl.LOCK_EX)  # each ticket ahead live, as its caller holds it

        def behind(n: int, start: int = 0) -> Claims:  # a waiter with n tickets ahead of it
            return Claims(_entries(*tickets[start:start + n]), [str(slot)])

        assert [behind(n).every(0.0) for n in (1, 2, 3)] == [LOOK_EVERY, 4 * LOOK_EVERY, min(9 * LOOK_EVERY, LOOK_MOST)]
        assert behind(12).every(0.0) == LOOK_MOST  # far back: rarely
        # The line moves up while it waits: its place is counted anew.
        far = behind(3)
        for p in tickets[:2]:
            p.unlink()
        assert far.every(0.0) == LOOK_EVERY
        # Only live tickets count: a name planted in the line (nobody's lock
        # on it) pushes nobody back.
        planted = behind(4, start=2)
        for p in tickets[3:6]:
            os.close(fds.pop(p))
        assert planted.every(0.0) == LOOK_EVERY
        # A head seen leaving the slot free: looked at each second while its
        # window may run, even when the slot is taken now and then.
        near = behind(6, start=6)
        assert near.every(0.0) == LOOK_MOST
        assert near.look(0.0, _table(*tickets[6:])) is None
        assert near.every(0.0) == LOOK_EVERY
        assert near.look(1.0, _table(slot, *tickets[6:])) is None  # the slot taken for a moment
        assert near.every(1.0) == LOOK_EVERY
        assert near.every(BUSY_WINDOW) == LOOK_MOST  # nothing seen free since: back to rarely
        # A check far back counts its place and, while the slot is held,
        # does not read the kernel's lock table (every flock(2) on the
        # machine waits while it is read); a slot free is seen again a
        # second later, and only free then too, with the same head, a line
        # that stands still: it looks. Right behind the head, a check looks.
        looks: list[float] = []
        near.look = lambda now, table=None: looks.append(now)  # type: ignore[method-assign]
        slot_fd = os.open(slot, os.O_RDWR)
        fcntl.flock(slot_fd, fcntl.LOCK_EX)
        assert near.check(BUSY_WINDOW) == (None, LOOK_MOST) and looks == []
        os.close(slot_fd)
        assert near.check(BUSY_WINDOW + 1) == (None, LOOK_EVERY) and looks == []  # free: seen again soon
        assert near.check(BUSY_WINDOW + 2) == (None, LOOK_EVERY) and looks == [BUSY_WINDOW + 2]
        for p in tickets[6:11]:
            os.close(fds.pop(p))
        assert near.check(BUSY_WINDOW + 3) == (None, LOOK_EVERY) and looks == [BUSY_WINDOW + 2, BUSY_WINDOW + 3]
    finally:
        for fd in fds.values():
            os.close(fd)
