"""Waiting away, the host's side: a quiet local run far back in a slow
line sheds its interpreter while it waits, and comes back a few places
before its turn (transports/away.py does the shedding: the caller's
process becomes a shell, and later slotq again).

A queued caller is a CPython process (and, in a one-slot line, its standby
keeper): about 6 MB each. Far back in a line of test suites that is memory
held for minutes for nothing. The runner offers a run to wait away
(`plan`) when it

- is quiet (-q: no reports to make), local (the host side is a thread of
  the caller), in a one-slot pool, without --prepare,
- has more than AWAY_AHEAD runs ahead of it at its first look, and
- expects a long wait: that many runs of the pool's typical length (the
  median of its recent runs in the history; a pool with no history is
  not known to be slow, and nobody goes away there).

Away, the run is a `sh` (NAME in `ps`: `is_away`) waiting in `flock -s` on
the ticket AWAY_AHEAD + 1 places ahead, its own ticket still locked (its
place in line). If it dies away (a `kill -9` of its group), its watcher --
`flock -x` on its ticket, in a session of its own -- gets the lock and
starts `slotq host away-gone` (cli/host.py), which closes the run's wait record
at the moment of the death and buries the ticket (the run's `caller_gone`
history line), as a standby keeper would.

Measured (docs/internals.md, "Memory per waiter"): sh, flock and the
watcher together are about 0.35 MB, against about 6 MB for a caller and its
keeper.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..outcome import Outcome
    from .callerlink import CallerLink
    from .hostqueue import Waiter

AWAY_AHEAD = 4  # a run comes back when this many runs are ahead of it
AWAY_MIN_WAIT = 60.0  # ... and goes away only if it expects to wait this long
ENV_GONE = "SLOTQ_AWAY_GONE"  # for `slotq host away-gone` (JSON)
NAME = "slotq-away"  # the sh's $0: how `ps` and `slotq cancel` know a run waiting away
MAX_ENV = 8192
SIGUSR1 = 10  # slotq cancel's wake-up (Linux; slotq.signals does not export it)


def program(name: str) -> str | None:
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        path = os.path.join(d or ".", name)
        if os.access(path, os.X_OK) and os.path.isfile(path):
            return path
    return None


def plan(state_dir: str, pool: str, ticket_path: str) -> int | None:
    """Should the run holding `ticket_path` go away? A descriptor of the
    ticket to wait for (AWAY_AHEAD + 1 places ahead), else None."""
    ahead = _live_ahead(ticket_path)
    if len(ahead) <= AWAY_AHEAD or program("flock") is None:
        return None
    from .. import history
    from ..history.eta import RECENT, typical_run

    try:
        typical, runs = typical_run(history.once_each(history.recent(state_dir, 2 * RECENT)), pool)
    except Exception:  # an unreadable history: not known to be slow
        return None
    if runs == 0 or len(ahead) * typical < AWAY_MIN_WAIT:
        return None
    from ..statefile import StateFileError, open_state

    try:
        fd, _ = open_state(ahead[-(AWAY_AHEAD + 1)], os.O_RDONLY)
    except (OSError, StateFileError):
        return None  # gone already: the line moves; stay
    return fd


def _live_ahead(ticket_path: str) -> list[str]:
    """Paths of the live tickets ahead of ours, in line order: dead names
    (a member's flood of them, which only they can remove) are no wait, and
    a dead one waited on away brought the run straight back -- to go away
    again, round and round (issue 65's generative test)."""
    from .line import live_tickets
    from .proclocks import owners

    pdir = os.path.dirname(ticket_path)
    live = live_tickets(pdir, owners(), ticket_path)
    if live is None:
        from .line import ahead_of, probe

        return [p for p in ahead_of(pdir, ticket_path) if probe(p)]
    paths = [path for _, path in live]
    return paths[:paths.index(ticket_path)] if ticket_path in paths else paths


def offer(link: CallerLink, state_dir: str, waiter: Waiter, max_wait_left: float | None) -> Outcome | None:
    """Offer the run of `waiter` to wait away, if `plan` says it should: the
    caller execs -- the runner's thread ends with its process -- or says
    `stay` (a stop signal came first, or the exec failed), and the run
    waits on as any other. The outcome if the caller ended the run
    meanwhile."""
    import select

    from .. import protocol

    ahead_fd = plan(state_dir, waiter.pool, waiter.ticket.path)
    if ahead_fd is None:
        return None
    # The stop signals go to the caller's main thread only (this thread was
    # started with them blocked: signals.start_thread): there they are either
    # handled (a cancel, and `stay`) or held across its exec.
    try:
        # `busy`: what this thread selects on until the exec, which the
        # caller must leave alone (transports/away.digits_for).
        link.event(protocol.AWAY, ticket=waiter.ticket.path, ticket_fd=waiter.ticket.fd, ahead_fd=ahead_fd,
                   busy=link.fds(), slot=waiter.slot_paths()[0],
                   **({} if max_wait_left is None else {"max_wait_s": round(max_wait_left, 3)}))
        while not link.stayed:
            ready, _, _ = select.select(link.fds(), [], [])
            ended = link.check(ready)
            if ended is not None:
                return ended
    finally:
        os.close(ahead_fd)
    return None


def is_away(pid: object) -> bool:
    """Is `pid` a run waiting away, whoever's it is (`slotq status`)? Its
    command line says so: `sh -c SCRIPT slotq-away ...`."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read(65536).split(b"\0")
    except OSError:
        return False
    return argv[:2] == [b"sh", b"-c"] and argv[3:4] == [NAME.encode()]


def away_pid(pid: object) -> bool:
    """Is process `pid` a run of ours waiting away (`slotq cancel` wakes it
    with SIGUSR1)?"""
    try:
        return is_away(pid) and os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False
