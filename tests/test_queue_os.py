"""Real OS behaviour in a temp dir: real flock, real inotify, real processes."""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import blocked_in_flock, history_written, take_slot, wait_for
from slotq.config import HostConfig
from slotq.host.hostqueue import Waiter
from slotq.host.line import list_tickets, pool_dir, probe
from slotq.host.slot import SlotProbe, read_slot

CFG = HostConfig()


def fd_target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""  # the listing's own descriptor, closed by now


def readable(w: Waiter, timeout: float = 0.0) -> bool:
    return bool(select.select([w.fileno()], [], [], timeout)[0])


def holder_process(state_dir: Path, what: str) -> subprocess.Popen[str]:
    """A separate process that takes a ticket or a slot and sleeps on stdin."""
    code = f"""
import sys
from slotq.config import HostConfig
from slotq.host.hostqueue import Waiter
from slotq.host.slot import SlotProbe
if {what!r} == "slot":
    lease = SlotProbe({str(state_dir)!r}, "shared", 1).try_lease()
    assert lease is not None
else:
    w = Waiter({str(state_dir)!r}, HostConfig(), "shared", {{"label": "other"}})
print("ready", flush=True)
sys.stdin.read()
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_ticket_of_a_sigkilled_waiter_is_found_dead_and_removed(tmp_path: Path) -> None:
    p = holder_process(tmp_path, "ticket")
    [(_, path)] = list_tickets(pool_dir(str(tmp_path), "shared"))
    assert probe(path) is True
    p.kill()
    p.wait()
    assert probe(path) is False
    assert list_tickets(pool_dir(str(tmp_path), "shared")) == []


# Wake-up latency belongs to the benchmarks (benchmarks/: hand-over in
# milliseconds, against flock). Here: the head is woken by the event itself,
# far sooner than its safety-net poll (30 s) could, however busy the machine.

def test_a_release_wakes_the_head_by_its_event_not_its_poll(tmp_path: Path) -> None:
    lease = take_slot(tmp_path)
    b = Waiter(str(tmp_path), CFG, "shared", {})
    assert b.attempt() is None
    assert b.wait_timeout() >= 30  # only an event can wake it within the bound below
    assert not readable(b)
    t0 = time.monotonic()
    lease.release()
    assert readable(b, timeout=5.0)
    assert time.monotonic() - t0 < 5.0
    assert b.attempt() is not None


def test_a_sigkilled_holder_wakes_the_head_by_its_event_not_its_poll(tmp_path: Path) -> None:
    p = holder_process(tmp_path, "slot")
    b = Waiter(str(tmp_path), CFG, "shared", {})
    assert b.attempt() is None
    assert b.wait_timeout() >= 30
    p.kill()
    assert readable(b, timeout=5.0), "no wake-up from the holder's death"
    p.wait()
    wait_for(lambda: b.attempt() is not None, timeout=5.0, what="the slot, after the wake-up")


def test_a_release_wakes_only_the_head_and_a_departure_only_the_next(tmp_path: Path) -> None:
    # No herd: each waiter watches the live ticket just ahead of it, never
    # the whole line.
    lease = take_slot(tmp_path)
    line = [Waiter(str(tmp_path), CFG, "shared", {}) for _ in range(5)]
    for w in line:
        assert w.attempt() is None
    lease.release()
    assert readable(line[0], 1.0)
    assert [readable(w) for w in line[1:]] == [False, False, False, False]
    won = line[0].attempt()  # the head wins and withdraws its ticket
    assert won is not None
    assert readable(line[1], 1.0)
    assert [readable(w) for w in line[2:]] == [False, False, False]
    assert line[1].attempt() is None and line[1].is_head  # the slot is still held
    assert line[2].attempt() is None and not line[2].is_head


def test_a_waiter_that_will_not_watch_holds_no_inotify_instance(tmp_path: Path) -> None:
    # A one-slot line's waiters leave the wait to their keepers: their own
    # look must not cost an inotify instance (128 per user by default).
    def inotify_fds() -> int:
        return sum(1 for fd in os.listdir("/proc/self/fd") if fd_target(fd) == "anon_inode:inotify")

    lease = take_slot(tmp_path)
    before = inotify_fds()
    w = Waiter(str(tmp_path), CFG, "shared", {})
    assert w.attempt(watch=False) is None
    assert w.fileno() == -1
    assert inotify_fds() == before
    assert w.attempt() is None  # the control: a watching look does take one
    assert inotify_fds() == before + 1
    w.withdraw()
    lease.release()


WAIT_WITHOUT_CTYPES = """
import errno, os, sys
from slotq.config import HostConfig
from slotq.host import keeper, libc
from slotq.host.hostqueue import Waiter
from slotq.host.slot import SlotProbe

