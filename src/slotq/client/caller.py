"""The client: launches a host runner through a transport, relays its output,
keeps the client-side clocks, and turns the stream into a `RunResult`.

Client clocks, each started at the moment it should be:
- the backstop (budget + 90 s) is created when the `slot` event arrives, and
  moved later by the time a prepare step took;
- the no-output watchdog (`idle`) is armed when `started` arrives and reset
  by every output frame. Quiet time before the command starts never counts.
The queue itself has no limit here: waiting is not executing.
"""

from __future__ import annotations

import os
import select

from .. import protocol
from .. import signals as signal
from ..clock import INF, Clock, Timer
from ..durations import format_duration, seconds_in
from ..errors import HostUnavailable, ProtocolError, SlotqError, StateDirError, UsageError, WorkTreeError
from ..outcome import WHILE_PREPARING, WHILE_RUNNING, WHILE_WAITING, Outcome, exit_code_for
from ..spec import RunSpec
from ..transports.base import Transport

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .ledger import WaitRecorder

BACKSTOP_MARGIN = 90.0
# A quiet run's host does not report while it is far back in line: the
# caller refreshes its open wait record itself, this often (a killed
# waiter's wait ends at its last refresh).
HEARTBEAT_S = 30.0
PHASES = ("submitted", "transferred", "slot", "prepared", "started", "ended")


class Watchdogs:
    """The client's timers, as pure logic over a clock."""

    def __init__(self, clock: Clock, idle: float | None, margin: float = BACKSTOP_MARGIN) -> None:
        self.clock = clock
        self.idle = idle
        self.margin = margin
        self.backstop: Timer | None = None
        self.idle_timer: Timer | None = None

    def on_slot(self, budget: float) -> None:
        self.backstop = self.clock.timer("backstop", budget + self.margin)

    def on_prepared(self, took: float) -> None:
        if self.backstop is not None:
            self.backstop.extend(took)  # the prepare step has its own limit

    def on_started(self) -> None:
        if self.idle is not None:
            self.idle_timer = self.clock.timer("idle", self.idle)

    def on_output(self) -> None:
        t = self.idle_timer
        if t is not None and self.idle is not None:
            t.extend(self.clock.monotonic() + self.idle - t.deadline)

    def next_deadline(self) -> float:
        return min((t.deadline for t in (self.backstop, self.idle_timer) if t is not None), default=INF)

    def expired(self) -> Outcome | None:
        """The outcome whose clock ran out, if any. The idle watchdog fires
        once (the runner is then asked to stop the command)."""
        now = self.clock.monotonic()
        if self.backstop is not None and self.backstop.remaining(now) <= 0:
            return Outcome.BACKSTOP
        if self.idle_timer is not None and self.idle_timer.remaining(now) <= 0:
            self.idle_timer = None
            return Outcome.IDLE_TIMEOUT
        return None


