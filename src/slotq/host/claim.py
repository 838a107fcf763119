"""Passing over a head of the line that does not take a free slot.

FIFO holds among live callers that *claim*: a real slotq at the head of
its line takes a free slot within milliseconds (its keeper is granted the
slot's lock by the kernel, its runner is woken by inotify). A process that
holds a ticket's lock and does nothing -- a ticket made by hand, a slotq
stopped with SIGSTOP -- would otherwise keep everyone behind it waiting with
the slot free, for ever.

So every waiter behind looks now and then at the kernel's lock table:
which ticket ahead of its own is the earliest live one (the head), and
whether a slot of the pool is free. A head seen leaving a slot free at
every look for `CLAIM_WINDOW` seconds, its lock holders using no CPU, is
passed over: this waiter no longer waits for it (nor do the others, who
looked too). Its ticket is not touched: its place is kept, and if it
claims a slot later it gets one like any head. A head whose holders use
CPU (a slotq still loading on a crowded machine) is given `BUSY_WINDOW`.

How often (`every`, `check`): a waiter checks each second (`LOOK_EVERY`)
while at most one live ticket is ahead of it, and for BUSY_WINDOW after a
look found a slot free behind a head (a window to see through, even if
the slot is taken now and then); with k live tickets ahead, every k*k
seconds, at most every `LOOK_MOST`. A check counts the place anew (a
probe of the closest tickets ahead: the line moves up while we wait; a
name planted in the line is nobody's place) and looks -- reads the
kernel's lock table -- only right behind the head or with a window
running. The lock table is dear: a read of /proc/locks takes the
kernel's file_rwsem for writing, which every flock(2) on the machine
then waits for. With every waiter looking each second, 50 idle waiters
used 0.23 s of CPU in 20 s and a line of a thousand had 10.4 ms between
hand-overs (6.5x flock's); checked this way, 0.014 s and 3.4 ms (1.56x).
A waiter waits for the ticket right ahead of it and is not woken as the
line moves up: one that comes to stand behind a head that stopped
claiming (a slotq stopped there) finds it within its last period,
LOOK_MOST at most, plus the window. A chain of planted
tickets is passed over one by one, each judged from a look a second.

One user's waiting runs share what they found: a run that passes a head
over adds it to its user's own file (`.passed.<pool>.<uid>` in the state
dir: device, inode and change time of each ticket, trusted only as this
user's regular file that nobody else can write), and a run of that user
that joins the line later passes those tickets over from its first look,
rather than each run waiting out the window anew behind the same ticket.

Nothing here is read from a file another user could write: the lock table,
the slot files' inodes, /proc/PID/stat of the lock holders, our own file.
"""

from __future__ import annotations

import os

CLAIM_WINDOW = 5.0  # seconds an idle head may leave a slot free
BUSY_WINDOW = 30.0  # ... and one whose lock holders are busy (loading)
LOOK_EVERY = 1.0  # how often the waiter right behind the head looks
LOOK_MOST = 30.0  # ... and the longest a waiter far back goes without a look
PLACE_MOST = 6  # live tickets ahead counted: LOOK_EVERY * 6 * 6 > LOOK_MOST
MAX_SHARED = 64  # tickets remembered in a user's .passed file


def shared_path(pdir: str) -> str:
    """This user's file of passed-over tickets for the pool whose tickets
    are in `pdir` (<state dir>/tickets/<pool>)."""
    return os.path.join(os.path.dirname(os.path.dirname(pdir)), f".passed.{os.path.basename(pdir)}.{os.getuid()}")


class Claims:
    """One waiter's view of whether the head of its line claims.

    `ahead`: (path, device, inode, change time) of the tickets ahead of
    ours, in line order (no ticket is ever created ahead of ours).
    `slot_paths`: the pool's slot files. `shared`: this user's file of
    tickets passed over (shared_path), or None."""

    def __init__(self, ahead: list[tuple[str, int, int, int]], slot_paths: list[str],
                 shared: str | None = None) -> None:
        self.ahead = ahead
        self.slot_paths = slot_paths
        self.shared = shared
        self.passed: set[str] = set()
        known = self._known()
        for path, *ident in ahead:
            if tuple(ident) in known:
                self.passed.add(path)
        self._head: str | None = None
        self._look_until = 0.0  # look each second until then (a slot seen free behind a head)
        self._since = 0.0  # the head first seen leaving a slot free
        self._idle_since = 0.0  # ... and its holders last seen using CPU
        self._cpu: int | None = None

    def look(self, now: float, table: dict[tuple[int, int], list[int]] | None = None) -> str | None:
        """One look (`table`: proclocks.owners(), read if not given). The
        path of a ticket passed over at this look, else None."""
        if table is None:
            from .proclocks import owners, raw

            data = raw()
            if data is None:
                return None  # the kernel does not say: nobody is passed over
            if not any(f":{ino} ".encode() not in data for ino in self._slot_inodes()):
                self._head = None  # every slot held (the usual look: a search, no parse)
                return None
            table = owners(data)
            if table is None:
                return None
        head = next(((path, (dev, ino)) for path, dev, ino, _ in self.ahead
                     if path not in self.passed and (dev, ino) in table), None)
        if head is None or not self._slot_free(table):
            self._head = None
            return None
        self._look_until = now + BUSY_WINDOW
        path, key = head
        cpu = _cpu_ticks(table[key])
        if path != self._head:
            self._head, self._since, self._idle_since, self._cpu = path, now, now, cpu
            return None
        if cpu != self._cpu:
            self._idle_since, self._cpu = now, cpu
        if now - self._idle_since < CLAIM_WINDOW and now - self._since < BUSY_WINDOW:
            return None
        self.passed.add(path)
        self._head = None
        self._share()
        return path

    def every(self, now: float, place: int | None = None) -> float:
        """Seconds to our next check (see the module's docstring), from our
        `place`, counted anew if not given: the line moves up while we wait."""
        if now < self._look_until:
            return LOOK_EVERY  # a window running, or the next head to judge: see it through
        place = self._place() if place is None else place
        return min(LOOK_EVERY * max(1, place) ** 2, LOOK_MOST)

    def check(self, now: float) -> tuple[str | None, float]:
        """A waiter's check, when `every` says: our place counted anew (a
        probe or a few), and a look only right behind the head or while
        a head's window runs. (The path of a ticket passed over, else
        None; seconds to the next check.)"""
        place = self._place()
        passed = self.look(now) if place <= 1 or now < self._look_until else None
        return passed, self.every(now, place)

    def _place(self) -> int:
        """Live tickets ahead of ours not passed over, counted from ours up
        to PLACE_MOST, each tried (`_live`; a gone one is dropped from
        `ahead`). Not from the kernel's lock table: a read of /proc/locks
        takes the lock that every flock(2) on the machine then waits for
        (the kernel's file_rwsem, for writing), and a line of 500 arming
        its waits that way took a minute to form."""
        place, gone = 0, set()
        for path, *_ in reversed(self.ahead):
            if path in self.passed:
                continue
            live = _live(path)
            if live is None:
                gone.add(path)
            elif live:
                place += 1
                if place == PLACE_MOST:
                    break
        if gone:
            self.ahead = [e for e in self.ahead if e[0] not in gone]
        return place

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
        from ..statefile import write_private

        ours = [tuple(ident) for path, *ident in self.ahead if path in self.passed]
        known = [k for k in self._known() if k not in ours]
        lines = [b"%d %d %d" % k for k in [*known, *ours][-MAX_SHARED:]]
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
    dead one is left to whoever waits on it: ticket.wait_turn buries.)"""
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
