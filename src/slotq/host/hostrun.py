"""What one run on the host shares between its steps (runner.py drives
them): the spec and the host's config, the link to the caller, how the
command is started (launch.py), the phase times, the run's place in line
and the slot it holds -- and the few acts every step may need: leave the
line, end the processes of a killed keeper, stream a command under its
budget, judge its end.

The steps: the wait in line (inline.py), the slot and the command
(holding.py), and the end (`finish`, here: every path ends through it).
"""

from __future__ import annotations

from .. import history, protocol
from ..clock import Clock
from ..config import HostConfig
from ..outcome import Outcome
from ..spec import RunSpec
from . import verdict
from .callerlink import CallerLink
from .child import Child, ChildEnd, pump
from .hostqueue import Waiter
from .launch import Launch
from .slot import SlotLease
from .terminate import yield_cpu


class HostRun:
    def __init__(self, spec: RunSpec, config: HostConfig, state_dir: str, link: CallerLink, launch: Launch,
                 clock: Clock, allocation: str | None) -> None:
        self.spec = spec
        self.config = config
        self.state_dir = state_dir
        self.link = link
        self.launch = launch
        self.clock = clock
        self.host = launch.host
        # A slot a scheduler already granted (Slurm: "slurm:JOBID"): the
        # run then skips the host's own queue.
        self.allocation = allocation
        self.phases = launch.phases
        self.budget = launch.budget
        self.grace = launch.grace
        self.waiter: Waiter | None = None  # our place in line, while we have one
        self.slot: str | None = None  # the slot held, e.g. shared#0
        self.lost_message: str | None = None  # set when our keeper was killed
        self.healed: set[str] = set()  # orphaned holders we ended

    def ticket_seq(self) -> int | None:
        """Our place in the host's sequence: the order the queue keeps."""
        return self.waiter.ticket.seq if self.waiter is not None else None

    def leave_line(self) -> None:
        if self.waiter is not None:
            self.waiter.leave()

    def close_waiter(self) -> None:
        """Once the command runs and the caller knows: destroying an inotify
        instance can keep the kernel 5-15 ms (an RCU grace period); here
        that is spent while the command runs, not after its result."""
        if self.waiter is not None:
            self.waiter.close()

    def end_lost(self, child: Child) -> None:
        """Our keeper was killed: end the command's processes ourselves (TERM,
        grace, KILL; also those that left its group) -- they are not our
        children, and they hold the slot until they are gone."""
        cmd = child.cmd_pid if child.cmd_pid and child.cmd_pid > 0 else None
        # The session only if we saw its leader alive: a pid is not reused
        # while it names a session, but one seen never may be another's.
        session = cmd if child.cmd_start is not None else None
        from .orphans import end_lost

        ended = end_lost(session, child.cmd_start, self.spec.run_id, self.grace)
        who = f"the command's supervisor (slotq keeper, pid {child.keeper_pid}) was killed"
        if child.started is not None or ended:
            what = f"pid {cmd}" if cmd else "its processes"
            self.lost_message = (f"{who} after the command started ({what}); slotq ended the command "
                                 f"({len(ended)} process(es)) before releasing the slot")
        else:
            self.lost_message = f"{who} before the command started; nothing ran"

    def pump(self, child: Child, streams: dict[int, bytes], limit: float) -> tuple[ChildEnd, Outcome | None]:
        return pump(self.link, self.clock, child, streams, limit, self.end_lost)

    def pump_command(self, child: Child, streams: dict[int, bytes], started: float) -> tuple[ChildEnd,
                                                                                           Outcome | None]:
        """The command's output under its budget, which counts from
        `started` (the monotonic time the command started, wherever it was
        started: here, before the runner was loaded, or in a standby
        keeper) -- the one place the budget's start is decided."""
        return self.pump(child, streams, self.budget - max(0.0, self.clock.monotonic() - started))

    def judge(self, end: ChildEnd, reason: Outcome | None) -> tuple[Outcome, str]:
        ran = verdict.Ran(self.spec.argv[0], self.host, self.budget, self.phases["slot"], self.phases["started"],
                          self.allocation, self.lost_message)
        return verdict.judge(end, reason, self.link, ran)

    def finish(self, outcome: Outcome, end: ChildEnd | None, lease: SlotLease | None, message: str) -> Outcome:
        """The run's end, whatever the path: the slot released, the result
        sent (`exited`), the history line written."""
        spec = self.spec
        if lease is None or lease.fd < 0:
            yield_cpu()  # the slot is free already
        self.phases["ended"] = self.clock.wall()
        if lease is not None:
            lease.release()  # (if still ours) the group is gone: the slot is free before we say so
        if self.link.gone and outcome not in (Outcome.CALLER_GONE,):
            # Nobody heard the result; the history says what happened.
            message = f"{message} (caller gone before the result)"
        p = self.phases
        exit_code = end.exit_code if end is not None and not end.lost and not end.setup_error else None
        record = history.run_record(run_id=spec.run_id, label=spec.label, cls=spec.cls, host=self.host,
                                    pool=self.config.classes.get(spec.cls), slot=self.slot, ticket=self.ticket_seq(),
                                    budget=self.budget, kept=spec.kept, outcome=outcome.value, exit_code=exit_code,
                                    message=message, phases=dict(p))
        # not_started: the command could not be started (not found, not
        # executable); -q still says so, as a shell would.
        self.link.event(protocol.EXITED, outcome=outcome.value, exit_code=exit_code,
                        signal=end.signal if end is not None else None, message=message, phases=dict(p),
                        **({"not_started": True} if end is not None and end.exec_errno is not None else {}))
        # The result is out: end the stream now, then the history line. If
        # we die before it is written (the caller killed just now, and this
        # thread with it), our keeper, still waiting for our word, writes it.
        self.link.close_stream()
        history.append(self.state_dir, record)
        self.launch.recorded()
        self.close_waiter()
        return outcome
