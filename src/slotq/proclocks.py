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
    try:
        with open("/proc/locks", "rb") as f:
            data = f.read()
    except OSError:
        return None
    out: set[tuple[int, int]] = set()
    for line in data.splitlines():
        parts = line.split()
        # "1: FLOCK ADVISORY WRITE pid maj:min:inode start end"; a waiter
        # blocked on a lock shows as "1: -> FLOCK ...": not held.
        if len(parts) < 6 or parts[1] != b"FLOCK":
            continue
        try:
            major, minor, inode = parts[5].split(b":")
            out.add((os.makedev(int(major, 16), int(minor, 16)), int(inode)))
        except ValueError:
            continue
    return out
