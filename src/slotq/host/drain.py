"""Drain: a pool whose owner has stopped it starting commands, for a
while (`slotq host drain`, `slotq host resume`: cli/hostdrain.py).

A drained pool is a file `drain.<pool>` in the state dir, written only by
the pool's owner -- root or the state dir's owner, the kernel's word (the
file's uid), never a name in it: in a shared state dir every member may
create files, and one of theirs under that name is no drain (it is named
by `slotq host check`). The file says since when and why.

While it is there, no command starts in the pool: whoever gets a free slot
of it -- a waiter's runner (hostqueue.Waiter), a standby keeper
(keeper.py), a run starting at once (launch.start_now, by way of the
Waiter) -- looks after the slot's lock is theirs, lets it go again and
waits, in its place, looking every LOOK seconds. The look after the lock
is what makes a drain hold: a drain written before it is seen; a command
started before it was running when the pool was drained. Commands that
run finish under their own budgets; waiting runs keep their places (their
wait is the infrastructure's time: recorded like any wait, --max-wait
counts it); new runs join the line. At `resume` the heads see the file
gone within LOOK and take the slots in line order.

The hot path pays one stat(2) of a name that is not there.
"""

from __future__ import annotations

import os
import time

from ..records import clean_state, from_json, printable, to_json
from ..statefile import StateFileError, open_state, read_limited

PREFIX = "drain."
LOOK = 0.25  # seconds between a drained head's looks for the resume
MAX_BYTES = 4096
MAX_REASON = 200


def drain_path(state_dir: str, pool: str) -> str:
    return os.path.join(state_dir, PREFIX + pool)


def owners(state_dir: str) -> set[int]:
    """Who may drain the pools of `state_dir`: root and the dir's owner."""
    try:
        return {0, os.stat(state_dir).st_uid}
    except OSError:
        return {0}


class Drain:
    """A pool's drain: who (the file's owner, from the kernel), since when
    (seconds since the epoch) and why."""

    __slots__ = ("pool", "uid", "since", "reason")

    def __init__(self, pool: str, uid: int, since: float, reason: str) -> None:
        self.pool, self.uid, self.since, self.reason = pool, uid, since, reason

    @property
    def by(self) -> str:
        from ..procinfo import user_name

        return user_name(self.uid)

    def as_json(self) -> dict[str, object]:
        """As `status --json` and a `queued` event give it (`describe`)."""
        return {"by": self.by, "uid": self.uid, "since": round(self.since, 3), "reason": self.reason}


def describe(pool: object, d: dict[str, object]) -> str:
    """`pool shared drained by root since 2026-12-08 09:00: kernel
    upgrade`, from a drain as_json gave it (maybe another host's);
    without "pool shared" for a `pool` of None."""
    since = d.get("since")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    reason = printable(d.get("reason") or "", MAX_REASON)
    return ((f"pool {printable(pool, 64)} " if pool is not None else "")
            + f"drained by {printable(d.get('by'), 64)} since {when}" + (f": {reason}" if reason else ""))


def drained(state_dir: str, pool: str) -> bool:
    """Is `pool` drained now? (The hot path: a stat of a missing name.)"""
    try:
        os.stat(drain_path(state_dir, pool))
    except OSError:
        return False
    return read(state_dir, pool) is not None


def read(state_dir: str, pool: str) -> Drain | None:
    """The pool's drain, if its owner drained it; None if not drained, or
    if the file is no owner's (a member's file under the name), no regular
    file, too large or not a JSON object."""
    try:
        fd, _ = open_state(drain_path(state_dir, pool), os.O_RDONLY)
    except (OSError, StateFileError):
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid not in owners(state_dir):
            return None
        data = from_json(read_limited(fd, MAX_BYTES, drain_path(state_dir, pool)).decode("utf-8", "replace")
                         or "null", max_depth=2)
    except (OSError, ValueError, StateFileError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict):
        return None
    data = clean_state(data)
    since = data.get("since")
    reason = data.get("reason")
    return Drain(pool, st.st_uid, float(since) if isinstance(since, (int, float)) else st.st_mtime,
                 printable(reason, MAX_REASON) if isinstance(reason, str) else "")


def write(state_dir: str, pool: str, reason: str, now: float | None = None) -> None:
    """Drain `pool` (the caller is one of `owners`): the file, replaced
    atomically, readable by all and writable by us only."""
    path = drain_path(state_dir, pool)
    tmp = f"{path}.{os.getpid()}.tmp"
    body = to_json({"since": time.time() if now is None else now, "reason": reason[:MAX_REASON]}) + "\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.fchmod(fd, 0o644)
        os.write(fd, body.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)  # over a member's file of that name, too: the owner may, in a sticky dir
    except OSError:
        os.unlink(tmp)
        raise


def remove(state_dir: str, pool: str) -> bool:
    """Resume `pool`: True if it was drained."""
    try:
        os.unlink(drain_path(state_dir, pool))
        return True
    except FileNotFoundError:
        return False


def wait_resumed(state_dir: str, pool: str) -> None:
    """Block until `pool` is not drained (a keeper's wait: it has no loop
    of its own), looking every LOOK seconds."""
    while drained(state_dir, pool):
        time.sleep(LOOK)
