"""A pool's line, as its ticket files show it (a ticket's own life --
its number, its name, the admission -- is ticket.py's).

A ticket is a file `tickets/<pool>/<seq>.t` that its waiter holds open and
`flock`ed for its whole life. It is live exactly while that lock is held: a
waiter that dies, even by SIGKILL, loses the lock in the kernel, and whoever
next looks finds it unlocked and removes it (`probe`, `bury`: the run's
history line with it). No pid checks, so no pid-reuse bugs.

Here: the line listed in its order (`scan`: regular files of one name,
forged ones last, below), a ticket told live from dead, a turn waited for
in the kernel (`wait_turn`), and the temps of creators that died before
naming their ticket removed.

A ticket renamed to a lower number is found out by the kernel's change
time (ctime), which a rename sets and nobody but root can set back: a
ticket created more than `FORGED_SLACK_NS` after a ticket with a higher
number is placed at the back of the line (status shows it); so is one
whose number lies more than `FUTURE_SLACK_US` beyond its change time
(numbers are microseconds: ticket.py). Ticket files
are writable by their owner only, so nobody can touch another's ticket to
change its ctime. Every file is opened through statefile.open_state (no
links, no FIFOs).
"""

from __future__ import annotations

import fcntl
import os
import time

from ..records import clean_state, from_json, load_scanner
from ..statefile import StateFileError, open_state, read_limited

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from .claim import Claims

TICKET_SUFFIX = ".t"
MAX_INFO = 65536
# A renamed ticket is found out if it jumped tickets created more than this
# before the rename (the kernel's ctime is coarse; a wall-clock step back
# smaller than this never reorders honest tickets).
FORGED_SLACK_NS = 1_000_000_000
# A ticket's number is the microsecond it was taken (ticket.py), or a little
# more in a burst or after the clock stepped back; one numbered further than
# this beyond its making was numbered by hand: placed at the back, and it
# moves no number.
FUTURE_SLACK_US = 3600 * 1_000_000
STALE_TEMP_S = 60.0  # a ticket's temp older than this and unlocked: its creator died before naming it


def pool_dir(state_dir: str, pool: str) -> str:
    return os.path.join(state_dir, "tickets", pool)


def ignored(pdir: str, locked: set[tuple[int, int]]) -> dict[int, list[Entry | None]]:
    """owner -> the ticket names of theirs in a pool dir that are no place
    in line and that we cannot remove: held by nobody, another user's (in a
    sticky dir only they or root can remove them); `None` for each name
    past MAX_PER_OWNER, not looked at. Named by status, a line an owner."""
    uid = os.getuid()
    over: dict[int, int] = {}
    out: dict[int, list[Entry | None]] = {}
    for e in scan(pdir, over):
        if (e.dev, e.ino) not in locked and e.uid != uid:
            out.setdefault(e.uid, []).append(e)
    for owner, n in over.items():
        out.setdefault(owner, []).extend([None] * n)
    return out