class RunResult:
    """How one run ended. `phases` holds wall-clock epoch seconds (host
    clock, `submitted` from the client), None when never reached."""

    def __init__(self, spec: RunSpec, host: str) -> None:
        self.outcome = Outcome.UNAVAILABLE
        self.command_code: int | None = None
        self.run_id = spec.run_id
        self.label = spec.label
        self.cls = spec.cls
        self.host = host
        self.message = ""
        self.phases: dict[str, float | None] = dict.fromkeys(PHASES)
        self.slot: str | None = None
        self.ticket: int | None = None  # the host's sequence number: the order its queue keeps
        self.budget = spec.budget
        self.transport: dict[str, object] = {}
        self.details: Callable[[], dict[str, object]] = dict  # the transport's extra fields (Slurm's job)
        # Measured on the client's monotonic clock: host clocks may differ.
        self.transfer_s: float | None = None
        self.queue_s: float | None = None
        self.open_line = False  # the command's stdout ended without a newline
        self.not_started = False  # the command could not be started (not found, not executable)

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.outcome, self.command_code)

    @property
    def said_when_quiet(self) -> bool:
        """-q silences progress, not an ending slotq decided, nor a command
        that could not be started (no output of its own says why)."""
        return self.outcome.decided_by_slotq or self.not_started

    @property
    def blame(self) -> str:
        return self.outcome.blame

    @property
    def waited_s(self) -> float | None:
        """Time in the host's queue, until the slot (or the end, without one)."""
        return None if self.queue_s is None else round(self.queue_s, 3)

    @property
    def ran_s(self) -> float | None:
        start, end = self.phases["started"], self.phases["ended"]
        return round(max(0.0, end - start), 3) if start is not None and end is not None else None

    def to_dict(self) -> dict[str, object]:
        return {
            "outcome": self.outcome.value, "blame": self.blame, "exit_code": self.exit_code,
            "command_exit_code": self.command_code, "run_id": self.run_id, "label": self.label,
            "class": self.cls, "host": self.host, "slot": self.slot, "ticket": self.ticket, "budget": self.budget,
            "message": self.message, "phases": dict(self.phases),
            "waited_s": self.waited_s, "ran_s": self.ran_s,
            "transfer_s": None if self.transfer_s is None else round(self.transfer_s, 3),
            "transport": self.transport, **self.details(),
        }

    def to_json(self) -> str:
        import json

        return json.dumps(self.to_dict(), indent=2)


def _write_line(fd: int, line: str) -> None:
    try:
        os.write(fd, (line + "\n").encode())
    except OSError:
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[n:]



