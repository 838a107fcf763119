"""Tickets: a caller's place in a pool's line -- taking one (its number,
its name, the host's admission limits) and leaving the line. The line as
the ticket files show it -- its order, live and dead tickets, a turn
waited for -- is line.py's.

A ticket's number is the microsecond it was taken (or the next free one
above every live ticket in line), taken under the counter's lock, which is
held until the ticket is visible under its final name, so tickets appear in
number order and a later caller can never be listed ahead of an earlier
one. The counter file (`seq`) is the lock, and says the last number for an
older slotq sharing the state dir; what anyone writes into it moves no
number.

Order cannot be changed from outside:
- A new number is above every live ticket already in the pool's line.
- A ticket is given its name with link(2), which never replaces a name that
  exists (a planted one): the next number is tried instead.
- A ticket renamed to a lower number is placed at the back of the line
  (line.py, by the kernel's change time).
Every file is opened through statefile.open_state (no links, no FIFOs).
"""

from __future__ import annotations

import fcntl
import os
import time

from ..errors import AdmissionRefused, StateDirError
from ..records import to_json
from ..statefile import make_dirs, open_state, refuse_unsafe_sharing, share_created
from .layout import check_layout
from .line import (FORGED_SLACK_NS, FUTURE_SLACK_US, TICKET_SUFFIX, list_tickets, live_tickets, pool_dir, probe,
                   ticket_names)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..config import HostConfig
    from ..spec import RunSpec

# The counter lock is held for microseconds by honest runs; held longer than
# this, with no ticket taken meanwhile, someone holds it by hand (`flock seq
# sleep inf`): the run joins the line without it (status names the holder).
SEQ_LOCK_LIMIT = 2.0
SEQ_LOCK_LOOKS = 10  # at the least, however long the limit took (~50 looks in 2 s)
# ... and however the counter moves meanwhile (anyone can write it, to look
# like a line that moves), never longer than this in all.
SEQ_LOCK_MOST = 10.0
MAX_SEQ = 10**18


