"""Passing over tickets at the head of the line that do not take a free slot.

FIFO holds among live callers that *claim*: a real slotq at the head of
its line takes a free slot within milliseconds (its keeper is granted the
slot's lock by the kernel, its runner is woken by inotify). A process that
holds a ticket's lock and does nothing -- a ticket made by hand, a slotq
stopped with SIGSTOP -- would otherwise keep everyone behind it waiting with
the slot free, for ever. A claim is the one thing such a holder cannot fake
without serving the line; so the line is judged by claims, and every waiter
judges, not only the one right behind the head (that one may be the same
member's second ticket, which never judges).

The judgement, one waiter's, over an *episode* (a stretch of its looks
that each found a slot of the pool free; a look that finds every slot
held ends it):
- the first head -- the earliest live ticket ahead of ours not passed
  over -- is passed over once it has left the slot free for
  `CLAIM_WINDOW` with its lock holders idle (`BUSY_WINDOW` while they use
  CPU: a slotq still loading on a crowded machine);
- then every ticket of the same owner (the kernel's owner of the ticket
  file) that has stood in line since the episode began is passed over
  `OWNER_GRACE` after that owner's first pass, all at once: a chain of any
  number of one member's tickets costs the line one window, not one each.
  An honest run of that user right behind its stalled ticket looks each
  second and so claims within the grace;
- a ticket of another owner that becomes the head through our passing (an
  heir) gets `HEIR_WINDOW`: an honest heir further back notices the free
  slot within `LOOK_MOST` of us and needs the window and the grace itself,
  so it claims before we would pass it over;
- a ticket whose lock is held only by processes of another user than the
  ticket file's owner is nobody's place (a dead waiter's ticket locked by
  someone else): passed over at once.
A ticket passed over is not touched: its place is kept, and if it claims
a slot later it gets one like any head.

How often (`every`, `check`): a waiter checks each second (`LOOK_EVERY`)
while at most one live ticket is ahead of it, and for BUSY_WINDOW after a
look found a slot free behind a head; with k live tickets ahead, every k*k
seconds, at most every `LOOK_MOST`. A check counts the place anew (a
probe of the closest tickets ahead) and tries the slots' locks for a
moment (`_free_now`: a shared lock, let go at once; a free slot's head is
woken again by a close for writing); only when a slot is free, or right
behind the head, does it *look*: read the kernel's lock table. The lock
table is dear: a read of /proc/locks takes the kernel's file_rwsem for
writing, which every flock(2) on the machine then waits for. With every
waiter looking each second, 50 idle waiters used 0.23 s of CPU in 20 s and
a line of a thousand had 10.4 ms between hand-overs (6.5x flock's).

One user's waiting runs share what they found: a run that passes a head
over adds it to its user's own file (`shared_path`: in the user's private
state, out of every member's reach -- a name in the shared state dir can
be taken first by another member), and a run of that user that joins the
line later passes those tickets over from its first look.

Nothing here is read from a file another user could write: the lock table,
the ticket and slot files' inodes and owners, /proc/PID of the lock
holders, our own file.
"""

from __future__ import annotations

import os

from .drain import drained
from .proclocks import held_by_owner

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .line import Entry

CLAIM_WINDOW = 5.0  # seconds an idle head may leave a slot free
BUSY_WINDOW = 30.0  # ... and one whose lock holders are busy (loading)
OWNER_GRACE = 3.0  # the head's owner's other tickets, once one of theirs was passed over
LOOK_EVERY = 1.0  # how often the waiter right behind the head looks
LOOK_MOST = 10.0  # ... and the longest a waiter far back goes without a check
HEIR_WINDOW = LOOK_MOST + CLAIM_WINDOW + OWNER_GRACE + 2.0  # a head of another owner, after a pass
PLACE_MOST = 4  # live tickets ahead counted: LOOK_EVERY * 4 * 4 > LOOK_MOST
MAX_SHARED = 64  # tickets remembered in a user's file of passed ones


def drain_of(pdir: str) -> tuple[str, str]:
    """(state dir, pool) of the line whose tickets are in `pdir`."""
    return os.path.dirname(os.path.dirname(pdir)), os.path.basename(pdir)


def shared_path(pdir: str) -> str:
    """This user's file of passed-over tickets for the pool whose tickets
    are in `pdir` (<state dir>/tickets/<pool>), in the user's private state."""
    from ..config import private_state_path

    return private_state_path(os.path.dirname(os.path.dirname(pdir)), "passed", os.path.basename(pdir))


class _Episode:
    """What one waiter saw since its looks began to find a slot free."""

    __slots__ = ("seen", "struck", "passes", "head", "head_since", "idle_since", "cpu")

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}  # ticket -> first look that saw it live ahead, a slot free
        self.struck: dict[int, float] = {}  # owner -> when we first passed over a ticket of theirs
        self.passes = 0
        self.head: str | None = None
        self.head_since = 0.0
        self.idle_since = 0.0  # the first head's holders last seen using CPU
        self.cpu: int | None = None


