"""Starting a run's command under its keeper (process.py), with what the
host keeps about it: the holder record of its slot, the slot's environment
for the command, the history line its keeper writes if the runner vanishes,
and the ack pipe on which the runner says it wrote that line itself.

One `Launch` per run: the runner (runner.py) starts its prepare step, its
command or its standby keeper through it, and acks or reaps the keepers at
the end.

`start_now`: a local `slotq run` whose ticket is the head of its line and
whose slot is free starts its command here, before its runner is loaded:
the keeper's fork and set-up (a millisecond or two) then overlap the
runner's loading instead of following it. The runner, once loaded,
carries the run on (`Early`); a run found in line waits with the waiter
that found it.
"""

from __future__ import annotations

import os

from .. import procinfo, protocol
from ..clock import Clock
from ..config import HostConfig
from ..durations import exact
from ..record import HOST_PHASES
from ..errors import SlotqError
from ..spec import RunSpec
from .hostqueue import Waiter
from .process import Books, Command, KeeperPlan, Standby, Streams, spawn
from .slot import SlotLease, slot_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .child import Child
    from .ticket import Ticket


class Launch:
    def __init__(self, spec: RunSpec, *, state_dir: str, config: HostConfig, host: str,
                 clock: Clock | None = None) -> None:
        self.spec = spec
        self.state_dir = state_dir
        self.host = host
        self.clock = clock or Clock()
        self.budget = spec.budget if spec.budget is not None else config.budget
        self.grace = spec.kill_grace if spec.kill_grace is not None else config.kill_grace
        self.started_at = 0.0  # (monotonic) just before the keeper that starts the command was forked
        self.phases: dict[str, float | None] = dict.fromkeys(HOST_PHASES)
        self.slot_path: str | None = None  # the slot our command holds
        self.ack_w = -1  # a byte here tells our keeper we wrote the history line
        self.children: list[Child] = []  # keepers to reap at the end

    def start(self, argv: list[str], lease: SlotLease | None, last: bool,
              record: dict[str, object] | None = None, wait_for: str | None = None,
              ticket: Ticket | None = None,
              wait_end: Callable[[float], None] | None = None) -> tuple[Child, dict[int, bytes]]:
        """Start argv under a keeper; its output streams are returned.

        With `last`, the lease passes to the command: once the holder
        record is written we close our copy of the lock, so the slot is free
        the moment the command's last process is gone, not after our
        bookkeeping (a faster hand-over, and still never while any of it
        runs)."""
        spec = self.spec
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        if wait_for is not None:  # the keeper writes the holder record once it has the slot
            record = self.holder_record("running", ticket.seq if ticket is not None else None)
        elif lease is not None and record is not None:
            # Who holds the slot, before anything is started: a record that
            # names a live runner is never taken for an orphan's. The keeper
            # completes it (its own and the command's pid).
            lease.record(**record)
        ack_r = -1
        if last:
            self.slot_path = wait_for or (lease.path if lease is not None and lease.fd >= 0 else None)
            ack_r, self.ack_w = os.pipe()
        if lease is not None:
            pool, index, name = lease.pool, lease.index, lease.name
        else:  # a standby keeper: the slot it waits for (slots/<pool>.<n>)
            pool, _, n = os.path.basename(wait_for or "").rpartition(".")
            index = int(n) if n.isdigit() else 0
            name = slot_name(pool, index)
        # What the command knows of its slot (a per-slot port or database).
        slot_env = {"SLOTQ_POOL": pool or spec.cls, "SLOTQ_SLOT": name, "SLOTQ_SLOT_INDEX": str(index),
                    "SLOTQ_BUDGET": _seconds(self.budget)}
        run: dict[str, object] = {"run_id": spec.run_id, "label": spec.label, "class": spec.cls, "host": self.host,
                                  "pool": pool, "slot": name, "budget": self.budget, "kept": spec.kept,
                                  "ticket": (record or {}).get("ticket"), "phases": dict(self.phases)}
        plan = KeeperPlan(
            Command(argv, spec.cwd, spec.env, spec.run_id, slot_env, self.grace),
            Streams(out_w, err_w, inherit_fds=(lease.fd,) if lease is not None and lease.fd >= 0 else ()),
            Standby(wait_for, (ticket.fd, ticket.path, ticket.seq) if ticket is not None else None,
                    spec.report_every if spec.quiet and ticket is not None else None,
                    (self.state_dir, pool)) if wait_for else None,
            Books(record if last else None, self.slot_path if last else None, (self.state_dir, run),
                  ack_r if last else None, wait_end))
        try:
            child = spawn(plan)
        except OSError:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            if last:
                os.close(self.ack_w)
                self.ack_w = -1
            raise
        finally:
            if ack_r >= 0:
                os.close(ack_r)
        self.children.append(child)
        if ticket is not None:
            ticket.hand_over()  # the keeper holds our place now
        if lease is not None and last:
            lease.release()
        return child, {out_r: protocol.STDOUT, err_r: protocol.STDERR}

    def start_holding(self, lease: SlotLease, waiter: Waiter | None) -> tuple[Child, dict[int, bytes], bytes]:
        """Start the command on `lease` (no prepare step): the slot passes
        to it, and the run leaves its line (`waiter`). Returns its keeper,
        its output streams, and the events that say so (`slot`, `started`)
        for the runner to send. Raises OSError if no keeper could be forked."""
        wall = self.clock.wall()
        slot_at = self.phases["slot"] or wall  # a late-bound run's slot was offered before: runner._offer
        self.phases["slot"], self.phases["started"] = slot_at, wall
        record = self.holder_record("running", waiter.ticket.seq if waiter else None)
        record["since"] = wall
        events = self.slot_events(lease.name, wall, waiter.ticket.seq if waiter else None, slot_at)
        self.started_at = self.clock.monotonic()
        child, streams = self.start(self.spec.argv, lease, last=True, record=record)
        if waiter is not None:
            waiter.leave()
        return child, streams, events

    def slot_events(self, slot: str, wall: float, ticket: int | None, slot_at: float | None = None) -> bytes:
        """The `slot` and `started` events of a command started at `wall`
        on `slot` (no prepare step), its slot acquired at `slot_at`
        (default: then), for the caller."""
        slot_at = wall if slot_at is None else slot_at
        waited = slot_at - (self.phases["submitted"] or slot_at)
        return (protocol.event_frame(protocol.SLOT, slot_at, slot=slot, waited_s=round(waited, 3),
                                     budget=self.budget, ticket=ticket)
                + protocol.event_frame(protocol.STARTED, wall, budget=self.budget))

    def holder_record(self, phase: str, ticket: int | None) -> dict[str, object]:
        """What the slot's holder record says of the run (`slotq status`, and
        the history line of an orphan healed: host/orphans.py)."""
        spec = self.spec
        record = {"run_id": spec.run_id, "label": spec.label, "pid": os.getpid(), "pid_start": procinfo.own_start(),
                  "uid": os.getuid(), "phase": phase, "budget": self.budget, "grace": self.grace, "cls": spec.cls,
                  "host": self.host, "ticket": ticket}
        if spec.kept is not None:
            record["kept"] = spec.kept  # a kept run's lease (host/kept.py), for `slotq status`
        return record

    def recorded(self) -> None:
        """The run's history line is written: the keeper need not write it."""
        if self.ack_w >= 0:
            try:
                os.write(self.ack_w, b"1")
            except OSError:
                pass  # the keeper is gone (killed): nobody to tell
            os.close(self.ack_w)
            self.ack_w = -1

    def end(self) -> None:
        """The runner is done: a keeper not told the run was recorded writes
        its history line itself (end-of-file without a byte); every keeper
        is reaped."""
        if self.ack_w >= 0:
            os.close(self.ack_w)
            self.ack_w = -1
        for child in self.children:
            child.reap()


