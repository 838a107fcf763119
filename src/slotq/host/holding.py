"""A run with its slot: the hand-over to the command, an optional prepare
step, the command streamed under its budget (from its start), its end
judged and recorded (HostRun.finish). Three ways in: a lease our runner
got (`hold`), a command launch.start_now started before the runner was
loaded (`carry`), a standby keeper that got the slot and started it
(`run_started`)."""

from __future__ import annotations

from .. import procinfo, protocol
from ..durations import format_duration
from ..outcome import WHILE_PREPARING, Outcome
from . import verdict
from .child import Child
from .hostrun import HostRun
from .slot import SlotLease


def hold(run: HostRun, lease: SlotLease) -> Outcome:
    """Start the command on `lease`; with a prepare step, that first."""
    run.slot = lease.name
    if run.spec.prepare:
        return _prepare_then_run(run, lease, run.spec.prepare)
    # The hand-over path: start the command first, then the bookkeeping
    # (times were taken before), so the command starts as soon after the
    # release as we can make it.
    try:
        child, streams, events = run.launch.start_holding(lease, run.waiter)
    except OSError as e:
        return run.finish(Outcome.UNAVAILABLE, None, lease, f"cannot start the command: {e.strerror}")
    return carry(run, lease, child, streams, events)


def carry(run: HostRun, lease: SlotLease, child: Child, streams: dict[int, bytes], events: bytes) -> Outcome:
    """The command Launch.start_holding started: say so, stream its
    output under its budget (from its start), judge and record its end."""
    try:
        run.link.send(events)
        run.close_waiter()
        end, reason = run.pump_command(child, streams, run.launch.started_at)
    except OSError as e:
        return run.finish(Outcome.UNAVAILABLE, None, lease, f"cannot start the command: {e.strerror}")
    outcome, message = run.judge(end, reason)
    return run.finish(outcome, end, lease, message)


def run_started(run: HostRun, child: Child, streams: dict[int, bytes], slot: str) -> Outcome:
    """A standby keeper got the slot and started the command."""
    assert child.started is not None
    wall, mono = child.started
    run.phases["slot"] = run.phases["started"] = wall
    run.slot = slot
    run.leave_line()
    run.link.send(run.launch.slot_events(slot, wall, run.ticket_seq()))
    run.close_waiter()
    end, reason = run.pump_command(child, streams, mono)  # started in the keeper
    outcome, message = run.judge(end, reason)
    return run.finish(outcome, end, None, message)


def _prepare_then_run(run: HostRun, lease: SlotLease, prepare: str) -> Outcome:
    """The slot's prepare step (`--prepare`, under its own limit), then the
    command if it passed."""
    spec = run.spec
    wall = run.phases["slot"] or run.clock.wall()  # (a late-bound run's: when it was offered, runner._offer)
    run.phases["slot"] = wall
    waited = wall - (run.phases["submitted"] or wall)
    record = run.launch.holder_record("prepare", run.ticket_seq())
    record["since"] = wall
    slot_event = protocol.event_frame(protocol.SLOT, wall, slot=lease.name, waited_s=round(waited, 3),
                                      budget=run.budget, ticket=run.ticket_seq())
    try:
        lease.record(**record)  # before we leave the line: the next head must not see a stale one
        run.leave_line()
        run.link.send(slot_event)
        run.close_waiter()
        limit = spec.prepare_timeout if spec.prepare_timeout is not None else run.config.prepare_timeout
        child, streams = run.launch.start(["/bin/sh", "-c", prepare], lease, last=False)
        lease.record(keeper=child.keeper_pid, keeper_start=procinfo.start_ticks(child.keeper_pid))
        end, reason = run.pump(child, streams, limit)
        if end.lost:  # the prepare step's keeper was killed: not the work's failure
            return run.finish(Outcome.UNAVAILABLE, None, lease, run.lost_message or "keeper killed")
        if end.setup_error:
            return run.finish(Outcome.UNAVAILABLE, None, lease, run.judge(end, None)[1])
        run.phases["prepared"] = run.clock.wall()
        ok = reason is None and end.exec_errno is None and end.exit_code == 0
        run.link.event(protocol.PREPARED, ok=ok, exit_code=end.exit_code)
        if reason is not None and reason is not Outcome.EXEC_TIMEOUT and end.stopped:
            message = verdict.stop_message(run.link, reason, WHILE_PREPARING)
            return run.finish(reason, end, lease, message or "stopped during the prepare step")
        if not ok:
            why = (f"prepare step ran past its limit of {format_duration(limit)}"
                   if reason is Outcome.EXEC_TIMEOUT else f"prepare step exited {end.exit_code}")
            return run.finish(Outcome.PREPARE_FAILED, end, lease, why)
        run.phases["started"], started = run.clock.wall(), run.clock.monotonic()
        child, streams = run.launch.start(spec.argv, lease, last=True, record=dict(lease.info, phase="running"))
        run.link.event(protocol.STARTED, budget=run.budget)
        end, reason = run.pump_command(child, streams, started)
    except OSError as e:
        return run.finish(Outcome.UNAVAILABLE, None, lease, f"cannot start the command: {e.strerror}")
    outcome, message = run.judge(end, reason)
    return run.finish(outcome, end, lease, message)
