"""The host runner: one run's life on the host, from ticket to exit.

    ticket ─► queue (status events) ─► slot ─► prepare ─► started ─► exited

It speaks to its caller through a `CallerLink` (callerlink.py): the framed
stream of protocol.py on `out_fd`, the caller's channel on `in_fd` (a
`cancel <reason>` line, or end-of-file / a read error: the caller is gone),
stop signals, and `slotq cancel`. A queued ticket is then
withdrawn at once; a running command's process group is ended (TERM, grace,
KILL) and the slot released. Clocks: the queue has no time limit; the
budget starts when the command starts. What a waiting run reports is
lineview.report's; how its end reads (outcome, message), verdict.judge's.
"""

from __future__ import annotations

import os
import select

from .. import __version__, history, procinfo, protocol
from .. import signals as signal
from ..clock import INF, Clock
from ..config import HostConfig
from ..durations import format_duration
from ..errors import AdmissionRefused, StateDirError
from ..outcome import WHILE_PREPARING, WHILE_WAITING, Outcome
from ..records import load_scanner
from ..spec import RunSpec
from . import orphans, verdict
from .callerlink import CallerLink
from .child import Child, ChildEnd, pump
from .hostqueue import Waiter, ensure_state_dir
from .launch import Early, Launch
from .process import preload_for_start
from .slot import GrantedSlot, SlotLease
from .ticket import Ticket, run_info

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..eta import Basis

# A scheduler's job that says it was submitted longer ago than this has a
# clock that is wrong, not a wait: its runner's start is taken instead.
MAX_SCHEDULER_WAIT = 30 * 86400.0


class _Ended(Exception):
    """The wait ended without a slot (the caller went away or asked to stop,
    the admission limit, a lost keeper); carries the outcome (and how a
    command that had just started ended) and what to say."""

    def __init__(self, outcome: Outcome, end: ChildEnd | None = None, message: str | None = None) -> None:
        self.outcome = outcome
        self.end = end
        self.message = message


