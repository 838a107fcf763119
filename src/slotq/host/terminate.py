"""Stopping processes: one policy, TERM (+CONT, so a stopped process can
act on it), a grace period, then KILL -- in two forms:

- `terminate_group`: the keeper's own command, its child: the command's
  process group and every descendant re-parented to the keeper (a child
  subreaper), reaped as they go;
- `end_processes`: processes that are not our children (a killed keeper's
  command, an orphaned holder), found again by a callback every so often,
  since we cannot wait for them; liveness by pid + start time.
"""

from __future__ import annotations

import os
import time

from .. import signals as signal
from ..procinfo import start_ticks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def _children() -> list[int]:
    """Our direct children (re-parented orphans included, as subreaper)."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _signal_all(pgid: int, sig: int, skip: set[int] | None = None) -> bool:
    """Signal the group and every child of ours (but those in `skip`, which
    then gets them added); True if anything was there."""
    found = False
    try:
        os.killpg(pgid, sig)
        found = True
    except (ProcessLookupError, PermissionError):
        pass
    for child in _children():
        if skip is not None:
            if child in skip:
                continue
            skip.add(child)
        try:
            os.kill(child, sig)
            found = True
        except ProcessLookupError:
            pass
    return found


def _reap() -> dict[int, int]:
    reaped: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = status


def yield_cpu() -> None:
    """Lower our priority: what is left of a run once its slot is free is
    bookkeeping, and the next holder's command should have the CPU first."""
    try:
        os.nice(10)
    except OSError:
        pass


def terminate_group(leader: int, grace: float, *, leader_is_child: bool) -> int:
    """End the command's group and our other descendants: TERM (+CONT, so a
    stopped process can act on it), up to `grace` seconds, then KILL.

    Returns the leader's wait status when it is still our child to reap
    (SIGKILL's status if it vanished unseen), else 0.
    """
    status: int | None = None
    termed: set[int] = set()
    if _signal_all(leader, signal.SIGTERM, termed):
        _signal_all(leader, signal.SIGCONT)
    end = time.monotonic() + grace
    delay = 0.002
    while True:
        reaped = _reap()
        if leader_is_child and leader in reaped:
            status = reaped[leader]
        if not _alive(leader):
            break
        if end != float("inf"):
            # Descendants that left the group (setsid) reach us as orphans
            # only once their parent is gone: they get their TERM then.
            for child in _children():
                if child not in termed:
                    termed.add(child)
                    for sig in (signal.SIGTERM, signal.SIGCONT):
                        try:
                            os.kill(child, sig)
                        except ProcessLookupError:
                            pass
        if time.monotonic() >= end:
            _signal_all(leader, signal.SIGKILL)
            end = float("inf")
        time.sleep(delay)  # product code: bounded back-off while processes exit
        delay = min(delay * 2, 0.05)
    if status is None and leader_is_child:
        status = signal.SIGKILL  # raw status of a SIGKILLed process
    return status or 0


def _alive(pgid: int) -> bool:
    """Anything left of the group, or any unreaped child of ours?"""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        pass
    except PermissionError:
        return True
    return bool(_children())


def end_processes(find: Callable[[], dict[int, int]], grace: float, *, rescan: float = 0.25,
                  limit: float = 5.0) -> list[int]:
    """End processes that are not our children (we cannot wait for them):
    TERM (+CONT), up to `grace` seconds, then KILL; newcomers found by
    `find()` (looked up again every `rescan` seconds) get the same. Returns
    the pids signalled. Gives up `limit` seconds after the KILL (a process
    stuck in the kernel) -- by then nothing more can be done from here."""
    signalled: dict[int, int | None] = {}  # pid -> start ticks
    killed_at: float | None = None
    end = time.monotonic() + grace
    next_scan = 0.0
    delay = 0.002
    while True:
        now = time.monotonic()
        if now >= next_scan:
            for pid in find():
                if pid not in signalled:
                    signalled[pid] = start_ticks(pid)
                    for sig in (signal.SIGTERM, signal.SIGCONT) if killed_at is None else (signal.SIGKILL,):
                        _send(pid, sig)
            next_scan = now + rescan
        live = [pid for pid, st in signalled.items() if st is not None and start_ticks(pid) == st]
        if not live:
            if not find():  # none forked during the TERM either
                return sorted(signalled)
            next_scan = 0.0
            continue
        if killed_at is None and now >= end:
            for pid in live:
                _send(pid, signal.SIGKILL)
            killed_at = now
        if killed_at is not None and now - killed_at > limit:
            return sorted(signalled)
        time.sleep(delay)  # product code: bounded back-off while processes exit
        delay = min(delay * 2, 0.05)


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