def run(
    spec: RunSpec,
    transport: Transport,
    *,
    idle: float | None = None,
    clock: Clock | None = None,
    stdout_fd: int = 1,
    stderr_fd: int = 2,
    status: Callable[[str], None] | None = None,
    handle_sigint: bool = False,
    backstop_margin: float = BACKSTOP_MARGIN,
    credit_dir: str | None = None,
    ledger_path: str | None = None,
    live: Callable[[str], None] | None = None,
    heartbeat_every: float = HEARTBEAT_S,
) -> RunResult:
    """Run `spec` and return its result. Output goes to `stdout_fd` /
    `stderr_fd` byte-exact; status lines to `status` (None: silent).

    `live` (a terminal's one updated line): where the waiting lines go
    instead of `status`, in a short form.

    `backstop_margin` is the grace past the budget before the client gives
    up on a silent host (90 s; tests shorten it).

    The time until the slot is recorded in the wait ledger (`ledger_path`,
    default `$SLOTQ_LEDGER` / the user's) under `credit_dir` (default: the
    run's work dir), for outer task runners to credit. A quiet run
    (`spec.quiet`: its host reports only at the head of the line) refreshes
    that record itself every `heartbeat_every` seconds.

    Raises UsageError when the host rejects the request as malformed (an
    unknown class); every other ending is a `RunResult`.
    """
    clock = clock or Clock()
    say = status or _silent
    result = RunResult(spec, transport.host)
    result.details = transport.details
    result.phases["submitted"] = transport.queued_since or clock.wall()
    dogs = Watchdogs(clock, idle, backstop_margin)
    workdir = credit_dir or spec.cwd or os.getcwd()
    made: list[WaitRecorder] = []

    def waits() -> WaitRecorder:
        """The run's wait recorder, made at its first wait: an uncontended
        local run never imports the ledger (nor SQLite, which only reading
        the ledger does)."""
        if not made:
            from .ledger import WaitRecorder

            made.append(WaitRecorder(run_id=spec.run_id, workdir=workdir,
                                     host=transport.host, path=ledger_path,
                                     warn=lambda line: _write_line(stderr_fd, line)))
        return made[0]

    queue_start = clock.monotonic()
    if transport.came_back and transport.queued_since is not None:
        queue_start -= max(0.0, clock.wall() - transport.queued_since)  # in line since, away meanwhile
    stops: list[int] = []  # the stop signals this run was sent (handle_sigint)

    def catch_stops(handler: Callable[[int, object], None]) -> dict[int, object]:
        """Our handler for the stop signals from now on, and those that came
        since slotq's first line (signals.hold_stops) taken as ours."""
        old = signal.catch_stops(handler)
        stops.extend(signal.early)
        signal.early.clear()
        return old

    if transport.remote:
        # Connection, handshake and work tree transfer: a wait of its own
        # kind, never counted as execution. A stop signal meanwhile (Ctrl-C,
        # a harness's SIGTERM) ends the transfer (its rsync is killed) and
        # the run: cancelled, with its result, as later.
        waits().open("transfer", result.phases["submitted"] or clock.wall())
        preparing = [True]

        def stop_transfer(signum: int, frame: object) -> None:
            stops.append(signum)
            if preparing[0]:
                preparing[0] = False
                raise _Stopped

        held = catch_stops(stop_transfer) if handle_sigint else {}
        try:
            if stops:  # one came while slotq started: the run it meant to stop is this one
                raise _Stopped
            transport.prepare(spec)
            preparing[0] = False
        except WorkTreeError:
            preparing[0] = False
            waits().finish(clock.wall())  # the transfer's wait ends here: the caller's error, said as one
            raise
        except (HostUnavailable, _Stopped) as e:
            preparing[0] = False
            if isinstance(e, _Stopped):
                result.outcome = Outcome.CANCELLED
                result.message = (f"cancelled ({signal.stop_name(stops[0])}) before the run reached "
                                  f"host {transport.host} (connecting, or sending the work tree); nothing ran")
            else:
                result.message = str(e)
            result.phases["ended"] = clock.wall()
            result.transfer_s = clock.monotonic() - queue_start
            result.transport = transport.describe()
            waits().finish(clock.wall())
            say(summary_line(result))
            return result
        finally:
            for sig, handler in held.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
        result.phases["transferred"] = clock.wall()
        result.transfer_s = clock.monotonic() - queue_start
        result.transport = transport.describe()
        for note in transport.notes():
            from ..records import printable

            say(f"slotq: warning: {printable(note, 1000)}")
        queue_start = clock.monotonic()
        waits().close(clock.wall())
    # The queue wait is recorded from its start, but written only once the
    # host says the run must wait: an uncontended run (slot at once) costs
    # no ledger write and no SQLite import.
    queue_wall = clock.wall() if transport.remote else result.phases["submitted"] or clock.wall()

    def wait_closer() -> Callable[[float], None]:
        """For a process of the run's host side that outlives us (a local
        standby keeper): how it closes our queue wait. A recorder of its
        own: the runner makes it in its thread, while ours may be making
        `made[0]`."""
        from .ledger import WaitRecorder

        return WaitRecorder(run_id=spec.run_id, workdir=workdir, host=transport.host, path=ledger_path,
                            warn=_silent).closer("queue")

    transport.keep_wait_end(wait_closer)
    if transport.came_back:
        waits().adopt("queue")  # opened before this process waited away (transports/away.py)
    to_fd, from_fd = transport.start(spec)
    decoder = protocol.Decoder()
    exited = False
    seen: set[str] = set()  # event names seen so far

    def cancel(reason: str) -> None:
        """`reason`: an outcome's value, or the stop signal's word
        (signals.stop_word), for the host's history."""
        try:
            os.write(to_fd, f"cancel {reason}\n".encode())
        except OSError:
            pass

    def cancel_for(signum: int) -> None:
        cancel(signal.stop_word(signum) or Outcome.CANCELLED.value)

    old_handlers: dict[int, object] = {}
    if handle_sigint:
        # Ctrl-C, a polite SIGTERM (a CI job being stopped) and SIGHUP (the
        # terminal closed) cancel the run and still deliver its result; the
        # runner ends the command.
        def stop_run(signum: int, frame: object) -> None:
            stops.append(signum)
            cancel_for(signum)

        old_handlers = catch_stops(stop_run)
        if stops:  # one came while slotq started, or after the transfer: it meant this run
            cancel_for(stops[0])
    sinks = {protocol.STDOUT: stdout_fd, protocol.STDERR: stderr_fd}
    beat_at = INF  # when a quiet run refreshes its open queue wait
    turned_down: SlotqError | None = None
    try:
        while True:
            deadline = min(dogs.next_deadline(), beat_at)
            timeout = None if deadline == INF else max(0.0, deadline - clock.monotonic())
            ready, _, _ = select.select([from_fd], [], [], timeout)
            if clock.monotonic() >= beat_at:
                made[0].heartbeat(clock.wall())
                beat_at = clock.monotonic() + heartbeat_every
            fired = dogs.expired()
            if fired is Outcome.BACKSTOP:
                result.outcome = Outcome.BACKSTOP
                slot_at = result.phases["slot"]
                result.message = (f"no result from host {transport.host} within budget + "
                                  f"{backstop_margin:g}s after the slot was acquired"
                                  + (f" (slot at {slot_at:.0f})" if slot_at else ""))
                transport.kill()
                break
            if fired is Outcome.IDLE_TIMEOUT:
                say(f"slotq: no output for {format_duration(idle or 0)}: stopping the command")
                cancel(Outcome.IDLE_TIMEOUT.value)
            if not ready:
                continue
            data = os.read(from_fd, 65536)
            if not data:
                break
            try:
                frames = decoder.feed(data)
                for kind, payload in frames:
                    if kind == protocol.EVENT:
                        _check_sequence(payload, seen)  # type: ignore[arg-type]
            except ProtocolError as e:
                result.outcome = Outcome.UNAVAILABLE
                result.message = f"host {transport.host}: {e}"
                transport.kill()
                break
            for kind, payload in frames:
                if kind in sinks:
                    dogs.on_output()
                    fd = sinks[kind]
                    if fd < 0:
                        continue
                    try:
                        _write_all(fd, payload)  # type: ignore[arg-type]
                        if kind == protocol.STDOUT and payload:
                            result.open_line = not payload.endswith(b"\n")  # type: ignore[union-attr]
                    except OSError as e:
                        # Our reader went away (`slotq run ... | head`): as in
                        # a pipeline, the command's own stream closes (it gets
                        # SIGPIPE/EPIPE and ends its own way); drop the rest.
                        # Any other failure (a full disk) is not silent.
                        sinks[kind] = -1
                        if not isinstance(e, BrokenPipeError):
                            name = "stdout" if kind == protocol.STDOUT else "stderr"
                            _write_line(stderr_fd, f"slotq: warning: cannot write the command's {name} "
                                                   f"({e.strerror or e}): the rest of it is dropped, and the "
                                                   f"command's {name} is closed")
                        try:
                            os.write(to_fd, b"close stdout\n" if kind == protocol.STDOUT else b"close stderr\n")
                        except OSError:
                            pass
                else:
                    ev: dict[str, object] = payload  # type: ignore[assignment]
                    if ev.get("event") == protocol.QUEUED:
                        recorder = waits()
                        if not recorder.opened:
                            recorder.open("queue", queue_wall)
                        recorder.heartbeat(clock.wall())
                        if spec.quiet and recorder.opened:
                            # Far back in a local one-slot line, the host's
                            # standby keeper closes the record if we die:
                            # nothing to refresh, no wake-up until our turn.
                            kept = ev.get("wait_kept") is True and not transport.remote
                            beat_at = INF if kept else clock.monotonic() + heartbeat_every
                    elif ev.get("event") == protocol.AWAY:  # wait away as a shell (host/away.py), if we can
                        if made and made[0].opened:
                            transport.go_away(ev, recorder=made[0], stops=stops)  # returns only if we stay
                        _write_line(to_fd, "stay")
                    elif ev.get("event") == protocol.SLOT:
                        now = clock.wall()
                        end = _wait_end(ev, queue_wall, now, transport.remote)
                        if made:
                            made[0].close(end)
                        beat_at = INF
                        result.queue_s = max(0.0, clock.monotonic() - queue_start - (now - end))
                    exited = _on_event(ev, result, dogs, say, spec, live) or exited
    except (UsageError, StateDirError) as e:
        turned_down = e
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        try:
            os.close(to_fd)
        except OSError:
            pass
        os.close(from_fd)
    if turned_down is not None:
        # The host turned the request down (a bad class or partition, Slurm
        # refusing the job, an unusable state dir) and its side is over: the
        # transport still ends its part, as after any run -- Slurm's sentinel
        # is told `done` (else it took our exit for a vanished caller and
        # wrote that in the history) -- and an open wait ends now.
        if made:
            made[0].finish(clock.wall())
        transport.wait()
        raise turned_down
    if made:
        made[0].finish(clock.wall())  # a run that ended without a slot: its wait ends now
    if result.queue_s is None:
        result.queue_s = clock.monotonic() - queue_start
    diagnostics = transport.wait()
    if not exited and result.outcome is Outcome.UNAVAILABLE and not result.message:
        result.message = f"host runner on {transport.host} ended without a result"
        if diagnostics:
            result.message += f": {diagnostics.strip().splitlines()[-1]}"
        note = transport.after_loss(spec.run_id)
        if note:
            result.message += f"; on the host, {note}"
    if result.phases["ended"] is None:
        result.phases["ended"] = clock.wall()
    if result.outcome is Outcome.IDLE_TIMEOUT and idle is not None:
        # The watchdog is ours (the host only heard "stop"): say what it saw.
        result.message = f"no output for {format_duration(idle)} after the command started (--idle): stopped"
    elif (result.outcome is Outcome.CANCELLED and stops and exited and "cancelled by slotq cancel" not in result.message
          and f"({signal.stop_name(stops[0])}" not in result.message):
        # Our cancel, for a stop signal, from a host that did not name it
        # (an older slotq there, of the same protocol): which, and when.
        name = signal.stop_name(stops[0])
        phase = (WHILE_RUNNING if result.phases["started"] else WHILE_PREPARING if result.phases["slot"]
                 else WHILE_WAITING)
        result.message = f"cancelled ({name}) {phase}"
    say(summary_line(result))
    return result


