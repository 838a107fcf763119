"""Which files are flock()ed right now, read from /proc/locks.

Looking at a lock by trying to take it has side effects: a brief
LOCK_SH|LOCK_NB on a slot can make the head of the line miss a release, and
closing a read-write descriptor raises IN_CLOSE_WRITE, waking the head for
nothing. Status reports (every waiter makes them) read the kernel's lock
table instead: no locks taken, nobody woken. Linux only; elsewhere callers
fall back to probing.
"""

from __future__ import annotations

import os


def held() -> set[tuple[int, int]] | None:
    """(device, inode) of every file with a granted flock; None if the
    kernel does not say."""
    table = owners()
    return None if table is None else set(table)


MAX_TABLE = 64 << 20  # bytes of /proc/locks read at most (~1.2 million locks)
_CHUNK = 1 << 20


def raw() -> bytes | None:
    """The kernel's lock table as it reads; None if it does not say. Read
    in fixed chunks, at most MAX_TABLE: a buffered read of unknown length
    (growing requests) took 1.4 s where these took 0.06 s, with 26,000
    locks one member held (issue 65). No snapshot: the kernel gives a
    page of it per read, and a lock taken or let go between two reads
    moves the rest, so a lock held all along can be missing (or one
    shown twice) -- the tickets and slots we hold ourselves we know
    without it (line.live_tickets' `mine`)."""
    try:
        fd = os.open("/proc/locks", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    parts, size = [], 0
    try:
        while size < MAX_TABLE:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(parts)


def owners(data: bytes | None = None) -> dict[tuple[int, int], list[int]] | None:
    """(device, inode) -> pids holding a granted flock on it; None if the
    kernel does not say. The pid is the process that took the lock (a
    lock inherited across fork is shown under its taker). `data`: the
    table, if read already (raw())."""
    data = raw() if data is None else data
    if data is None:
        return None
    out: dict[tuple[int, int], list[int]] = {}
    for line in data.splitlines():
        parts = line.split()
        # "1: FLOCK ADVISORY WRITE pid maj:min:inode start end"; a waiter
        # blocked on a lock shows as "1: -> FLOCK ...": not held.
        if len(parts) < 6 or parts[1] != b"FLOCK":
            continue
        try:
            major, minor, inode = parts[5].split(b":")
            key = (os.makedev(int(major, 16), int(minor, 16)), int(inode))
            out.setdefault(key, []).append(int(parts[4]))
        except ValueError:
            continue
    return out


def holder_pids(dev: int, ino: int, table: dict[tuple[int, int], list[int]] | None = None) -> list[int]:
    """Pids holding a flock on the file (dev, ino), from the kernel."""
    table = owners() if table is None else table
    return sorted(set((table or {}).get((dev, ino), [])))


def pids_on(path: str, table: dict[tuple[int, int], list[int]] | None) -> list[int] | None:
    """Pids holding a flock on the file at `path`; None if the kernel does
    not say (no table) or the file is gone."""
    if table is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return holder_pids(st.st_dev, st.st_ino, table)


def describe_holders(dev: int, ino: int, table: dict[tuple[int, int], list[int]] | None = None) -> str:
    """'pid 123 (user alice, flock)' for each process holding a lock on
    the file: who, from the kernel -- not from any record a user wrote."""
    from ..procinfo import uid_of, user_name

    bits = []
    for pid in holder_pids(dev, ino, table):
        uid = uid_of(pid)
        who = user_name(uid) if uid is not None else "?"
        bits.append(f"pid {pid} (user {who}, {_comm(pid)})")
    return ", ".join(bits)


def _comm(pid: int) -> str:
    try:
        from ..records import printable

        with open(f"/proc/{pid}/comm", "rb") as f:
            return printable(f.read(64).decode("utf-8", "replace").strip(), 32) or "?"
    except OSError:
        return "?"


def held_by_owner(table: dict[tuple[int, int], list[int]], key: tuple[int, int], owner: int,
                  uids: dict[int, int | None] | None = None) -> bool:
    """Is the file `key` (device, inode) locked, by its owner `owner` (its
    file's uid)? A ticket is its owner's place while their process holds
    it; a ticket of a run that died, locked since by someone else, is
    nobody's place (it does not count for its owner's admission, nor hold
    anyone up). Unknown holders (gone meanwhile, or a /proc that does not
    say) count as the owner's. `uids`: a cache of pid -> uid for one look."""
    from ..procinfo import uid_of

    pids = table.get(key)
    if not pids:
        return False
    uids = {} if uids is None else uids
    known = False
    for pid in pids:
        if pid not in uids:
            uids[pid] = uid_of(pid)
        if uids[pid] == owner:
            return True
        known = known or uids[pid] is not None
    return not known