class Claims:
    """One waiter's view of whether the tickets ahead of it claim.

    `ahead`: the tickets ahead of ours, in line order (line.Entry: path,
    identity, change time, owner; no ticket is ever created ahead of ours).
    `slot_paths`: the pool's slot files. `shared`: this user's file of
    tickets passed over (shared_path), or None."""

    def __init__(self, ahead: list[Entry], slot_paths: list[str], shared: str | None = None,
                 drain: tuple[str, str] | None = None) -> None:
        self.ahead = ahead
        self.slot_paths = slot_paths
        self.shared = shared
        self.drain = drain  # (state dir, pool): while it is drained, a free slot is nobody's fault
        self.passed: set[str] = set()
        known = self._known()
        for e in ahead:
            if (e.dev, e.ino, e.ctime_ns) in known:
                self.passed.add(e.path)
        self._look_until = 0.0  # look each second until then (a slot seen free behind a head)
        self._episode: _Episode | None = None
        self._suspect: str | None = None  # the head at a check that found a slot free (far back)

    def look(self, now: float, table: dict[tuple[int, int], list[int]] | None = None) -> str | None:
        """One look (`table`: proclocks.owners(), read if not given). The
        path of the last ticket passed over at this look, else None."""
        if table is None:
            from .proclocks import owners, raw

            data = raw()
            if data is None:
                return None  # the kernel does not say: nobody is passed over
            if not any(f":{ino} ".encode() not in data for ino in self._slot_inodes()):
                self._episode = None  # every slot held (the usual look: a search, no parse)
                return None
            table = owners(data)
            if table is None:
                return None
        if not self._slot_free(table) or (self.drain is not None and drained(*self.drain)):
            self._episode = None  # (a drained pool's heads wait as they should: drain.py)
            return None
        self._look_until = now + BUSY_WINDOW
        ep = self._episode = self._episode or _Episode()
        live = [e for e in self.ahead if e.path not in self.passed and (e.dev, e.ino) in table]
        for e in live:
            ep.seen.setdefault(e.path, now)
        passed = None
        uids: dict[int, int | None] = {}
        for e in live:
            key = (e.dev, e.ino)
            if held_by_owner(table, key, e.uid, uids) and not self._overdue(e, table[key], now, ep):
                break
            self.passed.add(e.path)
            ep.struck.setdefault(e.uid, now)
            ep.passes += 1
            ep.head = None
            passed = e.path
        if passed is not None:
            self._share()
        return passed

    def _overdue(self, e: Entry, holders: list[int], now: float, ep: _Episode) -> bool:
        """Has the head `e` had its time to claim (see the module's doc)?"""
        if e.uid in ep.struck:
            return now - max(ep.seen[e.path], ep.struck[e.uid]) >= OWNER_GRACE
        if ep.head != e.path:
            ep.head, ep.head_since, ep.idle_since = e.path, now, now
            ep.cpu = _cpu_ticks(holders) if ep.passes == 0 else None
            return False
        if ep.passes:
            return now - ep.head_since >= HEIR_WINDOW
        cpu = _cpu_ticks(holders)
        if cpu != ep.cpu:
            ep.idle_since, ep.cpu = now, cpu
        return now - ep.idle_since >= CLAIM_WINDOW or now - ep.head_since >= BUSY_WINDOW

    def every(self, now: float, place: int | None = None) -> float:
        """Seconds to our next check (see the module's docstring), from our
        `place`, counted anew if not given: the line moves up while we wait."""
        if now < self._look_until or self._suspect is not None:
            return LOOK_EVERY  # a window running, a head to judge, or one to see again: see it through
        place = self._place() if place is None else place
        return min(LOOK_EVERY * max(1, place) ** 2, LOOK_MOST)

    def check(self, now: float) -> tuple[str | None, float]:
        """A waiter's check, when `every` says: our place counted anew (a
        probe or a few), and a look right behind the head, while a window
        runs, or -- further back -- when a slot is free at two checks a
        second apart with the same head: a line that stands still. (A free
        slot alone is a hand-over, most of the time in a line of short
        runs: a look at each would read the lock table, which every
        flock(2) on the machine waits for, a hundred times a second in a
        line of a thousand.) (The path of a ticket passed over, else None;
        seconds to the next check.)"""
        place = self._place()
        if place <= 1 or now < self._look_until:
            return self.look(now), self.every(now, place)
        head = self._head_now() if self._free_now() else None
        suspect, self._suspect = self._suspect, head
        passed = self.look(now) if head is not None and head == suspect else None
        return passed, self.every(now, place)

    def _place(self) -> int:
        """Live tickets ahead of ours not passed over, counted from ours up
        to PLACE_MOST, each tried (`_live`; a gone one is dropped from
        `ahead`). Not from the kernel's lock table: a read of /proc/locks
        takes the lock that every flock(2) on the machine then waits for
        (the kernel's file_rwsem, for writing), and a line of 500 arming
        its waits that way took a minute to form."""
        place, gone = 0, set()
        for e in reversed(self.ahead):
            if e.path in self.passed:
                continue
            live = _live(e.path)
            if not live:  # gone, or dead (it never lives again: one a member could not remove, tried once)
                gone.add(e.path)
            elif live:
                place += 1
                if place == PLACE_MOST:
                    break
        if gone:
            self.ahead = [e for e in self.ahead if e.path not in gone]
        return place

    def _head_now(self) -> str | None:
        """The earliest live ticket ahead of ours not passed over, probed
        from the front (a gone or dead one is dropped from `ahead`)."""
        gone = set()
        head = None
        for e in self.ahead:
            if e.path in self.passed:
                continue
            if _live(e.path):
                head = e.path
                break
            gone.add(e.path)
        if gone:
            self.ahead = [e for e in self.ahead if e.path not in gone]
        return head

    def _free_now(self) -> bool:
        """Is a slot of the pool free now? Tried by taking its lock, shared,
        for a moment: no read of the lock table. A head that tried the slot
        just then and failed is woken again by a close for writing (its
        watch: slot.py), which only a free slot gets."""
        import fcntl

        from .slot import poke

        for p in self.slot_paths:
            try:
                fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                return True  # not made yet: free
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            except OSError:
                return False
            finally:
                os.close(fd)
            poke(p)
            return True
        return False

    def wait_for(self, fd: int, path: str) -> bool:
        """Wait in flock(2) for the ticket at `path` (open on `fd`) to go,
        breaking the wait now and then (SIGALRM, `every`) to check: True
        once we hold its lock; False if it was passed over. For a keeper,
        whose wait is in the kernel and which has no loop of its own."""
        import fcntl
        import signal
        import time

        armed = [False]

        def look(signum: int, frame: object) -> None:
            if armed[0]:
                raise _Look

        old = signal.signal(signal.SIGALRM, look)
        try:
            wait = self.every(time.monotonic())
            while True:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, wait)
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    return True
                except _Look:
                    pass
                armed[0] = False
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    return True  # granted just as the alarm came (or already ours)
                except BlockingIOError:
                    pass
                _, wait = self.check(time.monotonic())
                if path in self.passed:
                    return False
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)

    def _known(self) -> set[tuple[int, int, int]]:
        """(device, inode, change time) of the tickets our user's runs
        passed over, from our own file."""
        if self.shared is None:
            return set()
        from ..statefile import read_private

        raw = read_private(self.shared, MAX_SHARED * 64)
        out: set[tuple[int, int, int]] = set()
        for line in (raw or b"").splitlines()[:MAX_SHARED]:
            parts = line.split()
            if len(parts) == 3 and all(p.isdigit() and len(p) <= 20 for p in parts):
                out.add((int(parts[0]), int(parts[1]), int(parts[2])))
        return out

    def _share(self) -> None:
        """Add the tickets we passed over to our user's file (best effort)."""
        if self.shared is None:
            return
        from ..statefile import make_private_dirs, write_private

        ours = [(e.dev, e.ino, e.ctime_ns) for e in self.ahead if e.path in self.passed]
        known = [k for k in self._known() if k not in ours]
        lines = [b"%d %d %d" % k for k in [*known, *ours][-MAX_SHARED:]]
        try:
            make_private_dirs(os.path.dirname(self.shared))
        except OSError:
            return
        write_private(self.shared, b"\n".join(lines) + b"\n")

    def _slot_inodes(self) -> list[int]:
        out = []
        for p in self.slot_paths:
            try:
                out.append(os.stat(p).st_ino)
            except OSError:
                out.append(-1)  # not made yet: free
        return out

    def _slot_free(self, table: dict[tuple[int, int], list[int]]) -> bool:
        for p in self.slot_paths:
            try:
                st = os.stat(p)
            except OSError:
                return True  # not made yet: free
            if (st.st_dev, st.st_ino) not in table:
                return True
        return False


class _Look(Exception):
    """Time for a look at the head of the line (SIGALRM, in wait_for)."""


def _live(path: str) -> bool | None:
    """Is someone's lock on the ticket at `path`? None if it is gone. (A
    dead one is left to whoever waits on it: line.wait_turn buries.)"""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _cpu_ticks(pids: list[int]) -> int:
    """utime + stime of the processes, in clock ticks (-1 for one gone)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read(4096).rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            total -= 1
    return total