# Outcomes that say the command ran: never believed unless the host showed
# the command starting.
_RAN = {Outcome.PASSED, Outcome.FAILED, Outcome.EXEC_TIMEOUT, Outcome.IDLE_TIMEOUT}


def _check_sequence(ev: dict[str, object], seen: set[str]) -> None:
    """The order of events: hello first, nothing after exited; an outcome
    that says the command ran only after `started` (a host cannot report
    `passed` for a command it never started)."""
    name = str(ev.get("event"))
    if not seen and name != protocol.HELLO:
        raise ProtocolError(f"the host runner's stream began with {name!r}, not hello")
    if protocol.EXITED in seen:
        raise ProtocolError("the host runner sent more after its final event")
    if name == protocol.EXITED and Outcome(str(ev["outcome"])) in _RAN and protocol.STARTED not in seen:
        raise ProtocolError(f"the host runner reported {ev['outcome']!r} for a command it never showed starting")
    seen.add(name)


def collect_from_now_on() -> None:
    """Garbage collection back on, once the run waits or its command runs
    (bin/slotq starts with it off: collections walking the objects slotq's
    imports make cost about 1 ms of every run, and those objects live as
    long as the process). What exists now is frozen first: collections
    from here on walk only what is made later -- and never write to the
    pages a forked keeper shares with us."""
    import gc

    if not gc.isenabled():
        gc.freeze()
        gc.enable()


