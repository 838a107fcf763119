"""Tickets: a caller's place in a pool's line.

A ticket is a file `tickets/<pool>/<seq>.t` that its waiter holds open and
`flock`ed for its whole life. It is live exactly while that lock is held: a
waiter that dies, even by SIGKILL, loses the lock in the kernel, and whoever
next looks finds it unlocked and removes it. No pid checks, so no pid-reuse
bugs.

Sequence numbers come from one counter per host, taken under a lock that is
held until the ticket is visible under its final name, so tickets appear in
sequence order and a later caller can never be listed ahead of an earlier one.

Order cannot be changed from outside:
- A new number is above every ticket already in the pool's line, whatever
  the counter file says (someone may have rewritten or truncated it).
- A ticket is given its name with link(2), which never replaces a name that
  exists (a planted one): the next number is tried instead.
- A ticket renamed to a lower number is found out by the kernel's change
  time (ctime), which a rename sets and nobody but root can set back: a
  ticket created more than `FORGED_SLACK` after a ticket with a higher
  number is placed at the back of the line (`forged_tickets` names them;
  status shows them). Ticket files are writable by their owner only, so
  nobody can touch another's ticket to change its ctime.
Every file is opened through statefile.open_state (no links, no FIFOs).
"""

from __future__ import annotations

import fcntl
import os
import time

from ..errors import AdmissionRefused, StateDirError
from ..records import clean_state, from_json, load_scanner, to_json
from ..statefile import StateFileError, make_dirs, open_state, read_limited, refuse_unsafe_sharing, share_created

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ..config import HostConfig
    from ..spec import RunSpec
    from .claim import Claims

TICKET_SUFFIX = ".t"
MAX_INFO = 65536
# A renamed ticket is found out if it jumped tickets created more than this
# before the rename (the kernel's ctime is coarse; a wall-clock step back
# smaller than this never reorders honest tickets).
FORGED_SLACK_NS = 1_000_000_000
# The counter lock is held for microseconds by honest runs; held longer than
# this, with no ticket taken meanwhile, someone holds it by hand (`flock seq
# sleep inf`): the run joins the line without it (status names the holder).
SEQ_LOCK_LIMIT = 2.0
SEQ_LOCK_LOOKS = 10  # at the least, however long the limit took (~50 looks in 2 s)
MAX_SEQ = 10**18
STALE_TEMP_S = 60.0  # a ticket's temp older than this and unlocked: its creator died before naming it


def pool_dir(state_dir: str, pool: str) -> str:
    return os.path.join(state_dir, "tickets", pool)


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
        _lock_seq(seq_fd, seq_path, wait)  # (or not: held by hand; link(2) below keeps names apart)
        if limits != (None, None):
            _admit(state_dir, pool, *limits, slots)
        raw = os.pread(seq_fd, 32, 0).strip()
        counter = int(raw) if raw.isdigit() and len(raw) <= 20 else 0
        if counter >= MAX_SEQ:
            counter = 0  # garbage: the tickets in line decide
        # Never below a ticket in line: a rewritten counter cannot put us
        # ahead of anyone. Nor moved by a name alone (a planted file).
        highest, top_path = _highest_live(pdir, counter)
        seq = max(counter, highest) + 1
        fd = -1
        for _ in range(100):
            if seq >= MAX_SEQ:
                raise StateDirError(f"ticket numbers in {pdir} are exhausted: ticket {os.path.basename(top_path)} "
                                    f"is held by {_holder_of(top_path)}", pdir)
            full = dict(info, seq=seq, pool=pool)
            fd = _name_ticket(pdir, seq, full)
            if fd >= 0:
                break
            taken = {n for n, _ in _names(pdir)}
            seq += 1
            while seq in taken:  # a run of planted names is passed in one listing, not one try each
                seq += 1
        if fd < 0:
            raise StateDirError(f"cannot name a ticket in {pdir}: every name tried was taken", pdir)
        # Fixed width, written in place: never a truncated, empty counter.
        os.pwrite(seq_fd, b"%020d\n" % seq, 0)
    except OSError as e:
        raise StateDirError(
            f"state directory {state_dir} is not usable: {e.strerror} ({e.filename or state_dir})", state_dir
        ) from None
    finally:
        os.close(seq_fd)
    return Ticket(os.path.join(pdir, f"{seq:016d}{TICKET_SUFFIX}"), fd, seq, pool, full)


