"""What the kernel says of a process (/proc): when it started, whose it is,
whether it is still the one we knew. A process is identified by pid *and*
start time (clock ticks since boot), never by pid alone: a reused pid is
another process.

The bottom layer: it imports nothing of slotq but `records` (the queue,
the history, status and the CLI all ask these questions)."""

from __future__ import annotations

import os

from .records import is_pid

# How slotq knows its own processes: a run's command has its run id in this
# environment variable (host/keeper.py puts it there), and a keeper names
# itself KEEPER_NAME (its comm: set by itself, so only by its own user).
MARKER = "SLOTQ_RUN_ID"
KEEPER_NAME = b"slotq-keeper"


def stat_fields(pid: int | str) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot); None if it is
    gone or a zombie (which runs nothing and holds nothing)."""
    fields = stat_fields(pid)
    if fields is None or fields[0] == b"Z":
        return None
    return int(fields[19])


_own: tuple[int, int] | None = None


def own_start() -> int:
    """This process's start ticks (cached per process: forks re-read)."""
    global _own
    pid = os.getpid()
    if _own is None or _own[0] != pid:
        _own = (pid, start_ticks(pid) or 0)
    return _own[1]


def alive(pid: object, start: object) -> bool:
    """Is the process that had `pid` and started at `start` still there?
    Without a start time (an older record), the pid alone decides."""
    if not is_pid(pid):
        return False
    if isinstance(start, int) and not isinstance(start, bool):
        return start_ticks(pid) == start
    return start_ticks(pid) is not None


def uid_of(pid: int) -> int | None:
    """The real uid of `pid` (readable for every process), None if gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def user_name(uid: int | None) -> str:
    if uid is None:
        return "?"
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
