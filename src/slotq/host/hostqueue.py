"""The host queue: tickets in line, slots to lease, and the wait between.

Daemonless and crash-safe; the two kinds of lock file are tickets
(ticket.py takes one, line.py reads the line) and slots (slot.py). A
`Waiter` is one caller's wait, driven by its owner's loop:

    waiter = Waiter(state_dir, config, pool, info)
    while (lease := waiter.attempt()) is None:
        select([waiter, other fds...], timeout=waiter.wait_timeout())
    ...

Order: within a pool only the head of the line -- the earliest live ticket
-- tries the slots; later tickets never overtake earlier live ones. No
thundering herd: each waiter watches only the live ticket just ahead of it;
the head watches the pool's slot files. When the head wins a slot and
withdraws its ticket, its successor's watch fires and it becomes the head. A
dead waiter's ticket is unlocked by the kernel; the watch on it fires too,
and its successor removes it and moves up.

In a one-slot pool the runner hands the whole wait to a standby keeper
(process.py) after its first look: the keeper waits in flock(2) for the
tickets ahead to go (`ticket.wait_turn`), then for the slot, and starts the
command -- every hand-over on that path happens in the kernel, and the
waiter itself watches nothing (`attempt(watch=False)`).
"""

from __future__ import annotations

import os
import time

from ..config import HostConfig
from ..errors import AdmissionRefused, StateDirError
from ..procinfo import MARKER
from .drain import LOOK as DRAIN_LOOK
from .layout import check_layout
from .drain import drained
from .line import Table, ahead_entries, place, pool_dir, probe
from .slot import SlotLease, SlotProbe
from .ticket import Ticket, take_ticket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .claim import Claims
    from .inotify import Watcher
    from .lockwait import LockWaits

# With inotify the poll is only a safety net; without it, it is the wake-up.
POLL_WITH_INOTIFY = 30.0
POLL_WITHOUT_INOTIFY = 0.5
# After a wake-up that did not let us move: look again after these delays.
RECHECKS = (0.002, 0.02, 0.2)


def ensure_state_dir(state_dir: str) -> None:
    """Create the state directory tree, or raise StateDirError naming it
    (or naming a shared one that any member could pull apart)."""
    from ..statefile import make_dirs, make_private_dirs, refuse_unsafe_sharing

    slots, tickets = os.path.join(state_dir, "slots"), os.path.join(state_dir, "tickets")
    try:
        make_private_dirs(state_dir)
        refuse_unsafe_sharing(state_dir, [state_dir])  # before we make anything in it
        make_dirs(slots, state_dir)
        make_dirs(tickets, state_dir)
        refuse_unsafe_sharing(state_dir, [slots, tickets])
        check_layout(state_dir)
    except StateDirError:
        raise
    except OSError as e:
        raise StateDirError(f"cannot create state directory {state_dir}: {e.strerror}", state_dir) from None
    if not os.access(state_dir, os.W_OK | os.X_OK):
        raise StateDirError(f"state directory {state_dir} is not writable", state_dir)


def _nested(state_dir: str, pool: str, count: int) -> str | None:
    """Why a run started from inside another run's command may not queue for
    the slot of `pool` that run holds here: it would wait for it until that
    run ends, and that run waits for it. None if it may (a run without the
    marker in its environment pays one lookup)."""
    run_id = os.environ.get(MARKER)
    if not run_id:
        return None
    from ..records import printable
    from .orphans import nested_in
    from .slot import slot_name

    inside = nested_in(state_dir, pool, count, run_id)
    if inside is None:
        return None
    index, info = inside
    label, rid = printable(info.get("label") or "?", 200), printable(run_id, 100)
    return (f"not admitted: this command runs inside run {rid} ({label}), which holds slot "
            f"{slot_name(pool, index)} on this host; a run nested in it would wait for that slot until run "
            f"{rid} ends. Run the command directly (it has the slot already), or give the nested run another "
            "class")