def _name_ticket(pdir: str, seq: int, info: dict[str, object]) -> int:
    """Our ticket, saying `info`, as number `seq` of the line in `pdir`:
    its descriptor, locked; -1 if that name could not be ours."""
    final = os.path.join(pdir, f"{seq:016d}{TICKET_SUFFIX}")
    tmp = os.path.join(pdir, f".{seq:016d}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    # Writable by its owner only: nobody else can touch it (and its ctime).
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    named = False
    try:
        # In a shared line, readable by everyone in it, whatever our umask
        # (077 would hide the run's label and pid from their status).
        share_created(fd, pdir, writable=False)
        # Locked before it gets its visible name, so nobody can see an
        # unlocked live ticket and remove it.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, to_json(info).encode())
        try:
            os.link(tmp, final)  # never replaces a name that is there
            named = True
        except FileExistsError:
            pass  # planted, or taken just now (no counter lock): the next free number
        except FileNotFoundError:
            pass  # our temp, removed before we locked it (remove_stale_temps of an older slotq): anew
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
    start = time.monotonic()
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
        delay = min(delay * 2, 0.05)


# Names above the counter looked at before the counter is trusted as it is.
MAX_JUMP_LOOKS = 64


def _highest_live(pdir: str, counter: int) -> tuple[int, str]:
    """The highest number of a live ticket in a pool's line (0 for none),
    and its path. A name alone does not count: a file planted under a
    ticket name that nobody holds (`touch 999999999999999999.t`) would
    otherwise move every later number, or exhaust them, for good -- and in
    a sticky dir only its owner can remove it. Honest tickets are numbered
    at or below the counter, written with each: names above it are each
    looked at (probe), at most MAX_JUMP_LOOKS of them."""
    names = _names(pdir)
    top = max(names, default=(0, ""))
    if top[0] <= counter:  # the usual case: one pass, no sort
        return top[0], os.path.join(pdir, top[1]) if top[1] else ""
    looks = 0
    for seq, name in sorted(names, reverse=True):
        path = os.path.join(pdir, name)
        if seq <= counter:
            return seq, path
        if looks >= MAX_JUMP_LOOKS:
            break
        looks += 1
        if probe(path):
            return seq, path
    return 0, ""


def _holder_of(path: str) -> str:
    """Who holds the lock of the file at `path`, from the kernel."""
    from .proclocks import describe_holders

    try:
        st = os.stat(path)
    except OSError:
        return "nobody now"
    return describe_holders(st.st_dev, st.st_ino) or "a process slotq cannot see"


def ignored(pdir: str, locked: set[tuple[int, int]]) -> list[Entry]:
    """Ticket names in a pool dir that are no place in line and that we
    cannot remove: held by nobody, another user's (in a sticky dir only
    they or root can remove them). Named by status."""
    uid = os.getuid()
    return [e for e in scan(pdir) if (e.dev, e.ino) not in locked and e.uid != uid]


def _admit(state_dir: str, pool: str, max_waiting: int | None, per_user: int | None, slots: int) -> None:
    """The host's [admission] limits (admission.py), for the line as the
    kernel shows it. A run that will not wait -- nobody in line, a slot
    free -- is always admitted: `max_waiting = 0` means "no waiting"."""
    from .admission import judge
    from .proclocks import held
    from .slot import slot_path

    pdir = pool_dir(state_dir, pool)
    locked = held()
    live = live_tickets(pdir, locked)
    if live is None:
        live = [(seq, path) for seq, path in list_tickets(pdir) if probe(path)]
    if not live and locked is not None:
        for i in range(slots):
            try:
                st = os.stat(slot_path(state_dir, pool, i))
            except OSError:
                return  # not made yet: free
            if (st.st_dev, st.st_ino) not in locked:
                return  # free, and nobody in line: this run will not wait
    judge(pool, [path for _, path in live], max_waiting, per_user)


def _names(pdir: str) -> list[tuple[int, str]]:
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


def scan(pdir: str) -> list[Entry]:
    """The tickets of a pool dir in line order (see the module doc):
    regular files with one name only (a link, a FIFO or another file's
    hard link under a ticket name is no ticket)."""
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
    return _in_line_order(out)


def _in_line_order(entries: list[Entry]) -> list[Entry]:
    entries.sort(key=lambda e: e.seq)
    earliest_after = None
    for e in reversed(entries):
        if earliest_after is not None and e.ctime_ns > earliest_after + FORGED_SLACK_NS:
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
    return [e[0] for e in ahead_entries(pdir, path)]


def ahead_entries(pdir: str, path: str) -> list[tuple[str, int, int, int]]:
    """(path, device, inode, change time) of the tickets ahead of the one
    at `path`."""
    out: list[tuple[str, int, int, int]] = []
    for e in scan(pdir):
        if e.path == path:
            return out
        out.append((e.path, e.dev, e.ino, e.ctime_ns))
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
    ahead = [e[0] for e in entries]
    names = {os.path.basename(p) for p in ahead}  # now, while waiting costs nothing
    claims = None
    if slot_paths:
        from .claim import Claims, shared_path

        claims = Claims(entries, slot_paths, shared_path(pdir))
    while ahead:
        closest = ahead.pop()
        if claims is not None and closest in claims.passed:
            continue
        try:
            fd, _ = open_state(closest, os.O_RDONLY)
        except (OSError, StateFileError):
            continue  # gone, or no ticket (a link or FIFO put there since the listing: nobody's place)
        try:
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


def bury(path: str, fd: int) -> None:
    """Remove a dead ticket (we hold its lock, on `fd`). A ticket that is
    still there when its lock is free was not withdrawn: its caller vanished
    while waiting. Whoever removes it (only one unlink succeeds) writes the
    run's history line, as nobody else will. The line is made before the
    unlink, and the unlink and the append happen with the stop signals held
    back: a keeper burying the ticket ahead the moment its own caller dies
    (PDEATHSIG) finishes the line first, then stops."""
    try:
        raw = os.pread(fd, MAX_INFO, 0)
        owner = os.fstat(fd).st_uid  # the run's user, from the kernel
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

    record = None
    if isinstance(info, dict):
        info = clean_state(info)
        since = info.get("since")
        record = history.run_record(
            run_id=info.get("run_id"), label=info.get("label"), cls=info.get("cls"), host=info.get("host"),
            pool=os.path.basename(os.path.dirname(path)), outcome="caller_gone", exit_code=None,
            message="caller gone while waiting in line (its ticket was found dead)", uid=owner,
            phases={"submitted": since if isinstance(since, (int, float)) else None,  # clean: a number or None
                    "ended": time.time()})
    state_dir = os.path.dirname(os.path.dirname(os.path.dirname(path)))
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
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


def live_tickets(pdir: str, locked: set[tuple[int, int]] | None) -> list[tuple[int, str]] | None:
    """(seq, path) of the live tickets in line order, read from the
    kernel's lock table (no probing); None if `locked` is None."""
    if locked is None:
        return None
    return [(e.seq, e.path) for e in scan(pdir) if (e.dev, e.ino) in locked]


def remove_stale_temps(pdir: str, now: float | None = None) -> None:
    """Remove `.tmp` tickets whose creator died before naming them. A
    temp is unlocked from its creation to its creator's flock (`take`):
    one younger than STALE_TEMP_S is left alone, or a `slotq status` at
    that moment would remove a live caller's ticket under it (the caller
    then failed: "state directory ... is not usable", benchmarks/, 12-06)."""
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