class _Stopped(Exception):
    """A stop signal during a remote run's transfer (raised by its handler)."""


def _silent(line: str) -> None:
    """Where status lines go with -q."""


def _wait_end(ev: dict[str, object], start: float, now: float, remote: bool) -> float:
    """When a queue wait ended (the ledger's record, and `waited_s`): the
    host's own time of the slot, where the host's clock is ours (this
    machine), else now. Now alone would count the time this caller took to
    read the event (a busy machine, a stopped caller) as waiting, and
    credit it to an outer task."""
    at = ev.get("at")
    if remote or not isinstance(at, (int, float)) or isinstance(at, bool) or not start <= at <= now:
        return now
    return float(at)


def _on_event(ev: dict[str, object], result: RunResult, dogs: Watchdogs,
              say: Callable[[str], None], spec: RunSpec, live: Callable[[str], None] | None = None) -> bool:
    """Apply one event; True when it is the final `exited`."""
    name = ev.get("event")
    at = ev.get("at")
    at = float(at) if isinstance(at, (int, float)) else None
    if name in (protocol.QUEUED, protocol.STARTED):
        collect_from_now_on()
    if name == protocol.QUEUED:
        if live is not None or say is not _silent:  # (-q: a report every 30 s, formatted for nobody)
            from .waitlines import format_queued

            if live is not None:
                live(format_queued(ev, compact=True))
            else:
                say(format_queued(ev))
    elif name == protocol.SLOT:
        result.phases["slot"] = at
        result.slot = str(ev.get("slot"))
        ticket = ev.get("ticket")
        result.ticket = ticket if isinstance(ticket, int) else None
        budget = seconds_in(ev.get("budget"))
        result.budget = budget
        dogs.on_slot(budget)
        waited = result.waited_s or 0.0
        say(f"slotq: slot {result.slot} acquired after {format_duration(waited)}"
            + (f" (budget {format_duration(budget)} starts with the command)" if budget else ""))
    elif name == protocol.PREPARED:
        result.phases["prepared"] = at
        if at is not None and result.phases["slot"] is not None:
            dogs.on_prepared(at - result.phases["slot"])
    elif name == protocol.STARTED:
        result.phases["started"] = at
        dogs.on_started()
    elif name == protocol.EXITED:
        result.outcome = Outcome(str(ev.get("outcome")))
        code = ev.get("exit_code")
        result.command_code = code if isinstance(code, int) else None
        result.message = str(ev.get("message") or "")
        result.not_started = ev.get("not_started") is True
        phases = ev.get("phases")
        if isinstance(phases, dict):
            for k in ("slot", "prepared", "started", "ended"):
                if isinstance(phases.get(k), (int, float)):
                    result.phases[k] = float(phases[k])
        return True
    elif name == protocol.ERROR:
        from ..records import printable

        message = printable(ev.get("message") or "error", 2000)
        if ev.get("kind") == "usage":
            raise UsageError(message)
        if ev.get("kind") == "state":
            # The host's state directory is unusable (missing, full, read-only,
            # an odd file in it): exit 73, as documented.
            raise StateDirError(f"host {result.host}: {message}", result.host)
        result.outcome = Outcome.UNAVAILABLE
        result.message = f"host {result.host}: {message}"
    elif name == protocol.HELLO:
        from ..records import printable

        for w in ev.get("warnings") or []:  # type: ignore[attr-defined]
            say(f"slotq: warning: {printable(w, 1000)}")
    return False


def summary_line(result: RunResult) -> str:
    waited = result.waited_s
    ran = result.ran_s
    bits = [f"slotq: {result.outcome.value}"]
    if result.outcome in (Outcome.PASSED, Outcome.FAILED) and result.command_code is not None:
        bits[0] += f" (exit {result.command_code})"
    bits.append(f"waited {format_duration(waited) if waited is not None else '-'}")
    bits.append(f"ran {format_duration(ran) if ran is not None else '-'}")
    line = ", ".join(bits)
    if result.outcome not in (Outcome.PASSED,) and result.message:
        from ..records import printable

        line += f" — {printable(result.message, 4000)}"
    return line