class Ticket:
    """A live ticket, held by this process (or, once `hand_over()` was
    called, by the standby keeper it was passed to). `withdraw()` ends it."""

    __slots__ = ("path", "fd", "seq", "pool", "info", "handed")

    def __init__(self, path: str, fd: int, seq: int, pool: str, info: dict[str, object]) -> None:
        self.path = path
        self.fd = fd
        self.seq = seq
        self.pool = pool
        self.info = info
        self.handed = False

    def hand_over(self) -> None:
        """Our copy of the descriptor goes; a child that inherited it (the
        standby keeper) now holds the ticket alone. It withdraws the ticket
        the moment it starts the command -- the successor moves up without
        waiting for us -- or loses it by exiting."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self.handed = True

    def withdraw(self) -> None:
        """Leave the line. Unlink first, then close: the successor's watch
        fires (IN_ATTRIB, then IN_CLOSE_WRITE) and it finds the name gone."""
        if self.fd < 0 and not self.handed:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1
        self.handed = False


def run_info(spec: RunSpec, config: HostConfig, since: float) -> dict[str, object]:
    """What a waiting run's ticket says of it (status, the reports and the
    line view read it)."""
    info = {"run_id": spec.run_id, "label": spec.label, "pid": os.getpid(), "cls": spec.cls, "since": since,
            "budget": spec.budget if spec.budget is not None else config.budget, "host": os.uname().nodename}
    if spec.kept is not None:
        info["kept"] = spec.kept  # a kept run (host/kept.py): its lease
    if spec.bind is not None:
        info["bind"] = spec.bind  # a late-bound run's reservation: the other hosts it waits on
    return info


def take_ticket(state_dir: str, pool: str, info: dict[str, object],
                limits: tuple[int | None, int | None] = (None, None),
                wait: Callable[[float], None] | None = None, slots: int = 0) -> Ticket:
    """Join the end of `pool`'s line. Raises StateDirError if the state
    directory cannot be written, AdmissionRefused if `limits` (waiting runs
    in the pool, and of this user) are reached -- counted under the
    sequence lock, so two callers cannot both take the last place. A run
    that will not wait (nobody in line, one of the pool's `slots` free) is
    always admitted: `max_waiting = 0` means "no waiting", not "no runs".
    `wait(seconds)`: how to pass the time while someone else holds the
    sequence lock (the runner watches its caller meanwhile, and may raise)."""
    pdir = pool_dir(state_dir, pool)
    seq_path = os.path.join(state_dir, "seq")
    try:
        make_dirs(pdir, state_dir)
        check_layout(state_dir)
        refuse_unsafe_sharing(state_dir, [pdir])  # the dirs above: ensure_state_dir's, or take_early's
        seq_fd, created = open_state(seq_path, os.O_RDWR, create=True)
    except StateDirError:
        raise
    except OSError as e:
        raise StateDirError(
            f"state directory {state_dir} is not usable: {e.strerror} ({e.filename or state_dir})", state_dir
        ) from None
    if created:
        share_created(seq_fd, state_dir)  # every user takes numbers
    try:
        locked = _lock_seq(seq_fd, seq_path, wait)  # (or not: held by hand; link(2) below keeps names apart)
        if limits != (None, None):
            _admit(state_dir, pool, *limits, slots)
        fd, seq, full = _numbered(pdir, pool, info)
        # Fixed width, written in place: an older slotq sharing the state dir
        # numbers its tickets from it (and it shows the line moving: _lock_seq).
        os.pwrite(seq_fd, b"%020d\n" % seq, 0)
    except OSError as e:
        raise StateDirError(
            f"state directory {state_dir} is not usable: {e.strerror} ({e.filename or state_dir})", state_dir
        ) from None
    finally:
        os.close(seq_fd)
    ticket = Ticket(os.path.join(pdir, f"{seq:016d}{TICKET_SUFFIX}"), fd, seq, pool, full)
    if limits != (None, None) and not locked:
        # Counted without the counter's lock (someone held it by hand), so
        # others may have counted at the same time: counted again, now that
        # our ticket is in line, against the tickets ahead of it only.
        try:
            _admit(state_dir, pool, *limits, slots, mine=ticket.path)
        except BaseException:
            ticket.withdraw()
            raise
    return ticket


# A ticket named this long after its number was taken (its process was not
# run meanwhile: a thousand callers started at once on two cores) takes a
# new number: callers that went on without the counter's lock may have
# numbered after it and named before, and a ticket named FORGED_SLACK_NS
# after a higher-numbered one is taken for renamed (line.py) -- placed last,
# and back in its place once those leave, ahead of waiters that had listed
# the line meanwhile and behind-and-ahead of them at once (a line of 1000
# stood still, 12-08). Half the slack: a fresh number always keeps it.
STALE_NAMING_NS = FORGED_SLACK_NS // 2
RENUMBER_MOST = 5


def _numbered(pdir: str, pool: str, info: dict[str, object]) -> tuple[int, int, dict[str, object]]:
    """Our ticket in `pdir`: (its locked descriptor, its number, its
    record). The number is the microsecond the ticket is taken: nothing
    anyone can write (the counter, a planted name) moves it or runs it out.
    Never below a live ticket in line, so that a later caller never stands
    ahead of an earlier one (a clock stepped back); a name numbered far
    beyond its making is placed last and ignored here."""
    for attempt in range(RENUMBER_MOST):
        now_us = time.time_ns() // 1000
        seq = max(now_us, _highest_live(pdir, now_us) + 1)
        fd = -1
        for _ in range(100):
            if seq >= MAX_SEQ:
                raise StateDirError(f"cannot number a ticket in {pdir}: the clock says {now_us} us", pdir)
            full = dict(info, seq=seq, pool=pool)
            fd = _name_ticket(pdir, seq, full)
            if fd >= 0:
                break
            taken = {n for n, _ in ticket_names(pdir)}
            seq += 1
            while seq in taken:  # a run of planted names is passed in one listing, not one try each
                seq += 1
        if fd < 0:
            raise StateDirError(f"cannot name a ticket in {pdir}: every name tried was taken", pdir)
        if os.fstat(fd).st_ctime_ns - seq * 1000 <= STALE_NAMING_NS or attempt == RENUMBER_MOST - 1:
            return fd, seq, full  # (named late every time: kept; line.py may place it last)
        os.unlink(os.path.join(pdir, f"{seq:016d}{TICKET_SUFFIX}"))  # (stale: see STALE_NAMING_NS)
        os.close(fd)
    raise AssertionError("unreachable")


def _name_ticket(pdir: str, seq: int, info: dict[str, object]) -> int:
    """Our ticket, saying `info`, as number `seq` of the line in `pdir`:
    its descriptor, locked; -1 if that name could not be ours."""
    final = os.path.join(pdir, f"{seq:016d}{TICKET_SUFFIX}")
    tmp = os.path.join(pdir, f".{seq:016d}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    # Made readable by its owner only, and locked before anyone else may
    # open it: a member who took a lock on it first (they watch the
    # directory) made our flock fail, and the run with it.
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    named = False
    try:
        # Locked before it gets its visible name, so nobody can see an
        # unlocked live ticket and remove it.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # In a shared line, readable by everyone in it, whatever our umask
        # (077 would hide the run's label and pid from their status).
        # Writable by its owner only: nobody else can touch it (and its ctime).
        share_created(fd, pdir, writable=False)
        os.write(fd, to_json(info).encode())
        try:
            os.link(tmp, final)  # never replaces a name that is there
            named = True
        except FileExistsError:
            pass  # planted, or taken just now (no counter lock): the next free number
        except FileNotFoundError:
            pass  # our temp, removed before we locked it (remove_stale_temps of an older slotq): anew
    except BlockingIOError:
        pass  # locked by someone else all the same (root): the next name
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if not named:
            os.close(fd)
    return fd if named else -1


class _Busy(Exception):
    """The ticket counter was locked for longer than an early ticket waits."""


def take_early(state_dir: str, pool: str, info: dict[str, object],
               limits: tuple[int | None, int | None] = (None, None), patience: float = 0.2,
               slots: int = 0) -> Ticket | None:
    """`take_ticket` for a caller that has not started its runner yet
    (transports/local.py: LocalTransport.reserve): a ticket, or None when
    anything is out of the ordinary -- no state directory yet or one it
    cannot use, admission limits reached, the counter locked past
    `patience` seconds.
    The runner then takes its ticket itself, and says what is wrong as it
    always does."""
    waited = [0.0]

    def wait(seconds: float) -> None:
        waited[0] += seconds
        if waited[0] > patience:
            raise _Busy
        time.sleep(seconds)

    try:
        # What the runner's ensure_state_dir checks, before anything is made.
        refuse_unsafe_sharing(state_dir, [state_dir, *(os.path.join(state_dir, d) for d in ("slots", "tickets"))])
        return take_ticket(state_dir, pool, info, limits, wait, slots)
    except (_Busy, StateDirError, AdmissionRefused, OSError):
        return None


def _lock_seq(fd: int, path: str, wait: Callable[[float], None] | None) -> bool:
    """Take the sequence lock: True once held. Honest holders keep it for
    microseconds; if it stays taken, pass the time with `wait` (the caller
    can still cancel) and go on without it (False) once nobody has taken a
    ticket for SEQ_LOCK_LIMIT -- the counter did not move -- in at least
    SEQ_LOCK_LOOKS looks: a lock held by hand must not close the pool (any
    member can open the counter, and so lock it). Without the lock two
    callers may pick one number: link(2) gives it to one, the other takes
    the next; admission may then let one run too many wait. A crowd taking
    tickets (a thousand callers started at once on two cores) is progress,
    not a stuck holder, however long our own turn takes; nor is a machine
    that stood still (a paused VM: its clock jumps by the pause, our looks
    do not)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    start = began = time.monotonic()
    counter = os.pread(fd, 32, 0)
    delay = 0.0005
    looks = 0
    while True:
        if wait is not None:
            wait(delay)
        else:
            time.sleep(delay)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        looks += 1
        if time.monotonic() - start >= SEQ_LOCK_LIMIT and (now := os.pread(fd, 32, 0)) != counter:
            counter, start, looks = now, time.monotonic(), 0  # tickets were taken meanwhile: the line moves
        if time.monotonic() - start >= SEQ_LOCK_LIMIT and looks >= SEQ_LOCK_LOOKS:
            return False
        if time.monotonic() - began >= SEQ_LOCK_MOST and looks >= SEQ_LOCK_LOOKS:
            return False
        delay = min(delay * 2, 0.05)


# Names above the present microsecond looked at, at most.
MAX_JUMP_LOOKS = 64


def _highest_live(pdir: str, now_us: int) -> int:
    """The highest number of a live ticket in a pool's line above `now_us`
    (0 for none): honest tickets are numbered at or below the microsecond
    they were taken, or a little above in a burst. A name alone does not
    count: a file planted under a ticket name that nobody holds (`touch
    999999999999999999.t`) would otherwise move every later number, or
    exhaust them, for good -- and in a sticky dir only its owner can remove
    it. Names above `now_us` are each looked at (probe), at most
    MAX_JUMP_LOOKS of them; names beyond FUTURE_SLACK_US are placed last
    in line (line.py) and move nothing."""
    names = [(seq, name) for seq, name in ticket_names(pdir) if now_us < seq <= now_us + FUTURE_SLACK_US]
    for looks, (seq, name) in enumerate(sorted(names, reverse=True)):
        if looks >= MAX_JUMP_LOOKS:
            break
        if probe(os.path.join(pdir, name)):
            return seq
    return 0


def _admit(state_dir: str, pool: str, max_waiting: int | None, per_user: int | None, slots: int,
           mine: str | None = None) -> None:
    """The host's [admission] limits (admission.py), for the line as the
    kernel shows it. A run that will not wait -- nobody in line, a slot
    free -- is always admitted: `max_waiting = 0` means "no waiting".
    `mine`: our ticket, in line already: only the tickets ahead of it count."""
    from .admission import judge
    from .proclocks import owners
    from .slot import slot_path

    pdir = pool_dir(state_dir, pool)
    table = owners()
    live = live_tickets(pdir, table, mine)
    if live is None:
        live = [(seq, path) for seq, path in list_tickets(pdir) if path == mine or probe(path)]
    if mine is not None:
        paths = [path for _, path in live]
        live = live[:paths.index(mine)] if mine in paths else live
    if not live and table is not None:
        for i in range(slots):
            try:
                st = os.stat(slot_path(state_dir, pool, i))
            except OSError:
                return  # not made yet: free
            if (st.st_dev, st.st_ino) not in table:
                return  # free, and nobody in line: this run will not wait
    judge(pool, [path for _, path in live], max_waiting, per_user)


