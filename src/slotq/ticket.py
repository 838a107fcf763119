"""Tickets: a caller's place in a pool's line.

A ticket is a file `tickets/<pool>/<seq>.t` that its waiter holds open and
`flock`ed for its whole life. It is live exactly while that lock is held: a
waiter that dies, even by SIGKILL, loses the lock in the kernel, and whoever
next looks finds it unlocked and removes it. No pid checks, so no pid-reuse
bugs.

Sequence numbers come from one counter per host, taken under a lock that is
held until the ticket is visible under its final name, so tickets appear in
sequence order and a later caller can never be listed ahead of an earlier one.
"""

from __future__ import annotations

import fcntl
import os

from .errors import AdmissionRefused, StateDirError
from .records import from_json, to_json

TICKET_SUFFIX = ".t"


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


def take_ticket(state_dir: str, pool: str, info: dict[str, object],
                limits: tuple[int | None, int | None] = (None, None)) -> Ticket:
    """Join the end of `pool`'s line. Raises StateDirError if the state
    directory cannot be written, AdmissionRefused if `limits` (waiting runs
    in the pool, and of this user) are reached -- counted under the
    sequence lock, so two callers cannot both take the last place."""
    pdir = pool_dir(state_dir, pool)
    seq_path = os.path.join(state_dir, "seq")
    try:
        os.makedirs(pdir, exist_ok=True)
        seq_fd = os.open(seq_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise StateDirError(
            f"state directory {state_dir} is not usable: {e.strerror} ({e.filename or state_dir})", state_dir
        ) from None
    try:
        os.fchmod(seq_fd, 0o666)  # shared state dirs: every user takes numbers
    except OSError:
        pass
    try:
        fcntl.flock(seq_fd, fcntl.LOCK_EX)
        if limits != (None, None):
            _admit(pdir, pool, *limits)
        raw = os.pread(seq_fd, 32, 0).strip()
        seq = (int(raw) if raw.isdigit() else _highest_seq(state_dir)) + 1
        # Fixed width, written in place: never a truncated, empty counter.
        os.pwrite(seq_fd, b"%020d\n" % seq, 0)
        final = os.path.join(pdir, f"{seq:016d}{TICKET_SUFFIX}")
        tmp = os.path.join(pdir, f".{seq:016d}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        # Locked before it gets its visible name, so nobody can see an
        # unlocked live ticket and remove it.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        full = dict(info, seq=seq, pool=pool)
        os.write(fd, to_json(full).encode())
        os.rename(tmp, final)
    except OSError as e:
        raise StateDirError(f"state directory {state_dir} is not usable: {e.strerror}", state_dir) from None
    finally:
        os.close(seq_fd)
    return Ticket(final, fd, seq, pool, full)


def _admit(pdir: str, pool: str, max_waiting: int | None, per_user: int | None) -> None:
    from .proclocks import held

    live = live_tickets(pdir, held())
    if live is None:
        live = [(seq, path) for seq, path in list_tickets(pdir) if probe(path)]
    if max_waiting is not None and len(live) >= max_waiting:
        raise AdmissionRefused(f"not admitted: pool {pool} already has {len(live)} run(s) waiting "
                               f"(host policy [admission] max_waiting = {max_waiting})")
    if per_user is not None:
        uid = os.getuid()
        mine = 0
        for _, path in live:
            try:
                mine += os.stat(path).st_uid == uid
            except OSError:
                pass
        if mine >= per_user:
            raise AdmissionRefused(f"not admitted: you already have {mine} run(s) waiting in pool {pool} "
                                   f"(host policy [admission] max_waiting_per_user = {per_user})")


def _highest_seq(state_dir: str) -> int:
    """Recover the counter from the tickets present if the seq file was lost."""
    best = 0
    root = os.path.join(state_dir, "tickets")
    try:
        pools = os.listdir(root)
    except FileNotFoundError:
        return 0
    for p in pools:
        for seq, _ in list_tickets(os.path.join(root, p)):
            best = max(best, seq)
    return best


def list_tickets(pdir: str) -> list[tuple[int, str]]:
    """(seq, path) of every ticket file in a pool dir, earliest first,
    live or not."""
    try:
        names = os.listdir(pdir)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if name.endswith(TICKET_SUFFIX) and not name.startswith("."):
            stem = name[: -len(TICKET_SUFFIX)]
            if stem.isdigit():
                out.append((int(stem), os.path.join(pdir, name)))
    out.sort()
    return out


def probe(path: str) -> bool | None:
    """Is the ticket at `path` live? True: yes. False: it was dead and has
    now been removed. None: it is already gone.

    Opens read-only, so closing our descriptor does not raise IN_CLOSE_WRITE
    and wake the ticket's watcher for nothing.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        bury(path, fd)
        return False
    finally:
        os.close(fd)


def wait_turn(path: str, seq: int) -> None:
    """Block until no live ticket is ahead of ours (`seq`, at `path`) in its
    line: wait in flock(2) for each ticket ahead, closest first, to go -- it
    leaves or its holder dies; a dead one is granted at once -- and remove
    it. No ticket is ever created ahead of ours, so one listing serves."""
    for _, ahead in reversed([t for t in list_tickets(os.path.dirname(path)) if t[0] < seq]):
        try:
            fd = os.open(ahead, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # the wait, in the kernel
            bury(ahead, fd)  # dead now (its owner never locks it again)
        finally:
            os.close(fd)


def bury(path: str, fd: int) -> None:
    """Remove a dead ticket (we hold its lock, on `fd`). A ticket that is
    still there when its lock is free was not withdrawn: its caller vanished
    while waiting. Whoever removes it (only one unlink succeeds) writes the
    run's history line, as nobody else will."""
    try:
        raw = os.pread(fd, 65536, 0)
        os.unlink(path)
    except OSError:
        return  # gone already: withdrawn, or buried by another
    try:
        info = from_json(raw.decode("utf-8", "replace") or "null")
    except ValueError:
        info = None
    if not isinstance(info, dict):
        return
    import time

    from . import history

    state_dir = os.path.dirname(os.path.dirname(os.path.dirname(path)))
    since = info.get("since")
    history.append(state_dir, {
        "run_id": info.get("run_id"), "label": info.get("label"), "cls": info.get("cls"),
        "host": info.get("host"), "outcome": "caller_gone", "exit_code": None,
        "message": "caller gone while waiting in line (its ticket was found dead)",
        "phases": {"queued": since if isinstance(since, (int, float)) else None, "slot": None,
                   "prepared": None, "started": None, "ended": time.time()},
        "waited_s": None, "ran_s": None})


def read_info(path: str) -> dict[str, object] | None:
    try:
        with open(path, "rb") as f:
            data = from_json(f.read().decode("utf-8", "replace") or "null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def live_tickets(pdir: str, locked: set[tuple[int, int]] | None) -> list[tuple[int, str]] | None:
    """(seq, path) of the live tickets, earliest first, read from the
    kernel's lock table (no probing); None if `locked` is None."""
    if locked is None:
        return None
    out = []
    try:
        dev = os.stat(pdir).st_dev
        with os.scandir(pdir) as it:
            for entry in it:
                name = entry.name
                if name.endswith(TICKET_SUFFIX) and not name.startswith(".") \
                        and (dev, entry.inode()) in locked:
                    stem = name[: -len(TICKET_SUFFIX)]
                    if stem.isdigit():
                        out.append((int(stem), entry.path))
    except FileNotFoundError:
        return []
    out.sort()
    return out


def remove_stale_temps(pdir: str) -> None:
    """Remove `.tmp` tickets whose creator died before naming them."""
    try:
        names = os.listdir(pdir)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(".") and name.endswith(".tmp"):
            probe(os.path.join(pdir, name))
