"""The host runner: one run's life on the host, from ticket to exit.

    ticket ─► queue (status events) ─► slot ─► prepare ─► started ─► exited
              inline.py                 holding.py                   hostrun.py (finish)

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

from .. import __version__, protocol
from ..clock import Clock
from ..config import HostConfig
from ..errors import AdmissionRefused, StateDirError
from ..outcome import WHILE_WAITING, Outcome
from ..spec import RunSpec
from . import holding, verdict
from .callerlink import CallerLink
from .child import ChildEnd, unrunnable
from .hostqueue import Waiter, ensure_state_dir
from .hostrun import HostRun
from .launch import Early, Launch
from .slot import GrantedSlot, SlotLease
from .ticket import Ticket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .inline import LineWait


class Arrival:
    """What a run brings to its runner besides its request: a slot or a
    place in line it already has. `allocation`: a slot a scheduler granted
    (Slurm: "slurm job N"): the run then skips the host's own queue. The
    rest comes from a caller in this process (LocalTransport). `ticket`: its place in line, taken before the runner
    was made (LocalTransport.reserve); the runner adopts it, or withdraws it
    if the run never queues. `early`: what launch.start_now did in place of
    a ticket: the command started (the runner carries the run on), or the
    run's waiter, in line (the runner waits with it). `wait_closer`
    (LocalTransport.keep_wait_end): how a standby keeper closes the caller's
    queue wait if the caller dies in line; a quiet caller is then told it
    need not refresh it. `may_go_away`: the caller can wait away
    (host/away.py: `slotq run`, the runner a thread of it). `came_back`: the
    caller is back from waiting away."""

    __slots__ = ("allocation", "ticket", "early", "wait_closer", "may_go_away", "came_back")

    def __init__(self, allocation: str | None = None, ticket: Ticket | None = None, early: Early | None = None,
                 wait_closer: Callable[[], Callable[[float], None]] | None = None, may_go_away: bool = False,
                 came_back: bool = False) -> None:
        self.allocation = allocation
        self.ticket = ticket
        self.early = early
        self.wait_closer = wait_closer
        self.may_go_away = may_go_away
        self.came_back = came_back


class HostRunner:
    def __init__(self, spec: RunSpec, *, state_dir: str, config: HostConfig, in_fd: int = 0, out_fd: int = 1,
                 ctl_buffer: bytes = b"", arrival: Arrival | None = None, clock: Clock | None = None) -> None:
        """The caller's channel: `in_fd`, `out_fd`, and what was read of it
        before (`ctl_buffer`). `arrival`: the slot or the place in line the
        run already has (Arrival)."""
        came = arrival or Arrival()
        ticket, early = came.ticket, came.early
        clock = clock or Clock()
        in_line: Waiter | None = None
        if early is not None and early.launch is None:
            in_line, ticket, early = early.waiter, early.waiter.ticket, None
        # How its command is started, and what the host keeps about it.
        launch = early.launch if early is not None and early.launch else Launch(
            spec, state_dir=state_dir, config=config, host=os.uname().nodename, clock=clock)
        link = CallerLink(in_fd, out_fd, spec.run_id, clock, ctl_buffer, label=spec.label)
        self.run_state = run = HostRun(spec, config, state_dir, link, launch, clock, came.allocation)
        run.waiter = early.waiter if early is not None else None
        self._line: LineWait | None = None
        self._place = (ticket, in_line)  # a place in line taken before us, if any
        self._wait_closer = came.wait_closer
        self._may_go_away = came.may_go_away and config.wait_away
        self._came_back = came.came_back
        self._early = early

    def line(self) -> LineWait:
        """The run's wait in line (inline.py), made when it first queues: a
        run whose command started at once (launch.start_now) never loads it
        (0.2 ms of every such run)."""
        if self._line is None:
            from .inline import LineWait

            ticket, in_line = self._place
            self._line = LineWait(self.run_state, ticket, in_line, self._wait_closer, self._may_go_away,
                                  self._came_back)
        return self._line

    def close_stream(self) -> None:
        """End the stream to the caller (once)."""
        self.run_state.link.close_stream()

    def run(self) -> Outcome:
        """Carry the run through; returns its outcome (also sent as `exited`)."""
        try:
            return self._run()
        finally:
            if self._line is not None or self._place != (None, None):
                self.line().close()  # (a place taken before us, never used: a bad work dir)
            self.run_state.link.close()
            self.run_state.launch.end()

    def _run(self) -> Outcome:
        run = self.run_state
        spec, config, link = run.spec, run.config, run.link
        link.take_signals()
        speaks = spec.protocol or protocol.BASE  # the client's choice; the previous release's, unsaid
        link.send(protocol.magic(speaks))
        link.event(protocol.HELLO, protocol=speaks, version=__version__,
                   host=run.host, pid=os.getpid(), run_id=spec.run_id,
                   **({"warnings": config.warnings} if config.warnings else {}))
        early, self._early = self._early, None
        if early is not None and early.lease is not None:
            if early.child is None:  # its keeper could not be forked: once more, and said if it fails
                return holding.hold(run, early.lease)
            run.slot = early.lease.name
            return holding.carry(run, early.lease, early.child, early.streams, early.events)
        if run.allocation is not None:
            return self._run_allocated(run.allocation)
        try:
            pool = config.pool_for(spec.cls)
        except KeyError:
            known = ", ".join(sorted(config.classes))
            return self._error("usage", f"unknown class {spec.cls!r} on host {run.host} (known: {known})")
        if spec.cwd is not None and not os.path.isdir(spec.cwd) and not self._tree_later:
            return self._error("usage", f"work dir {spec.cwd} is not a directory on host {run.host}")
        return self._queue(pool)

    @property
    def _tree_later(self) -> bool:
        """A late-bound run's work tree comes once its slot is taken (`go`):
        not there yet, or an older one (transports/bound.py)."""
        spec = self.run_state.spec
        return spec.bind is not None and spec.work_id is not None

    def _queue(self, pool: str) -> Outcome:
        """Wait in line for a slot of `pool`, then hold it."""
        from .inline import WaitEnded  # only runs that queue load inline.py

        run = self.run_state
        if self._place == (None, None):  # (a place taken before us: its caller looked already)
            exec_errno = self._unrunnable()
            if exec_errno is not None:  # a typo fails now, not after its turn in line
                return self._cannot_start(exec_errno)
        try:
            ensure_state_dir(run.state_dir)
            got = self.line().wait(pool)
        except StateDirError as e:
            return self._error("state", str(e))
        except AdmissionRefused as e:
            return run.finish(Outcome.NOT_ADMITTED, None, None, str(e))
        except WaitEnded as e:
            if run.link.passed:
                return e.outcome  # a reservation the caller no longer needs: no run of this host's
            message = (e.message or verdict.stop_message(run.link, e.outcome, WHILE_WAITING)
                       or verdict.left_line(e.outcome, run.spec.kept is not None))
            return run.finish(e.outcome, e.end, None, message)
        if isinstance(got, SlotLease):
            if run.spec.bind is not None:
                declined = self._offer(got)
                if declined is not None:
                    return declined
            return holding.hold(run, got)
        return holding.run_started(run, *got, slot=f"{pool}#0")

    def _offer(self, lease: SlotLease) -> Outcome | None:
        """A late-bound reservation (spec.bind) has its slot: offer it to
        the caller, which waits on other hosts too, and hold it until it
        says `go` (None: the command starts here) or `pass` (it took a slot
        elsewhere: the slot is released at once, and the run leaves no
        line in this host's history). A cancel or a caller gone meanwhile
        ends the run as in line."""
        import select

        run = self.run_state
        run.phases["slot"] = run.clock.wall()  # its wait ends here: the caller's transfer is not a wait
        lease.record(**dict(run.launch.holder_record("offered", run.ticket_seq()), since=run.phases["slot"]))
        run.link.event(protocol.OFFERED, slot=lease.name, ticket=run.ticket_seq())
        link = run.link
        while not link.went:
            ready, _, _ = select.select(link.fds(), [], [])
            ended = link.check(ready)
            if ended is not None:
                return self._declined(lease, ended)
        cwd = run.spec.cwd  # (its work tree came meanwhile)
        if cwd is not None and not os.path.isdir(cwd):
            lease.release()
            return self._error("usage", f"work dir {cwd} is not a directory on host {run.host}")
        return None

    def _declined(self, lease: SlotLease, outcome: Outcome) -> Outcome:
        """The offered slot is not taken: released now."""
        run = self.run_state
        run.leave_line()
        if run.link.passed:
            lease.release()
            return outcome
        message = verdict.stop_message(run.link, outcome, WHILE_WAITING) or verdict.left_line(outcome, False)
        return run.finish(outcome, None, lease, message)

    def _run_allocated(self, allocation: str) -> Outcome:
        """The scheduler gave us the node: no queue here, the command starts
        now; the budget, output and liveness are as on any host."""
        run = self.run_state
        cwd = run.spec.cwd
        if cwd is not None and not os.path.isdir(cwd):
            return self._error("workdir", f"work dir {cwd} is not there on node {run.host} ({allocation}); "
                                          "run from a directory the nodes share")
        try:
            ensure_state_dir(run.state_dir)
        except StateDirError as e:
            return self._error("state", str(e))
        # Its wait was in the scheduler's line, from the client's submission.
        run.phases["submitted"] = run.spec.submitted_on(run.clock.wall())
        return holding.hold(run, GrantedSlot(allocation))

    def _unrunnable(self) -> int | None:
        """Why the command cannot start here (host/child.unrunnable), if it
        can be told before the run's turn: not when a --prepare step may
        make it, nor a path in a work tree that comes later."""
        spec = self.run_state.spec
        if spec.prepare or (self._tree_later and "/" in spec.argv[0]):
            return None
        return unrunnable(spec.argv[0], spec.cwd or os.getcwd())

    def _cannot_start(self, exec_errno: int) -> Outcome:
        """The command cannot start on this host (not found: 127, not
        executable: 126), found before the run took a place: said as a run
        that tried says it; nothing joined the line, and, as for a caller
        that finds it before it asks a host (cli/run.py), the history has
        no line of it."""
        run = self.run_state
        end = ChildEnd(None, exec_errno, False)
        run.phases["ended"] = run.clock.wall()
        run.link.event(protocol.EXITED, outcome=Outcome.FAILED.value, exit_code=end.exit_code, signal=None,
                       message=end.describe(run.spec.argv[0]), phases=dict(run.phases), not_started=True)
        return Outcome.FAILED

    def _error(self, kind: str, message: str) -> Outcome:
        self.run_state.link.event(protocol.ERROR, kind=kind, message=message)
        return Outcome.UNAVAILABLE