class Early:
    """What `start_now` did, for the run's runner to carry on: the run's line
    (`waiter`, its first look taken) and, if its slot was free, the slot
    (`lease`, passed to the command), its `Launch`, and the keeper, output
    streams and events `start_holding` returned -- no keeper (`child` None)
    if none could be forked: the runner then tries again, and says why if it
    fails. Without a lease the run is in line, and its runner waits with
    `waiter` (a line of a thousand is listed once, not twice)."""

    __slots__ = ("launch", "waiter", "lease", "child", "streams", "events")

    def __init__(self, waiter: Waiter, lease: SlotLease | None = None, launch: Launch | None = None) -> None:
        self.waiter = waiter
        self.lease = lease
        self.launch = launch
        self.child: Child | None = None
        self.streams: dict[int, bytes] = {}
        self.events = b""


def start_now(spec: RunSpec, config: HostConfig, state_dir: str, ticket: Ticket) -> Early | None:
    """Start the run's command now if `ticket` -- the run's place, just
    taken -- is the head of its line and a slot of its pool is free. For a
    caller whose runner will be a thread of its own process
    (LocalTransport.start_early), before it loads that runner.

    None when nothing was done, and the ticket is still the caller's: a
    prepare step (its slot event comes before it), a run started inside
    another (its admission is the runner's to judge), a work dir that is
    not there, an error -- the runner then goes its usual way, and says
    what is wrong. A ticket ahead or a slot taken: an Early without a
    lease, whose waiter the runner waits with."""
    if spec.prepare or os.environ.get(procinfo.MARKER) or (spec.cwd is not None and not os.path.isdir(spec.cwd)):
        return None
    # (Without the marker, a Waiter given a ticket of its pool cannot refuse it.)
    waiter = Waiter(state_dir, config, ticket.pool, ticket.info, defer_leave=True, ticket=ticket)
    try:
        lease = waiter.attempt(watch=False)
    except (OSError, SlotqError):
        waiter.close()  # (not the ticket: the runner looks again, and says what is wrong)
        return None
    if lease is None:
        return Early(waiter)
    launch = Launch(spec, state_dir=state_dir, config=config, host=os.uname().nodename)
    since = ticket.info.get("since")
    launch.phases["submitted"] = since if isinstance(since, float) else launch.clock.wall()
    early = Early(waiter, lease, launch)
    try:
        early.child, early.streams, early.events = launch.start_holding(lease, waiter)
    except OSError:
        pass
    return early


def _seconds(value: float) -> str:
    """A number of seconds for a command's environment: `90` (shell
    arithmetic reads it), `0.5`, `1036800` -- never `1.0368e+06`."""
    return str(int(value)) if value == int(value) else exact(value)[:-1]