class Waiter:
    """One caller's place in a pool's line, until it leases a slot."""

    def __init__(self, state_dir: str, config: HostConfig, pool: str, info: dict[str, object],
                 *, defer_leave: bool = False, wait: Callable[[float], None] | None = None,
                 ticket: Ticket | None = None) -> None:
        """Raises StateDirError, or AdmissionRefused when the host's
        [admission] limits leave no place in line, or when the run was
        started inside a run that holds this pool's slot (`_nested`).

        defer_leave: on success keep the ticket until `leave()` -- the
        runner starts its command first; the successor could not have the
        slot before that anyway. `ticket`: one already taken for this wait
        (`ticket.take_early`); none is taken then."""
        self.state_dir = state_dir
        self.defer_leave = defer_leave
        self.pool = pool
        self.slot_count = config.pools[pool]
        # Created at the first failed attempt: an uncontended run never pays
        # for inotify (or for loading libc.py).
        self._watcher: Watcher | None = None
        self._locks: LockWaits | None = None  # when no inotify instance can be had
        self._may_watch = True
        self._head = False
        self._earlier: list[str] | None = None  # tickets ahead of ours, as first listed
        self._claims: Claims | None = None  # is the head of the line claiming? (claim.py)
        self._next_look = 0.0
        self._rechecks: list[float] = []
        self._probe: SlotProbe | None = None
        self._watching: str | None = None  # "slots" once the head watches them
        self.drained = False  # the pool was drained at our last look, at the head (drain.py)
        nested = _nested(state_dir, pool, self.slot_count)
        if nested is not None:
            if ticket is not None:
                ticket.withdraw()
            raise AdmissionRefused(nested)
        if ticket is not None and ticket.pool == pool:
            self.ticket: Ticket = ticket
            return
        if ticket is not None:
            ticket.withdraw()  # taken for another pool (cannot happen: the same config chose both)
        try:
            self.ticket = take_ticket(state_dir, pool, info, config.waiting_limits, wait,
                                      slots=config.pools.get(pool, 0))
        except BaseException:
            self.close()
            raise

    def fileno(self) -> int:
        """Readable when something we watch changed; -1 if only polling."""
        if self._watcher:
            return self._watcher.fileno()
        return self._locks.wake_r if self._locks else -1

    @property
    def is_head(self) -> bool:
        """At the head of the line (known once an attempt found no live
        ticket ahead)."""
        return self._head

    def stand_down(self) -> None:
        """Stop trying for a slot ourselves: a standby keeper waits for it
        instead. Our own slot descriptors and blocked lock threads go (a
        lock one of them was granted just now is released to the keeper)."""
        self._drop_probe()
        if self._watcher:
            self._watcher.unwatch_all()
            self._watching = None
        if self._locks:
            self._locks.watch_only([], exclusive=True)

    def slot_paths(self) -> list[str]:
        from .slot import slot_path

        return [slot_path(self.state_dir, self.pool, i) for i in range(self.slot_count)]

    def wait_timeout(self) -> float:
        """How long to wait for a wake-up before looking again anyway
        (shortly after a wake-up that did not let us move)."""
        if self._rechecks:
            return self._rechecks.pop(0)
        poll = POLL_WITH_INOTIFY if self._watcher or self._locks else POLL_WITHOUT_INOTIFY
        if self.drained:
            return min(poll, DRAIN_LOOK)  # nothing wakes us at the resume: we look
        if not self._head and self._claims is not None:  # behind someone: look at the head now and then
            return min(poll, max(0.0, self._next_look - time.monotonic()))
        return poll

    def attempt(self, watch: bool = True) -> SlotLease | None:
        """Look once: lease a slot if we are the head and one is free.

        Sets the watches that will wake us when we should look again (none
        with `watch=False`: a keeper will wait instead). On success the
        ticket is withdrawn (waking our successor).
        """
        lease = self._attempt()
        if lease is None and watch and self._may_watch:
            self._may_watch = False
            from . import inotify  # a run that gets its slot at once never watches

            if inotify.available():
                try:
                    self._watcher = inotify.Watcher()
                except OSError:
                    # EMFILE: the per-user cap on inotify instances (128 by
                    # default) is reached by hundreds of waiters.
                    from .lockwait import LockWaits

                    self._locks = LockWaits()
                lease = self._attempt()  # again, now watching before looking
        return lease

    def _attempt(self) -> SlotLease | None:
        woke = False
        if self._watcher:
            woke = self._watcher.drain() > 0
            if woke:
                # The kernel queues IN_CLOSE_WRITE *before* it releases the
                # closing file's flock (__fput: fsnotify_close, then
                # locks_remove_file). Woken in between, we find the lock
                # still held and no further event comes: look again shortly.
                self._rechecks = list(RECHECKS)
        if self._locks:
            self._locks.drain()
        if not self._head:
            ahead = self._live_ahead()
            now = time.monotonic()
            if ahead is not None and self._claims is not None and now >= self._next_look:
                passed, wait = self._claims.check(now)
                if passed is not None:
                    ahead = self._live_ahead()  # a head that does not claim, passed over
                self._next_look = now + wait
            if ahead is not None:
                self._drop_probe()
                if self._locks:
                    self._locks.watch_only([ahead], exclusive=False)
                return None
            # Once the head, always the head: no ticket can appear ahead later.
            self._head = True
        self.drained = drained(self.state_dir, self.pool)
        if self.drained:  # (no lock tried: a release would wake us, again and again)
            self._drop_probe()
            return None
        if self._probe is None:
            self._probe = SlotProbe(self.state_dir, self.pool, self.slot_count)
        if self._locks:
            return self._attempt_by_lock(self._probe)
        if self._watcher and self._watching != "slots":
            self._watcher.unwatch_all()
            for p in self._probe.paths:
                self._watcher.watch(p)
            self._watching = "slots"
        lease = self._probe.try_lease()
        if lease is None:
            return None
        self._probe = None
        return self._won(lease)

    def _won(self, lease: SlotLease) -> SlotLease | None:
        """A slot's lock is ours: leave the line with it -- unless the pool
        is drained (looked at again now, with the lock held: drain.py),
        when we let it go again and wait on, in our place."""
        self.drained = drained(self.state_dir, self.pool)
        if self.drained:
            lease.release()
            return None
        self._drop_probe()
        if not self.defer_leave:
            self.leave()
        return lease

    def leave(self) -> None:
        """Leave the line with a slot. The inotify instance is not closed
        here: its destruction can take the kernel 5-15 ms (an RCU grace
        period), right on the hand-over path. Its watches go (cheap); the
        owner calls close() once the command runs or the result is out."""
        self._drop_probe()
        if self._watcher:
            self._watcher.unwatch_all()
        if self._locks:
            self._locks.close()
            self._locks = None
        self.ticket.withdraw()

    def _attempt_by_lock(self, slot_probe: SlotProbe) -> SlotLease | None:
        assert self._locks is not None
        granted = self._locks.granted()
        lease = None
        if granted is not None and granted.exclusive:
            from .slot import still_at_path

            index = slot_probe.paths.index(granted.path)
            fd = granted.take()
            self._locks.watches.pop(granted.path, None)
            if still_at_path(fd, granted.path):
                lease = SlotLease(granted.path, fd, self.pool, index)
                slot_probe.close()
            else:  # the file we waited on was replaced: wait on the new one
                os.close(fd)
                lease = slot_probe.try_lease()
        else:
            lease = slot_probe.try_lease()
        if lease is None:
            self._locks.watch_only(slot_probe.paths, exclusive=True)
            return None
        self._probe = None
        return self._won(lease)

    def _live_ahead(self) -> str | None:
        """Path of the closest live ticket ahead of ours (now watched), or
        None at the head. Dead tickets met on the way are removed."""
        if self._earlier is None:
            # No ticket is ever created ahead of ours: one listing serves
            # every later look (in a line of hundreds, a wake-up then costs
            # a probe or two, not a directory listing).
            pdir = pool_dir(self.state_dir, self.pool)
            entries = ahead_entries(pdir, self.ticket.path)
            self._earlier = [e.path for e in entries]
            if entries:  # (the head at once never loads claim.py)
                from .claim import Claims, shared_path

                self._claims = Claims(entries, self.slot_paths(), shared_path(pdir), (self.state_dir, self.pool))
                now = time.monotonic()
                self._next_look = now + self._claims.every(now)
        passed = self._claims.passed if self._claims is not None else set()
        found = None
        gone: set[str] = set()
        for path in reversed(self._earlier):
            if path in passed:
                continue
            # Watch before probing: a release between the two is not lost.
            if self._watcher and not self._watcher.watch(path):
                gone.add(path)
                continue
            if probe(path):
                found = path
                break
            gone.add(path)
        if gone:
            self._earlier = [path for path in self._earlier if path not in gone]
        if self._watcher:
            for path in self._watcher.watching() - {found}:
                self._watcher.unwatch(path)
        return found

    def position(self, table: Table | None = None) -> tuple[int, int]:
        """(live tickets ahead of ours, total live tickets in the pool)."""
        ahead, total, _ = self.line(table)
        return ahead, total

    def line(self, table: Table | None = None) -> tuple[int, int, list[int]]:
        """(live tickets ahead of ours, total live tickets in the pool, their
        numbers in line order). `table`: the kernel's lock table
        (proclocks.owners()), read here if not given."""
        return place(pool_dir(self.state_dir, self.pool), self.ticket.path, table)

    def _drop_probe(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def close(self) -> None:
        self._drop_probe()
        if self._watcher:
            self._watcher.close()
            self._watcher = None
        if self._locks:
            self._locks.close()
            self._locks = None

    def withdraw(self) -> None:
        """Leave the line without a slot (caller gone, cancelled)."""
        self.close()
        self.ticket.withdraw()
