"""A run's wait in line, until it has a slot: a lease of its own, or a
standby keeper that got the slot and started the command (process.py).
Each turn: give up at --max-wait, report (lineview.py), offer to wait away
(away.py), hand the wait to a standby keeper, then sleep until the caller,
the keeper or the line wakes us. A wait that ends without a slot raises
`WaitEnded`."""

from __future__ import annotations

import os
import select

from .. import protocol
from ..clock import INF
from ..durations import format_duration
from ..outcome import Outcome
from ..records import load_scanner
from . import verdict
from .child import Child, ChildEnd
from .hostqueue import Waiter
from .hostrun import HostRun
from .orphans import heal_slots
from .process import preload_for_start
from .slot import SlotLease
from .ticket import Ticket, run_info

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..history.eta import Basis

Standby = tuple[Child, dict[int, bytes]]  # a standby keeper and its command's output streams


class WaitEnded(Exception):
    """The wait ended without a slot (the caller went away or asked to stop,
    the admission limit, a lost keeper); carries the outcome (and how a
    command that had just started ended) and what to say."""

    def __init__(self, outcome: Outcome, end: ChildEnd | None = None, message: str | None = None) -> None:
        self.outcome = outcome
        self.end = end
        self.message = message


class LineWait:
    """`reserved`: a ticket taken before the runner (LocalTransport.reserve);
    `in_line`: a waiter launch.start_now made, its first look taken.
    `wait_closer`: how a standby keeper closes the caller's queue wait if
    the caller dies in line. `may_go_away`: the caller can wait away;
    `came_back`: it did, and its wait began before this process."""

    def __init__(self, run: HostRun, reserved: Ticket | None, in_line: Waiter | None,
                 wait_closer: Callable[[], Callable[[float], None]] | None, may_go_away: bool,
                 came_back: bool) -> None:
        self.run = run
        self.reserved = reserved
        self.in_line = in_line
        self.wait_closer = wait_closer
        self.may_go_away = may_go_away
        self.came_back = came_back
        self.standby: Standby | None = None
        self.by_keeper = False  # the wait is a standby keeper's, in flock
        self.keeps_wait = False  # and that keeper closes the caller's wait record if it dies
        self.next_report = 0.0
        self.next_heal = 0.0  # when a wake-up may look for orphaned holders again
        self.typical: Basis | None = None  # the pool's typical run for the ETA (eta.basis)

    def close(self) -> None:
        """The run ended before it queued (a bad work dir): let go of what
        was made for it."""
        if self.in_line is not None:
            self.in_line.close()
            self.in_line = None
        if self.reserved is not None:
            self.reserved.withdraw()
            self.reserved = None

    def wait(self, pool: str) -> SlotLease | Standby:
        """Wait for a slot of `pool`."""
        waiter, start = self._join_line(pool)
        spec = self.run.spec
        # A one-slot line waits in the kernel, like flock(1): each waiter's
        # keeper, forked at once, waits for the tickets ahead to go, then
        # for the slot, and starts the command the moment the slot is
        # released. A hand-over then wakes one keeper and forks nothing.
        # (Not a late-bound reservation: its slot is offered before the
        # command starts, runner.py.)
        self.by_keeper = waiter.slot_count == 1 and not spec.prepare and spec.bind is None
        # Its keeper can close the caller's wait record if the caller dies
        # (a local run): a quiet caller far back then sleeps without a
        # single wake-up until its turn.
        self.keeps_wait = self.by_keeper and self.wait_closer is not None
        # Waiting has no limit unless the caller sets one (--max-wait): a
        # policy with its own outcome, never a timeout.
        give_up = start + spec.max_wait if spec.max_wait is not None else INF
        self.next_report = start
        self.next_heal = start + 1.0  # a head that gets its slot within a second never looks
        try:
            lease = waiter.attempt(watch=not self.by_keeper)
            if lease is None:
                self.run.link.listen_for_cancel()
            while lease is None:
                standby = self.standby
                if standby is not None and standby[0].started is not None:
                    return standby
                now = self.run.clock.monotonic()
                if now >= give_up:
                    raise WaitEnded(Outcome.NOT_ADMITTED, _stop_standby(standby) if standby else None,
                                    _not_admitted(waiter, pool, now - start, spec.max_wait))
                if now >= self.next_report:
                    self._report_turn(waiter, pool, start, now)
                # A quiet caller far back (its keeper closes its wait if it
                # dies), or a kept run's stand-in (client/standin.py), which
                # nobody waits with: their process may become a shell.
                may = self.keeps_wait and spec.quiet if spec.kept is None else self.by_keeper
                if standby is None and may and self.may_go_away and not waiter.is_head:
                    self.may_go_away = False  # one look: a run that stays, stays
                    from . import away  # only runs far back in a slow line pay for it

                    ended = away.offer(self.run.link, self.run.state_dir, waiter,
                                       None if give_up == INF else give_up - now)
                    if ended is not None:
                        raise WaitEnded(ended, None)
                if standby is None and self.by_keeper and not self._stand_by(waiter, pool, now - start):
                    lease = waiter.attempt()  # no keeper to be had: we wait for the slot ourselves
                    continue
                woken = self._woken(waiter, now, give_up)
                if woken is not None:
                    return woken
                if self.standby is None:
                    lease = self._look_again(waiter, pool)
        except BaseException:
            waiter.withdraw()
            raise
        return lease

    def _join_line(self, pool: str) -> tuple[Waiter, float]:
        """Our waiter (with the ticket taken before us, if any), and when
        our wait began on the monotonic clock."""
        run = self.run
        reserved, self.reserved = self.reserved, None
        since = reserved.info["since"] if reserved is not None else None
        now_wall = since if isinstance(since, float) else run.spec.submitted_on(run.clock.wall())
        run.phases["submitted"] = now_wall
        info = reserved.info if reserved is not None else run_info(run.spec, run.config, now_wall)
        in_line, self.in_line = self.in_line, None
        if in_line is not None and in_line.pool != pool:
            in_line.close()  # (cannot happen: the same config chose both)
            in_line = None
        waiter = run.waiter = in_line or Waiter(run.state_dir, run.config, pool, info, defer_leave=True,
                                                wait=self._pass_time, ticket=reserved)
        start = run.clock.monotonic()
        if self.came_back:
            start -= max(0.0, run.clock.wall() - now_wall)  # in line since then (--max-wait counts from there)
        return waiter, start

    def _report_turn(self, waiter: Waiter, pool: str, start: float, now: float) -> None:
        """A report period is up: say where we are (the head, or anyone not
        quiet), or once that we wait (a quiet run far back)."""
        spec, standby = self.run.spec, self.standby
        first = self.next_report == start
        if first:
            # We have time now; the hand-over will not. From here on this run
            # reads other users' records, the history and its reports with
            # the C JSON scanner.
            preload_for_start()
            load_scanner()
        # A quiet caller shows none of them: only the head reports, for its
        # reports end orphaned holders. Far back, the run says once that it
        # waits (the caller opens its wait record), without looking at the
        # line, and sleeps in the kernel until its turn, at no CPU.
        at_head = standby[0].at_head if standby is not None else waiter.is_head
        if spec.quiet and not at_head:
            self.run.link.event(protocol.QUEUED, waited_s=round(now - start, 3), pool=pool, **self._place(waiter),
                                **({"wait_kept": True} if self.keeps_wait and standby is None else {}))
        else:
            self.report(waiter, pool, now - start, with_eta=not first and not spec.quiet)
        self.next_report = now + spec.report_every if not spec.quiet or at_head else INF

    def report(self, waiter: Waiter, pool: str, waited: float, with_eta: bool = True) -> None:
        """Where we are in line, who holds the slots, the machine's load
        (lineview.report): a `queued` event."""
        from . import lineview  # only runs that wait pay for it

        run = self.run
        fields, self.typical = lineview.report(
            run.state_dir, pool, waiter, run.clock.wall(), lambda table: self._heal(pool, waiter.slot_count, table),
            self.typical, with_eta)
        run.link.event(protocol.QUEUED, waited_s=round(waited, 3), **fields, **self._place(waiter))

    def _place(self, waiter: Waiter) -> dict[str, object]:
        """The run's ticket number and budget, known from its first report
        (its record has them even if it never gets a slot)."""
        return {"ticket": waiter.ticket.seq, "budget": self.run.budget}

    def _stand_by(self, waiter: Waiter, pool: str, waited: float) -> bool:
        """Hand the wait to a standby keeper (after the first report: what
        that loads and touches is then shared with the keeper, not copied,
        about 1 MB less for each of the two). False if no process could be
        had (EAGAIN, ENOMEM): our ticket is still ours, and we wait."""
        waiter.stand_down()  # one waiter for the slot, not two (they would deadlock)
        try:
            self.standby = self.run.launch.start(self.run.spec.argv, None, last=True,
                                                 wait_for=waiter.slot_paths()[0], ticket=waiter.ticket,
                                                 wait_end=self.wait_closer() if self.wait_closer else None)
            return True
        except OSError:
            if self.keeps_wait and self.run.spec.quiet:  # the caller refreshes its wait record after all
                self.run.link.event(protocol.QUEUED, waited_s=round(waited, 3), pool=pool, wait_kept=False)
            self.by_keeper = self.keeps_wait = False
            return False

    def _woken(self, waiter: Waiter, now: float, give_up: float) -> Standby | None:
        """Sleep until the caller, our keeper or the line wakes us (or the
        next report is due). The standby, if its keeper ended without a
        report after starting the command; raises WaitEnded for a run that
        ends here."""
        standby, link = self.standby, self.run.link
        fds = link.fds()
        if standby is not None:
            fds.append(standby[0].done_fd)
        elif waiter.fileno() >= 0:
            fds.append(waiter.fileno())
        until = self.next_report - now if standby is not None else min(self.next_report - now,
                                                                        waiter.wait_timeout())
        timeout = max(0.0, min(until, give_up - now))
        ready, _, _ = select.select(fds, [], [], None if timeout == INF else timeout)
        if standby is not None and standby[0].done_fd in ready and standby[0].on_readable():
            return self._keeper_ended(standby)
        if self.next_report == INF and standby is not None and standby[0].at_head:
            self.next_report = self.run.clock.monotonic()  # quiet, and the head for a report period now
        ended = link.check(ready)
        if ended is not None:
            raise WaitEnded(ended, _stop_standby(standby) if standby is not None else None)
        return None

    def _keeper_ended(self, standby: Standby) -> Standby:
        """The keeper ended without a report: killed (OOM, a stray kill). If
        it had started the command just now, that is ended too; the run is
        `unavailable` either way."""
        child = standby[0]
        if child.started is None and child.end is not None and child.end.setup_error:
            raise WaitEnded(Outcome.UNAVAILABLE, None,
                            f"slotq could not set the command up on host {self.run.host}: "
                            f"{child.end.setup_error}; nothing ran")
        if child.started is None:
            self.run.end_lost(child)
            raise WaitEnded(Outcome.UNAVAILABLE, None, self.run.lost_message)
        return standby

    def _look_again(self, waiter: Waiter, pool: str) -> SlotLease | None:
        """Woken, waiting ourselves: try for the slot; at the head and still
        without one, look for a holder's death at most once a second (a
        line of hundreds wakes the head often; the status reports look too)."""
        lease = waiter.attempt()
        clock = self.run.clock
        if self.next_report == INF and waiter.is_head:
            self.next_report = clock.monotonic() + self.run.spec.report_every  # quiet, now the head
        if lease is None and waiter.is_head and clock.monotonic() >= self.next_heal:
            self.next_heal = clock.monotonic() + 1.0
            self._heal(pool, waiter.slot_count)
        return lease

    def _heal(self, pool: str, count: int, table: dict[tuple[int, int], list[int]] | None = None) -> list[str]:
        """At the head of the line: end the orphaned commands that hold our
        pool's slots, if they are ours (orphans.heal_slots; another user's
        are left alone, and named by status and our reports). Its module
        loads with the wait (this one), not when the run reaches the head:
        that is the moment of a hand-over."""
        run = self.run
        return heal_slots(run.state_dir, pool, count, run.grace, run.healed,
                          f"the next in line (run {run.spec.run_id})", table)

    def _pass_time(self, seconds: float) -> None:
        """Someone holds the ticket counter: wait a moment, still listening
        to our caller (a cancel or a vanished caller ends the wait)."""
        link = self.run.link
        ready, _, _ = select.select(link.fds(), [], [], seconds)
        ended = link.check(ready)
        if ended is not None:
            where = "while it waited for its place in line (the ticket counter was locked); nothing ran"
            raise WaitEnded(ended, None, verdict.stop_message(link, ended, where)
                            or "left before getting a ticket: the ticket counter was locked")


def _stop_standby(standby: Standby) -> ChildEnd | None:
    """End a standby keeper; if it started the command just now, that
    ends too (its group, TERM, grace, KILL)."""
    child, streams = standby
    child.stop()
    while not child.on_readable():
        pass
    for fd in streams:
        os.close(fd)
    return child.end if child.started is not None else None


def _not_admitted(waiter: Waiter, pool: str, waited: float, max_wait: float | None) -> str:
    ahead, _ = waiter.position()
    if waiter.drained:
        from .drain import describe, read

        d = read(waiter.state_dir, pool)
        if d is not None:
            return (f"not admitted: waited {format_duration(waited)} in line ({ahead} still ahead): "
                    f"{describe(pool, d.as_json())}; --max-wait {format_duration(max_wait or 0)}")
    if not max_wait:
        return (f"not admitted: every slot of pool {pool} is busy" + (f" ({ahead} waiting ahead)" if ahead else "")
                + ", and --max-wait 0 means no waiting")
    return (f"not admitted: waited {format_duration(waited)} in line for pool {pool} ({ahead} still ahead), "
            f"the limit set by --max-wait {format_duration(max_wait)}")