state = sys.argv[1]
config = HostConfig(pools={"shared": 2, "landing": 1})
keeper.preload_for_start()
assert keeper._prctl, "no prctl"
w = Waiter(state, config, "shared", {})
assert w.attempt() is None  # both slots held: it watches (inotify) and waits
assert w.fileno() >= 0 and os.readlink(f"/proc/self/fd/{w.fileno()}") == "anon_inode:inotify"
add_watch = libc.function("inotify_add_watch")
assert add_watch is not None and add_watch(-1, b"/", 8) == -1 and libc.errno() == errno.EBADF
assert libc.function("no_such_function_in_libc") is None
w.withdraw()
print("ctypes" in sys.modules)
"""


@pytest.mark.timeout(30)
def test_waiting_on_inotify_and_prctl_do_not_load_ctypes(tmp_path: Path) -> None:
    # ctypes costs a waiting run in a pool of several slots about 1.6 ms of
    # CPU and 0.3 MB (libc.py): inotify and prctl come from _ctypes alone.
    holders = [SlotProbe(str(tmp_path), "shared", 2).try_lease() for _ in range(2)]
    out = subprocess.run([sys.executable, "-c", WAIT_WITHOUT_CTYPES, str(tmp_path)], capture_output=True,
                         text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
    for h in holders:
        assert h is not None
        h.release()


BURY_UNDER_A_STOP = """
import json, os, signal, sys
from slotq.host import line, ticket
from slotq.statefile import open_state

state = sys.argv[1]
t = ticket.take_ticket(state, "shared", {"run_id": "r-victim", "label": "victim", "since": 1.0})
os.close(t.fd)  # its caller is gone: a dead ticket
fd, _ = open_state(t.path, os.O_RDONLY)

class Stop(Exception):
    pass

def stop(signum, frame):
    raise Stop

signal.signal(signal.SIGTERM, stop)
real_unlink = os.unlink

def unlink_then_stop(path, *a, **k):
    real_unlink(path, *a, **k)
    if path == t.path:
        os.kill(os.getpid(), signal.SIGTERM)  # the burier is told to stop right then

os.unlink = unlink_then_stop
try:
    line.bury(t.path, fd)
except Stop:
    print("stopped after")
else:
    print("not stopped")
print(os.path.exists(t.path))
"""


@pytest.mark.timeout(30)
def test_a_dead_ticket_buried_by_a_keeper_told_to_stop_keeps_its_history_line(tmp_path: Path) -> None:
    # Whoever removes a dead ticket writes its run's history line, as nobody
    # else will. A keeper doing that when its own stop arrives (its caller
    # killed) must not leave the ticket removed and the line unwritten.
    out = subprocess.run([sys.executable, "-c", BURY_UNDER_A_STOP, str(tmp_path)], capture_output=True, text=True,
                         timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["stopped after", "False"], out.stdout
    lines = history_written(tmp_path)
    assert [line["run_id"] for line in lines] == ["r-victim"]
    assert lines[0]["outcome"] == "caller_gone"


def test_later_tickets_never_overtake_earlier_live_ones(tmp_path: Path) -> None:
    cfg = HostConfig(pools={"shared": 2})
    line = [Waiter(str(tmp_path), cfg, "shared", {"n": i}) for i in range(6)]
    order: list[int] = []
    leases = []
    for _ in range(3):
        # Everybody looks, in reverse arrival order: only the head may win.
        for i in reversed(range(len(line))):
            if i in order:
                continue
            lease = line[i].attempt()
            if lease is not None:
                order.append(i)
                leases.append(lease)
        if leases:
            leases.pop(0).release()
    while len(order) < 6:
        for i in reversed(range(6)):
            if i not in order and (lease := line[i].attempt()) is not None:
                order.append(i)
                lease.release()
    assert order == sorted(order) == list(range(6))


def test_a_dead_waiter_does_not_block_the_ones_behind_it(tmp_path: Path) -> None:
    lease = take_slot(tmp_path)
    dead = holder_process(tmp_path, "ticket")
    behind = Waiter(str(tmp_path), CFG, "shared", {})
    assert behind.attempt() is None
    dead.kill()
    dead.wait()
    assert readable(behind, 1.0)  # watching the dead ticket ahead fires
    assert behind.attempt() is None  # moved up, now watching the slot
    lease.release()
    assert readable(behind, 1.0)
    assert behind.attempt() is not None


def test_without_inotify_the_fallback_poll_still_hands_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOTQ_NO_INOTIFY", "1")
    lease = take_slot(tmp_path)
    b = Waiter(str(tmp_path), CFG, "shared", {})
    assert b.attempt() is None
    assert b.fileno() == -1 and b.wait_timeout() <= 1.0  # nothing to wake it: only its poll
    looks = 1
    # The release comes while the waiter sleeps in its poll; only a later look finds the slot.
    threading.Timer(0.2, lease.release).start()
    start = time.monotonic()
    got = None
    while got is None and time.monotonic() - start < 10:
        time.sleep(b.wait_timeout())  # sleep-ok: this is the poll under test
        looks += 1
        got = b.attempt()
    assert got is not None and looks >= 2
    assert time.monotonic() - start < 0.2 + 2 * 1.0  # within a poll interval or two of the release


def test_a_status_probe_at_the_moment_of_release_wakes_the_head_again(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: the holder releases, the head is woken, and just then a
    `slotq status` probe holds a shared lock on the slot -- the head's look
    fails. The probe's own close must wake the head again (its descriptor is
    read-write: IN_CLOSE_WRITE), or the head sleeps with the slot free."""
    import fcntl

    from slotq.host import slot as slot_module

    lease = take_slot(tmp_path)
    b = Waiter(str(tmp_path), CFG, "shared", {})
    assert b.attempt() is None
    lease.release()
    assert readable(b, 5.0)  # the release woke it
    looks: list[object] = []
    real_flock = fcntl.flock

    class AtTheMoment:
        LOCK_SH, LOCK_EX, LOCK_NB, LOCK_UN = fcntl.LOCK_SH, fcntl.LOCK_EX, fcntl.LOCK_NB, fcntl.LOCK_UN

        @staticmethod
        def flock(fd: int, op: int) -> None:
            real_flock(fd, op)
            if op == fcntl.LOCK_SH | fcntl.LOCK_NB:
                looks.append(b.attempt())  # the head looks now: the probe's lock is in the way

    monkeypatch.setattr(slot_module, "fcntl", AtTheMoment)
    held, _ = read_slot(str(tmp_path), "shared", 0)  # status, without the kernel's lock table
    monkeypatch.undo()
    assert looks == [None] and not held  # the head lost that look to the probe
    assert readable(b, 5.0), "the probe's close did not wake the head"
    assert b.attempt() is not None