class HostRunner:
    def __init__(
        self,
        spec: RunSpec,
        *,
        state_dir: str,
        config: HostConfig,
        in_fd: int = 0,
        out_fd: int = 1,
        clock: Clock | None = None,
        ctl_buffer: bytes = b"",
        allocation: str | None = None,
        ticket: Ticket | None = None,
        wait_closer: Callable[[], Callable[[float], None]] | None = None,
        may_go_away: bool = False,
        came_back: bool = False,
        early: Early | None = None,
    ) -> None:
        """`ticket`: the run's place in line, taken before this runner was
        made (LocalTransport.reserve); the runner adopts it, or withdraws it
        if the run never queues. `wait_closer` (LocalTransport.keep_wait_end):
        how a standby keeper closes the caller's queue wait if the caller
        dies in line; a quiet caller is then told it need not refresh it.
        `may_go_away`: the caller can wait away (host/away.py: `slotq run`
        with the local transport, the runner a thread of it). `early`: what
        launch.start_now did before this runner was made, in place of a
        ticket: the command started (the runner carries the run on), or the
        run's waiter, in line (the runner waits with it)."""
        self.spec = spec
        self._reserved = ticket
        # A slot a scheduler already granted (Slurm: "slurm:JOBID"): this
        # runner then skips the host's own queue.
        self.allocation = allocation
        self.state_dir = state_dir
        self.config = config
        self.clock = clock or Clock()
        self.link = CallerLink(in_fd, out_fd, spec.run_id, self.clock, ctl_buffer)
        self.host = os.uname().nodename
        self.slot: str | None = None  # the slot held, e.g. shared#0
        self._typical: Basis | None = None  # the pool's typical run for the ETA (eta.basis)
        # A waiter made before us (launch.start_now) that found the run in
        # line: we wait with it, its first look taken.
        self._in_line: Waiter | None = None
        if early is not None and early.launch is None:
            self._in_line, self._reserved, early = early.waiter, early.waiter.ticket, None
        # How its command is started, and what the host keeps about it.
        self.launch = early.launch if early is not None and early.launch else Launch(
            spec, state_dir=state_dir, config=config, host=self.host, clock=self.clock)
        self.phases = self.launch.phases
        self.budget = self.launch.budget
        self.grace = self.launch.grace
        self._waiter: Waiter | None = early.waiter if early is not None else None
        self._early = early
        self._lost_message: str | None = None  # set when our keeper was killed
        self._healed: set[str] = set()  # orphaned holders we ended
        self._next_heal = 0.0  # when a wake-up may look for orphaned holders again
        self.wait_closer = wait_closer
        self.may_go_away = may_go_away and not came_back and config.wait_away
        self.came_back = came_back  # it waited away: its wait began before this process

    def close_stream(self) -> None:
        """End the stream to the caller (once)."""
        self.link.close_stream()

    # ------------------------------------------------------------ the run
    def run(self) -> Outcome:
        """Carry the run through; returns its outcome (also sent as `exited`)."""
        try:
            return self._run()
        finally:
            if self._in_line is not None:
                self._in_line.close()
                self._in_line = None
            if self._reserved is not None:
                self._reserved.withdraw()  # the run ended before it queued (a bad work dir)
                self._reserved = None
            self.link.close()
            self.launch.end()

    def _run(self) -> Outcome:
        self.link.take_signals()
        self.link.send(protocol.MAGIC)
        self.link.event(protocol.HELLO, protocol=protocol.PROTOCOL_VERSION, version=__version__,
                    host=self.host, pid=os.getpid(), run_id=self.spec.run_id,
                    **({"warnings": self.config.warnings} if self.config.warnings else {}))
        early, self._early = self._early, None
        if early is not None and early.lease is not None:
            if early.child is None:  # its keeper could not be forked: once more, and said if it fails
                return self._hold(early.lease)
            self.slot = early.lease.name
            return self._carry(early.lease, early.child, early.streams, early.events)
        if self.allocation is not None:
            return self._run_allocated(self.allocation)
        try:
            pool = self.config.pool_for(self.spec.cls)
        except KeyError:
            known = ", ".join(sorted(self.config.classes))
            return self._error("usage", f"unknown class {self.spec.cls!r} on host {self.host} (known: {known})")
        cwd = self.spec.cwd
        if cwd is not None and not os.path.isdir(cwd):
            return self._error("usage", f"work dir {cwd} is not a directory on host {self.host}")
        try:
            ensure_state_dir(self.state_dir)
            got = self._queue(pool)
        except StateDirError as e:
            return self._error("state", str(e))
        except AdmissionRefused as e:
            return self._finish(Outcome.NOT_ADMITTED, None, None, str(e))
        except _Ended as e:
            message = (e.message or verdict.stop_message(self.link, e.outcome, WHILE_WAITING)
                       or "left the queue before getting a slot")
            return self._finish(e.outcome, e.end, None, message)
        if isinstance(got, SlotLease):
            return self._hold(got)
        return self._run_started(*got, slot=f"{pool}#0")

    def _run_allocated(self, allocation: str) -> Outcome:
        """The scheduler gave us the node: no queue here, the command starts
        now; the budget, output and liveness are as on any host."""
        cwd = self.spec.cwd
        if cwd is not None and not os.path.isdir(cwd):
            return self._error("workdir", f"work dir {cwd} is not there on node {self.host} ({allocation}); "
                                          "run from a directory the nodes share")
        try:
            ensure_state_dir(self.state_dir)
        except StateDirError as e:
            return self._error("state", str(e))
        # Its wait was in the scheduler's line, from the client's submission
        # (a clock ahead of ours by a moment is not a wait in the future).
        now = self.clock.wall()
        sent = self.spec.submitted
        self.phases["submitted"] = min(sent, now) if sent is not None and sent > now - MAX_SCHEDULER_WAIT else now
        return self._hold(GrantedSlot(allocation))

    def _error(self, kind: str, message: str) -> Outcome:
        self.link.event(protocol.ERROR, kind=kind, message=message)
        return Outcome.UNAVAILABLE

    def _queue(self, pool: str) -> SlotLease | tuple[Child, dict[int, bytes]]:
        """Wait for a slot: a lease, or a standby keeper that has got the
        slot and started the command (with its output streams). Each turn:
        give up at --max-wait, report, offer to wait away, hand the wait
        to a standby keeper, then sleep until something happens (_woken)."""
        waiter, start = self._join_line(pool)
        spec = self.spec
        self._standby: tuple[Child, dict[int, bytes]] | None = None
        # A one-slot line waits in the kernel, like flock(1): each waiter's
        # keeper, forked at once, waits for the tickets ahead to go, then
        # for the slot, and starts the command the moment the slot is
        # released. A hand-over then wakes one keeper and forks nothing.
        self._by_keeper = waiter.slot_count == 1 and not spec.prepare
        # Its keeper can close the caller's wait record if the caller dies
        # (a local run): a quiet caller far back then sleeps without a
        # single wake-up until its turn.
        self._keeps_wait = self._by_keeper and self.wait_closer is not None
        # Waiting has no limit unless the caller sets one (--max-wait): a
        # policy with its own outcome, never a timeout.
        give_up = start + spec.max_wait if spec.max_wait is not None else INF
        self._next_report = start
        self._next_heal = start + 1.0  # a head that gets its slot within a second never looks
        try:
            lease = waiter.attempt(watch=not self._by_keeper)
            if lease is None:
                self.link.listen_for_cancel()
            while lease is None:
                standby = self._standby
                if standby is not None and standby[0].started is not None:
                    return standby
                now = self.clock.monotonic()
                if now >= give_up:
                    raise _Ended(Outcome.NOT_ADMITTED, self._stop_standby(standby) if standby else None,
                                 self._not_admitted(waiter, pool, now - start))
                if now >= self._next_report:
                    self._report_turn(waiter, pool, start, now)
                if standby is None and self._keeps_wait and self.may_go_away and spec.quiet and not waiter.is_head:
                    self.may_go_away = False  # one look: a run that stays, stays
                    self._offer_away(waiter, None if give_up == INF else give_up - now)
                if standby is None and self._by_keeper and not self._stand_by(waiter, pool, now - start):
                    lease = waiter.attempt()  # no keeper to be had: we wait for the slot ourselves
                    continue
                woken = self._woken(waiter, pool, now, give_up)
                if woken is not None:
                    return woken
                if self._standby is None:
                    lease = self._look_again(waiter, pool)
        except BaseException:
            waiter.withdraw()
            raise
        return lease

    def _join_line(self, pool: str) -> tuple[Waiter, float]:
        """Our waiter (with the ticket taken before us, if any), and when
        our wait began on the monotonic clock."""
        reserved, self._reserved = self._reserved, None
        since = reserved.info["since"] if reserved is not None else None
        now_wall = since if isinstance(since, float) else self.clock.wall()
        self.phases["submitted"] = now_wall
        info = reserved.info if reserved is not None else run_info(self.spec, self.config, now_wall)
        in_line, self._in_line = self._in_line, None
        if in_line is not None and in_line.pool != pool:
            in_line.close()  # (cannot happen: the same config chose both)
            in_line = None
        waiter = self._waiter = in_line or Waiter(self.state_dir, self.config, pool, info, defer_leave=True,
                                                  wait=self._pass_time, ticket=reserved)
        start = self.clock.monotonic()
        if self.came_back:
            start -= max(0.0, self.clock.wall() - now_wall)  # in line since then (--max-wait counts from there)
        return waiter, start

    def _report_turn(self, waiter: Waiter, pool: str, start: float, now: float) -> None:
        """A report period is up: say where we are (the head, or anyone not
        quiet), or once that we wait (a quiet run far back)."""
        spec, standby = self.spec, self._standby
        first = self._next_report == start
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
            self.link.event(protocol.QUEUED, waited_s=round(now - start, 3), pool=pool,
                            **({"wait_kept": True} if self._keeps_wait and standby is None else {}))
        else:
            self._report(waiter, pool, now - start, with_eta=not first and not spec.quiet)
        self._next_report = now + spec.report_every if not spec.quiet or at_head else INF

    def _stand_by(self, waiter: Waiter, pool: str, waited: float) -> bool:
        """Hand the wait to a standby keeper (after the first report: what
        that loads and touches is then shared with the keeper, not copied,
        about 1 MB less for each of the two). False if no process could be
        had (EAGAIN, ENOMEM): our ticket is still ours, and we wait."""
        waiter.stand_down()  # one waiter for the slot, not two (they would deadlock)
        try:
            self._standby = self.launch.start(self.spec.argv, None, last=True, wait_for=waiter.slot_paths()[0],
                                              ticket=waiter.ticket,
                                              wait_end=self.wait_closer() if self.wait_closer else None)
            return True
        except OSError:
            if self._keeps_wait and self.spec.quiet:  # the caller refreshes its wait record after all
                self.link.event(protocol.QUEUED, waited_s=round(waited, 3), pool=pool, wait_kept=False)
            self._by_keeper = self._keeps_wait = False
            return False

    def _woken(self, waiter: Waiter, pool: str, now: float,
               give_up: float) -> tuple[Child, dict[int, bytes]] | None:
        """Sleep until the caller, our keeper or the line wakes us (or the
        next report is due). The standby, if its keeper ended without a
        report after starting the command; raises _Ended for a run that
        ends here."""
        standby = self._standby
        fds = self.link.fds()
        if standby is not None:
            fds.append(standby[0].done_fd)
        elif waiter.fileno() >= 0:
            fds.append(waiter.fileno())
        until = self._next_report - now if standby is not None else min(self._next_report - now,
                                                                         waiter.wait_timeout())
        timeout = max(0.0, min(until, give_up - now))
        ready, _, _ = select.select(fds, [], [], None if timeout == INF else timeout)
        if standby is not None and standby[0].done_fd in ready and standby[0].on_readable():
            return self._keeper_ended(standby)
        if self._next_report == INF and standby is not None and standby[0].at_head:
            self._next_report = self.clock.monotonic()  # quiet, and the head for a report period now
        ended = self.link.check(ready)
        if ended is not None:
            raise _Ended(ended, self._stop_standby(standby) if standby is not None else None)
        return None

    def _keeper_ended(self, standby: tuple[Child, dict[int, bytes]]) -> tuple[Child, dict[int, bytes]]:
        """The keeper ended without a report: killed (OOM, a stray kill). If
        it had started the command just now, that is ended too; the run is
        `unavailable` either way."""
        child = standby[0]
        if child.started is None and child.end is not None and child.end.setup_error:
            raise _Ended(Outcome.UNAVAILABLE, None,
                         f"slotq could not set the command up on host {self.host}: "
                         f"{child.end.setup_error}; nothing ran")
        if child.started is None:
            self._end_lost(child)
            raise _Ended(Outcome.UNAVAILABLE, None, self._lost_message)
        return standby

    def _look_again(self, waiter: Waiter, pool: str) -> SlotLease | None:
        """Woken, waiting ourselves: try for the slot; at the head and still
        without one, look for a holder's death at most once a second (a
        line of hundreds wakes the head often; the status reports look too)."""
        lease = waiter.attempt()
        if self._next_report == INF and waiter.is_head:
            self._next_report = self.clock.monotonic() + self.spec.report_every  # quiet, now the head
        if lease is None and waiter.is_head and self.clock.monotonic() >= self._next_heal:
            self._next_heal = self.clock.monotonic() + 1.0
            self._heal(pool, waiter.slot_count)
        return lease

    def _offer_away(self, waiter: Waiter, max_wait_left: float | None) -> None:
        """Far back in a slow line, offer the caller to wait away
        (host/away.py): it execs -- this thread ends with its process -- or
        says `stay` (a stop signal came first, or the exec failed), and the
        run waits here as any other. Raises _Ended if the caller ended it
        meanwhile."""
        from . import away

        ahead_fd = away.plan(self.state_dir, waiter.pool, waiter.ticket.path)
        if ahead_fd is None:
            return
        # The stop signals go to the caller's thread only: there they are
        # either handled (a cancel, and `stay`) or held across its exec.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
        try:
            self.link.event(protocol.AWAY, ticket=waiter.ticket.path, ticket_fd=waiter.ticket.fd, ahead_fd=ahead_fd,
                            **({} if max_wait_left is None else {"max_wait_s": round(max_wait_left, 3)}))
            while not self.link.stayed:
                ready, _, _ = select.select(self.link.fds(), [], [])
                ended = self.link.check(ready)
                if ended is not None:
                    raise _Ended(ended, None)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            os.close(ahead_fd)

    def _pass_time(self, seconds: float) -> None:
        """Someone holds the ticket counter: wait a moment, still listening
        to our caller (a cancel or a vanished caller ends the wait)."""
        ready, _, _ = select.select(self.link.fds(), [], [], seconds)
        ended = self.link.check(ready)
        if ended is not None:
            where = "while it waited for its place in line (the ticket counter was locked); nothing ran"
            raise _Ended(ended, None, verdict.stop_message(self.link, ended, where)
                         or "left before getting a ticket: the ticket counter was locked")

    def _not_admitted(self, waiter: Waiter, pool: str, waited: float) -> str:
        ahead, _ = waiter.position()
        if not self.spec.max_wait:
            return (f"not admitted: every slot of pool {pool} is busy" + (f" ({ahead} waiting ahead)" if ahead else "")
                    + ", and --max-wait 0 means no waiting")
        return (f"not admitted: waited {format_duration(waited)} in line for pool {pool} ({ahead} still ahead), "
                f"the limit set by --max-wait {format_duration(self.spec.max_wait)}")

    def _heal(self, pool: str, count: int, table: dict[tuple[int, int], list[int]] | None = None) -> list[str]:
        """At the head of the line: end the orphaned commands that hold our
        pool's slots, if they are ours (orphans.heal_slots; another user's
        are left alone, and named by status and our reports)."""
        return orphans.heal_slots(self.state_dir, pool, count, self.grace, self._healed,
                                  f"the next in line (run {self.spec.run_id})", table)

    def _stop_standby(self, standby: tuple[Child, dict[int, bytes]]) -> ChildEnd | None:
        """End a standby keeper; if it started the command just now, that
        ends too (its group, TERM, grace, KILL)."""
        child, streams = standby
        child.stop()
        while not child.on_readable():
            pass
        for fd in streams:
            os.close(fd)
        return child.end if child.started is not None else None

    def _report(self, waiter: Waiter, pool: str, waited: float, with_eta: bool = True) -> None:
        from . import lineview  # only runs that wait pay for it

        fields, self._typical = lineview.report(
            self.state_dir, pool, waiter, self.clock.wall(), lambda table: self._heal(pool, waiter.slot_count, table),
            self._typical, with_eta)
        self.link.event(protocol.QUEUED, waited_s=round(waited, 3), **fields)

    def _hold(self, lease: SlotLease) -> Outcome:
        spec = self.spec
        self.slot = lease.name
        if not spec.prepare:
            # The hand-over path: start the command first, then the
            # bookkeeping (times were taken before), so the command
            # starts as soon after the release as we can make it.
            try:
                child, streams, events = self.launch.start_holding(lease, self._waiter)
            except OSError as e:
                return self._finish(Outcome.UNAVAILABLE, None, lease, f"cannot start the command: {e.strerror}")
            return self._carry(lease, child, streams, events)
        wall = self.clock.wall()
        self.phases["slot"] = wall
        waited = wall - (self.phases["submitted"] or wall)
        record = self.launch.holder_record("prepare")
        record["since"] = wall
        slot_event = protocol.event_frame(protocol.SLOT, wall, slot=lease.name, waited_s=round(waited, 3),
                                          budget=self.budget, ticket=self._ticket_seq())
        try:
            lease.record(**record)  # before we leave the line: the next head must not see a stale one
            self._leave_line()
            self.link.send(slot_event)
            self._close_waiter()
            limit = spec.prepare_timeout if spec.prepare_timeout is not None else self.config.prepare_timeout
            child, streams = self.launch.start(["/bin/sh", "-c", spec.prepare], lease, last=False)
            lease.record(keeper=child.keeper_pid, keeper_start=procinfo.start_ticks(child.keeper_pid))
            end, reason = self._pump(child, streams, limit)
            if end.lost:  # the prepare step's keeper was killed: not the work's failure
                return self._finish(Outcome.UNAVAILABLE, None, lease, self._lost_message or "keeper killed")
            if end.setup_error:
                return self._finish(Outcome.UNAVAILABLE, None, lease, self._judge(end, None)[1])
            self.phases["prepared"] = self.clock.wall()
            ok = reason is None and end.exec_errno is None and end.exit_code == 0
            self.link.event(protocol.PREPARED, ok=ok, exit_code=end.exit_code)
            if reason is not None and reason is not Outcome.EXEC_TIMEOUT and end.stopped:
                message = verdict.stop_message(self.link, reason, WHILE_PREPARING)
                return self._finish(reason, end, lease, message or "stopped during the prepare step")
            if not ok:
                why = (f"prepare step ran past its limit of {format_duration(limit)}"
                       if reason is Outcome.EXEC_TIMEOUT else f"prepare step exited {end.exit_code}")
                return self._finish(Outcome.PREPARE_FAILED, end, lease, why)
            self.phases["started"] = self.clock.wall()
            child, streams = self.launch.start(spec.argv, lease, last=True, record=dict(lease.info, phase="running"))
            self.link.event(protocol.STARTED, budget=self.budget)
            end, reason = self._pump(child, streams, self.budget)
        except OSError as e:
            return self._finish(Outcome.UNAVAILABLE, None, lease, f"cannot start the command: {e.strerror}")
        outcome, message = self._judge(end, reason)
        return self._finish(outcome, end, lease, message)

    def _carry(self, lease: SlotLease, child: Child, streams: dict[int, bytes], events: bytes) -> Outcome:
        """The command Launch.start_holding started: say so, stream its
        output under its budget (from its start), judge and record its end."""
        try:
            self.link.send(events)
            self._close_waiter()
            end, reason = self._pump(child, streams, self.budget - (self.clock.monotonic() - self.launch.started_at))
        except OSError as e:
            return self._finish(Outcome.UNAVAILABLE, None, lease, f"cannot start the command: {e.strerror}")
        outcome, message = self._judge(end, reason)
        return self._finish(outcome, end, lease, message)

    def _run_started(self, child: Child, streams: dict[int, bytes], slot: str) -> Outcome:
        """A standby keeper got the slot and started the command."""
        assert child.started is not None
        wall, mono = child.started
        self.phases["slot"] = self.phases["started"] = wall
        self.slot = slot
        self._leave_line()
        self.link.send(self.launch.slot_events(slot, wall, self._ticket_seq()))
        self._close_waiter()
        # The budget counts from the command's start in the keeper.
        elapsed = max(0.0, self.clock.monotonic() - mono)
        end, reason = self._pump(child, streams, self.budget - elapsed)
        outcome, message = self._judge(end, reason)
        return self._finish(outcome, end, None, message)

    def _ticket_seq(self) -> int | None:
        """Our place in the host's sequence: the order the queue keeps."""
        return self._waiter.ticket.seq if self._waiter is not None else None

    def _close_waiter(self) -> None:
        """Once the command runs and the caller knows: destroying an inotify
        instance can keep the kernel 5-15 ms (an RCU grace period); here
        that is spent while the command runs, not after its result."""
        if self._waiter is not None:
            self._waiter.close()

    def _leave_line(self) -> None:
        if self._waiter is not None:
            self._waiter.leave()

    def _judge(self, end: ChildEnd, reason: Outcome | None) -> tuple[Outcome, str]:
        return verdict.judge(end, reason, self.link, argv0=self.spec.argv[0], host=self.host, budget=self.budget,
                             slot_at=self.phases["slot"], started_at=self.phases["started"],
                             allocation=self.allocation, lost_message=self._lost_message)

    def _waited(self) -> float:
        return (self.phases["slot"] or 0) - (self.phases["submitted"] or 0)

    def _end_lost(self, child: Child) -> None:
        """Our keeper was killed: end the command's processes ourselves (TERM,
        grace, KILL; also those that left its group) -- they are not our
        children, and they hold the slot until they are gone."""
        cmd = child.cmd_pid if child.cmd_pid and child.cmd_pid > 0 else None
        # The session only if we saw its leader alive: a pid is not reused
        # while it names a session, but one seen never may be another's.
        session = cmd if child.cmd_start is not None else None
        ended = orphans.end_lost(session, child.cmd_start, self.spec.run_id, self.grace)
        who = f"the command's supervisor (slotq keeper, pid {child.keeper_pid}) was killed"
        if child.started is not None or ended:
            what = f"pid {cmd}" if cmd else "its processes"
            self._lost_message = (f"{who} after the command started ({what}); slotq ended the command "
                                  f"({len(ended)} process(es)) before releasing the slot")
        else:
            self._lost_message = f"{who} before the command started; nothing ran"

    def _pump(self, child: Child, streams: dict[int, bytes], limit: float) -> tuple[ChildEnd, Outcome | None]:
        return pump(self.link, self.clock, child, streams, limit, self._end_lost)

    def _finish(self, outcome: Outcome, end: ChildEnd | None, lease: SlotLease | None,
                message: str) -> Outcome:
        spec = self.spec
        if lease is None or lease.fd < 0:
            # The slot is free already: what is left is bookkeeping, and the
            # next holder's command should have the CPU first.
            try:
                os.nice(10)
            except OSError:
                pass
        self.phases["ended"] = self.clock.wall()
        if lease is not None:
            lease.release()  # (if still ours) the group is gone: the slot is free before we say so
        if self.link.gone and outcome not in (Outcome.CALLER_GONE,):
            # Nobody heard the result; the history says what happened.
            message = f"{message} (caller gone before the result)"
        p = self.phases
        exit_code = end.exit_code if end is not None and not end.lost and not end.setup_error else None
        record = history.run_record(run_id=spec.run_id, label=spec.label, cls=spec.cls, host=self.host,
                                    outcome=outcome.value, exit_code=exit_code, message=message, phases=dict(p),
                                    pool=self.config.classes.get(spec.cls), slot=self.slot)
        # not_started: the command could not be started (not found, not
        # executable); -q still says so, as a shell would.
        self.link.event(protocol.EXITED, outcome=outcome.value, exit_code=exit_code,
                        signal=end.signal if end is not None else None, message=message, phases=dict(p),
                        **({"not_started": True} if end is not None and end.exec_errno is not None else {}))
        # The result is out: end the stream now, then the history line. If
        # we die before it is written (the caller killed just now, and this
        # thread with it), our keeper, still waiting for our word, writes it.
        self.close_stream()
        history.append(self.state_dir, record)
        self.launch.recorded()
        self._close_waiter()
        return outcome