def ticket_names(pdir: str) -> list[tuple[int, str]]:
    """(seq, name) of the ticket names in a pool dir, any order."""
    try:
        names = os.listdir(pdir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        if name.endswith(TICKET_SUFFIX) and not name.startswith("."):
            stem = name[: -len(TICKET_SUFFIX)]
            if stem.isdigit() and len(stem) <= 18:
                out.append((int(stem), name))
    return out


class Entry:
    """A ticket file as listed: number, path, file identity, change time."""

    __slots__ = ("seq", "path", "dev", "ino", "ctime_ns", "uid", "forged")

    def __init__(self, seq: int, path: str, dev: int, ino: int, ctime_ns: int, uid: int) -> None:
        self.seq = seq
        self.path = path
        self.dev = dev
        self.ino = ino
        self.ctime_ns = ctime_ns
        self.uid = uid
        self.forged = False


# Ticket names of one owner in a line looked at, at most (their lowest
# numbers): a member's flood of names (dead ones stay: in a sticky dir only
# their owner can remove them) costs that member, and costs the others a
# listing, not a probe each. More than any honest user waits with at once.
MAX_PER_OWNER = 4096


def scan(pdir: str, over: dict[int, int] | None = None) -> list[Entry]:
    """The tickets of a pool dir in line order (see the module doc):
    regular files with one name only (a link, a FIFO or another file's
    hard link under a ticket name is no ticket); at most MAX_PER_OWNER of
    each owner's, the rest counted in `over` (owner -> how many)."""
    out: list[Entry] = []
    try:
        with os.scandir(pdir) as it:
            for e in it:
                name = e.name
                if not name.endswith(TICKET_SUFFIX) or name.startswith("."):
                    continue
                stem = name[: -len(TICKET_SUFFIX)]
                if not (stem.isdigit() and len(stem) <= 18):
                    continue
                try:
                    if not e.is_file(follow_symlinks=False):
                        continue
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                if st.st_nlink != 1:
                    # A hard link to some other file (a slot file, locked by
                    # its holder, made a phantom waiter nobody could pass);
                    # our own have one name once taken (take_ticket links
                    # and unlinks under the counter's lock).
                    continue
                out.append(Entry(int(stem), e.path, st.st_dev, st.st_ino, st.st_ctime_ns, st.st_uid))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return _in_line_order(_capped(out, over))


def _capped(entries: list[Entry], over: dict[int, int] | None) -> list[Entry]:
    counts: dict[int, int] = {}
    for e in entries:
        counts[e.uid] = counts.get(e.uid, 0) + 1
    if all(n <= MAX_PER_OWNER for n in counts.values()):
        return entries
    entries.sort(key=lambda e: e.seq)
    kept, seen = [], dict.fromkeys(counts, 0)
    for e in entries:
        seen[e.uid] += 1
        if seen[e.uid] <= MAX_PER_OWNER:
            kept.append(e)
        elif over is not None:
            over[e.uid] = over.get(e.uid, 0) + 1
    return kept


def _in_line_order(entries: list[Entry]) -> list[Entry]:
    entries.sort(key=lambda e: e.seq)
    earliest_after = None
    for e in reversed(entries):
        if e.seq > e.ctime_ns // 1000 + FUTURE_SLACK_US:
            e.forged = True  # numbered far beyond its making: by hand (a name anyone may choose)
        elif earliest_after is not None and e.ctime_ns > earliest_after + FORGED_SLACK_NS:
            e.forged = True  # created after tickets with higher numbers: renamed
        elif earliest_after is None or e.ctime_ns < earliest_after:
            earliest_after = e.ctime_ns
    honest = [e for e in entries if not e.forged]
    forged = sorted((e for e in entries if e.forged), key=lambda e: (e.ctime_ns, e.seq))
    return honest + forged


def list_tickets(pdir: str) -> list[tuple[int, str]]:
    """(seq, path) of every ticket file in a pool dir, in line order
    (earliest first; forged ones last), live or not."""
    return [(e.seq, e.path) for e in scan(pdir)]


def ahead_of(pdir: str, path: str) -> list[str]:
    """Paths of the tickets ahead of the one at `path` in its line."""
    return [e.path for e in ahead_entries(pdir, path)]


def ahead_entries(pdir: str, path: str) -> list[Entry]:
    """The tickets ahead of the one at `path`, in line order."""
    out: list[Entry] = []
    for e in scan(pdir):
        if e.path == path:
            return out
        out.append(e)
    return out


def probe(path: str) -> bool | None:
    """Is the ticket at `path` live? True: yes. False: it was dead and has
    now been removed. None: it is already gone.

    Opens read-only, so closing our descriptor does not raise IN_CLOSE_WRITE
    and wake the ticket's watcher for nothing.
    """
    try:
        fd, _ = open_state(path, os.O_RDONLY)
    except (OSError, StateFileError):
        return None  # gone, or no ticket (a link, a FIFO): nobody's place
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        bury(path, fd)
        return False
    finally:
        os.close(fd)


def bury_dead(state_dir: str, pools: Iterable[str]) -> None:
    """Remove the dead tickets of `pools`, writing their runs' history
    lines (bury): callers that died in line with nobody behind them to
    notice, the last in a line."""
    for pool in pools:
        for e in scan(pool_dir(state_dir, pool)):
            probe(e.path)


def wait_turn(path: str, seq: int, slot_paths: list[str] | None = None) -> None:
    """Block until no live ticket is ahead of ours (`seq`, at `path`) in its
    line: wait in flock(2) for each ticket ahead, closest first, to go -- it
    leaves or its holder dies; a dead one is granted at once -- and remove
    it. No ticket is ever created ahead of ours, so one listing serves.
    With the pool's `slot_paths`, a head that leaves a slot free is passed
    over (claim.py): the wait on a ticket is broken now and then to check.

    After each wait, most tickets of that listing have gone (the one we
    waited for was usually the last of them): one listing of the names
    drops those, rather than an open that fails for each -- hundreds, far
    back in a long line, on every hand-over."""
    pdir = os.path.dirname(path)
    entries = ahead_entries(pdir, path)
    ahead = [e.path for e in entries]
    names = {os.path.basename(p) for p in ahead}  # now, while waiting costs nothing
    claims = None
    if slot_paths:
        from .claim import Claims, drain_of, shared_path

        claims = Claims(entries, slot_paths, shared_path(pdir), drain_of(pdir))
    while ahead:
        closest = ahead.pop()
        if claims is not None and closest in claims.passed:
            continue
        try:
            fd, _ = open_state(closest, os.O_RDONLY)
        except (OSError, StateFileError):
            continue  # gone, or no ticket (a link or FIFO put there since the listing: nobody's place)
        try:
            if _dead_now(fd):
                bury(closest, fd)  # one that died before we came: no wait, and no listing after it
                continue
            if claims is None:
                fcntl.flock(fd, fcntl.LOCK_SH)  # the wait, in the kernel
                bury(closest, fd)  # dead now (its owner never locks it again)
            elif claims.wait_for(fd, closest):  # the same, looking at the head now and then
                bury(closest, fd)
        finally:
            os.close(fd)
        if ahead:
            try:
                listed = os.listdir(pdir)
            except OSError:
                continue
            if names.isdisjoint(listed):  # the usual case, at C speed: all gone
                return
            present = set(listed)
            ahead = [p for p in ahead if os.path.basename(p) in present]


def _dead_now(fd: int) -> bool:
    """Is the ticket open on `fd` unlocked now (its lock, shared, is ours)?"""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _removable(path: str, owner: int) -> bool:
    """May we remove the ticket file at `path` (owned by `owner`)? Not
    another user's in a sticky directory (a shared line), unless we are
    root: then nobody's history line is to be written by us either."""
    if owner == os.getuid() or os.getuid() == 0:
        return True
    try:
        return not os.stat(os.path.dirname(path)).st_mode & 0o1000
    except OSError:
        return False


def bury(path: str, fd: int) -> None:
    """Remove a dead ticket (we hold its lock, on `fd`). A ticket that is
    still there when its lock is free was not withdrawn: its caller vanished
    while waiting. Whoever removes it (only one unlink succeeds) writes the
    run's history line, as nobody else will. The line is made before the
    unlink, and the unlink and the append happen with the stop signals held
    back: a keeper burying the ticket ahead the moment its own caller dies
    (PDEATHSIG) finishes the line first, then stops."""
    try:
        owner = os.fstat(fd).st_uid  # the run's user, from the kernel
        if not _removable(path, owner):
            return  # not ours to remove (a member's dead name): nothing read, nothing written
        raw = os.pread(fd, MAX_INFO, 0)
    except OSError:
        return
    if not os.path.exists(path):
        return  # withdrawn: the usual case, when the ticket ahead left for its slot
    load_scanner()  # another user's record, maybe: the C scanner reads it
    try:
        info = from_json(raw.decode("utf-8", "replace") or "null")
    except ValueError:
        info = None
    import time

    from .. import history
    from .. import signals as signal
    from ..outcome import KEEP_PLACE

    record = None
    if isinstance(info, dict):
        info = clean_state(info)
        since = info.get("since")
        stem = os.path.basename(path)[: -len(TICKET_SUFFIX)]
        record = history.run_record(
            run_id=info.get("run_id"), label=info.get("label"), cls=info.get("cls"), host=info.get("host"),
            pool=os.path.basename(os.path.dirname(path)), slot=None, ticket=int(stem) if stem.isdigit() else None,
            budget=info.get("budget"), kept=info.get("kept"), outcome="caller_gone", exit_code=None,
            message="caller gone while waiting in line (its ticket was found dead)"
            + ("" if info.get("kept") is not None else f"; {KEEP_PLACE}"), uid=owner,
            phases={"submitted": since if isinstance(since, (int, float)) else None,  # clean: a number or None
                    "ended": time.time()})
    state_dir = os.path.dirname(os.path.dirname(os.path.dirname(path)))
    held = signal.pthread_sigmask(signal.SIG_BLOCK, signal.STOPS)
    try:
        try:
            os.unlink(path)
        except OSError:
            return  # gone already: withdrawn, or buried by another (or not ours to remove)
        if record is not None:
            history.append(state_dir, record)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def read_info(path: str) -> dict[str, object] | None:
    """A ticket's record; None if it is gone, no regular file, too large,
    or not a JSON object -- never an error: one odd ticket must not stop
    status or cancel for everyone."""
    try:
        fd, _ = open_state(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = from_json(read_limited(fd, MAX_INFO, path).decode("utf-8", "replace") or "null")
    except (OSError, ValueError, StateFileError):  # (too large: someone else's file, named by status)
        return None
    finally:
        os.close(fd)
    return clean_state(data) if isinstance(data, dict) else None


Table = dict[tuple[int, int], list[int]]  # the kernel's lock table: (device, inode) -> pids (proclocks.owners)


def live_tickets(pdir: str, table: Table | None, mine: str | None = None) -> list[tuple[int, str]] | None:
    """(seq, path) of the live tickets in line order, read from the
    kernel's lock table (no probing); None if `table` is None. A ticket
    locked only by another user than its owner (a dead run's ticket that a
    member locked) is none: see held_by_owner. `mine`: our own ticket,
    live whatever the table says -- the table is no snapshot
    (proclocks.raw), and a line that lost our ticket put every ticket
    behind ours ahead of it (a run waiting away then waited on one behind
    it, and the line stood still at its turn)."""
    if table is None:
        return None
    uids: dict[int, int | None] = {}
    return [(e.seq, e.path) for e in scan(pdir) if e.path == mine or held_by_owner(e, table, uids)]


def place(pdir: str, mine: str, table: Table | None = None) -> tuple[int, int, list[int]]:
    """(live tickets ahead of ticket `mine`, live tickets in the pool, their
    numbers in line order). `table`: the kernel's lock table
    (proclocks.owners()), read here if not given."""
    if table is None:
        from .proclocks import owners

        table = owners()
    live = live_tickets(pdir, table, mine)
    if live is None:  # no /proc/locks: probe each ticket
        live = [(seq, path) for seq, path in list_tickets(pdir) if path == mine or probe(path)]
    paths = [path for _, path in live]
    seqs = [seq for seq, _ in live]
    if mine not in paths:
        return len(paths), len(paths) + 1, seqs
    return paths.index(mine), len(paths), seqs


def held_by_owner(e: Entry, table: Table, uids: dict[int, int | None] | None = None) -> bool:
    """Is the ticket `e` locked, by its owner? (proclocks.held_by_owner)"""
    from .proclocks import held_by_owner as held

    return held(table, (e.dev, e.ino), e.uid, uids)


def remove_stale_temps(pdir: str, now: float | None = None) -> None:
    """Remove `.tmp` tickets whose creator died before naming them. A
    temp is unlocked from its creation to its creator's flock (ticket.py,
    `_name_ticket`): one younger than STALE_TEMP_S is left alone, or a
    `slotq status` at that moment would remove a live caller's ticket
    under it (the caller then failed: "state directory ... is not
    usable", benchmarks/, 12-06)."""
    try:
        names = os.listdir(pdir)
    except FileNotFoundError:
        return
    now = time.time() if now is None else now
    for name in names:
        if name.startswith(".") and name.endswith(".tmp"):
            path = os.path.join(pdir, name)
            try:
                young = now - os.lstat(path).st_mtime < STALE_TEMP_S
            except OSError:
                continue
            if not young:
                probe(path)