@pytest.fixture
def no_inotify_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if the per-user cap on inotify instances were reached (EMFILE)."""
    import errno

    from slotq.host import inotify

    def refuse(*a: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(inotify.Watcher, "__init__", refuse)


def test_without_inotify_instances_a_release_still_wakes_the_head_at_once(
        tmp_path: Path, no_inotify_instances: None) -> None:
    lease = take_slot(tmp_path)
    b = Waiter(str(tmp_path), CFG, "shared", {})
    assert b.attempt() is None
    assert b.fileno() >= 0 and not readable(b, 0.05)
    t0 = time.monotonic()
    lease.release()
    assert readable(b, timeout=1.0)
    assert time.monotonic() - t0 < 0.05
    got = b.attempt()
    assert got is not None and got.index == 0
    held, _ = read_slot(str(tmp_path), "shared", 0)
    assert held


def test_without_inotify_instances_order_holds_and_dead_waiters_are_skipped(
        tmp_path: Path, no_inotify_instances: None) -> None:
    lease = take_slot(tmp_path)
    second = Waiter(str(tmp_path), CFG, "shared", {})
    dead = holder_process(tmp_path, "ticket")
    third = Waiter(str(tmp_path), CFG, "shared", {})
    assert second.attempt() is None and third.attempt() is None
    dead.kill()
    dead.wait()
    assert readable(third, 1.0)  # its thread was blocked on the dead ticket
    assert third.attempt() is None  # now behind `second`
    lease.release()
    assert readable(second, 1.0)
    l2 = second.attempt()
    assert l2 is not None
    assert readable(third, 1.0)
    assert third.attempt() is None  # head now, the slot is still held
    l2.release()
    assert readable(third, 1.0)
    assert third.attempt() is not None


def test_status_reads_the_kernel_lock_table_and_wakes_nobody(tmp_path: Path) -> None:
    from slotq.host.proclocks import held
    from slotq.host.status import snapshot

    first = Waiter(str(tmp_path), CFG, "shared", {"label": "first"})
    lease = first.attempt()
    assert lease is not None
    lease.record(label="first", phase="running", pid=os.getpid())  # its runner: the lock's taker
    head = Waiter(str(tmp_path), CFG, "shared", {"label": "head"})
    behind = Waiter(str(tmp_path), CFG, "shared", {"label": "behind"})
    assert head.attempt() is None and behind.attempt() is None
    assert held() is not None
    snap = snapshot(str(tmp_path), CFG, time.time())
    shared = snap["pools"][0]  # type: ignore[index]
    assert shared["slots"][0]["held"] and shared["slots"][0]["label"] == "first"
    assert [w["label"] for w in shared["waiting"]] == ["head", "behind"]
    assert head.position() == (0, 2) and behind.position() == (1, 2)
    assert not readable(head) and not readable(behind)  # looking woke nobody
    lease.release()
    assert readable(head, 1.0)


def test_a_wakeup_that_finds_the_lock_still_held_is_followed_by_quick_rechecks(tmp_path: Path) -> None:
    # IN_CLOSE_WRITE is queued before the closing file's flock is released;
    # a head woken in between must look again soon, not after the 30 s poll.
    lease = take_slot(tmp_path)
    head = Waiter(str(tmp_path), CFG, "shared", {})
    assert head.attempt() is None
    assert head.wait_timeout() >= 30  # idle: only the safety poll
    os.close(os.open(lease.path, os.O_RDWR))  # an event, but the slot is still held
    assert readable(head, 1.0)
    assert head.attempt() is None
    assert [head.wait_timeout() for _ in range(4)] == [0.002, 0.02, 0.2, 30.0]


@pytest.mark.timeout(20)
def test_wait_turn_waits_in_the_kernel_for_the_live_ticket_ahead_and_skips_dead_ones(tmp_path: Path) -> None:
    # A standby keeper's wait for its turn: blocked in flock(2) on the closest
    # live ticket ahead; a dead one on the way is removed, not waited for.
    head = holder_process(tmp_path, "ticket")  # a live ticket, in another process
    dead = holder_process(tmp_path, "ticket")
    wait_for(lambda: len(list_tickets(pool_dir(str(tmp_path), "shared"))) == 2, what="two tickets")
    dead.kill()
    dead.wait()
    mine = Waiter(str(tmp_path), CFG, "shared", {})
    code = ("import sys\nfrom slotq.host.line import wait_turn\n"
            f"wait_turn({mine.ticket.path!r}, {mine.ticket.seq})\nprint('turn', flush=True)\n")
    waiter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(list_tickets(pool_dir(str(tmp_path), "shared"))) == 2,
                 what="the dead ticket removed by the walk")
        wait_for(lambda: blocked_in_flock(waiter.pid), what="the waiter blocked in flock(2)")
        assert waiter.stdout is not None
        assert not select.select([waiter.stdout], [], [], 0)[0]  # still waiting for the head
        t0 = time.monotonic()
        head.stdin.close()  # type: ignore[union-attr]  # the head leaves
        assert waiter.stdout is not None and waiter.stdout.readline() == "turn\n"
        assert time.monotonic() - t0 < 1.0
    finally:
        waiter.kill()
        head.kill()
        mine.withdraw()


@pytest.mark.timeout(20)
def test_wait_turn_far_back_in_line_does_not_open_every_ticket_that_went(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # 100 tickets ahead; all but the closest go while we wait on the closest.
    # When it goes too, our turn comes after one listing of the directory --
    # not after an open (failing) for each of the 99 gone: on every
    # hand-over of a long line, that was milliseconds of CPU.
    from slotq import statefile
    from slotq.host import line

    ahead = [Waiter(str(tmp_path), CFG, "shared", {}) for _ in range(100)]
    mine = Waiter(str(tmp_path), CFG, "shared", {})
    opened: list[str] = []
    real_open = statefile.open_state

    def counting(path: str, flags: int, **kw: object) -> tuple[int, bool]:
        opened.append(path)
        return real_open(path, flags, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(line, "open_state", counting)
    done = threading.Event()

    def turn() -> None:
        line.wait_turn(mine.ticket.path, mine.ticket.seq)
        done.set()

    threading.Thread(target=turn, daemon=True).start()
    try:
        wait_for(lambda: opened == [ahead[-1].ticket.path], what="the wait on the closest ticket ahead")
        for w in ahead[:-1]:
            w.withdraw()
        assert not done.wait(0.2)  # sleep-ok: the closest is still there; no turn yet
        ahead[-1].withdraw()
        assert done.wait(5)
        assert opened == [ahead[-1].ticket.path], f"{len(opened)} opens"
    finally:
        for w in [*ahead, mine]:
            w.withdraw()


@pytest.mark.timeout(20)
def test_wait_turn_takes_a_ticket_ahead_that_became_a_link_for_no_ticket(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Another user may swap their own ticket for a symbolic link between our
    # listing and our open (the tickets directory is shared). A link is
    # nobody's place, as in probe(): our turn is not held up, and the keeper
    # waiting here does not fail (its run would end `unavailable`).
    from slotq.host import line

    mine = Waiter(str(tmp_path), CFG, "shared", {})
    link = os.path.join(os.path.dirname(mine.ticket.path), "0000000000000000.t")
    os.symlink(mine.ticket.path, link)
    monkeypatch.setattr(line, "ahead_entries", lambda pdir, path: [line.Entry(0, link, 0, 0, 0, 0)])
    try:
        line.wait_turn(mine.ticket.path, mine.ticket.seq)
        assert os.path.islink(link)  # not ours to remove
    finally:
        mine.withdraw()
        os.unlink(link)
