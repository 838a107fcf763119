"""The client: launches a host runner through a transport, relays its output,
keeps the client-side clocks (watchdogs.py), and turns the stream into a
`RunResult` (result.py)."""

from __future__ import annotations

import os
import select

from .. import protocol
from .. import signals as signal
from ..clock import INF, Clock
from ..durations import format_duration
from ..errors import HostUnavailable, ProtocolError, StateDirError, UsageError, WorkTreeError
from ..outcome import WHILE_PREPARING, WHILE_RUNNING, WHILE_WAITING, Outcome
from ..spec import RunSpec
from ..transports.base import Transport
from .events import check_sequence, on_event, silent, wait_end
from .result import RunResult, adopt_request, kept_wait, summary_line
from .watchdogs import BACKSTOP_MARGIN, Watchdogs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .ledger import WaitRecorder

# A quiet run's host does not report while it is far back in line: the
# caller refreshes its open wait record itself, this often (a killed
# waiter's wait ends at its last refresh).
HEARTBEAT_S = 30.0


def _write_line(fd: int, line: str) -> None:
    try:
        os.write(fd, (line + "\n").encode())
    except OSError:
        pass



class CallOptions:
    """How a caller runs: `run`'s keyword arguments, read-only. (A plain
    class: `dataclasses` would cost every `slotq run` its import.)"""

    __slots__ = ("idle", "stdout_fd", "stderr_fd", "status", "handle_sigint", "backstop_margin", "credit_dir",
                 "ledger_path", "live", "heartbeat_every", "kept", "interrupt", "others_as_data")

    def __init__(self, idle: float | None = None, stdout_fd: int = 1, stderr_fd: int = 2,
                 status: Callable[[str], None] | None = None, handle_sigint: bool = False,
                 backstop_margin: float = BACKSTOP_MARGIN, credit_dir: str | None = None,
                 ledger_path: str | None = None, live: Callable[[str], None] | None = None,
                 heartbeat_every: float = HEARTBEAT_S) -> None:
        self.idle = idle
        self.kept = False
        self.stdout_fd = stdout_fd
        self.stderr_fd = stderr_fd
        self.status = status
        self.handle_sigint = handle_sigint
        self.backstop_margin = backstop_margin
        self.credit_dir = credit_dir
        self.ledger_path = ledger_path
        self.live = live
        self.heartbeat_every = heartbeat_every
        self.interrupt: Interrupt | None = None  # another thread's stop (call())
        # Status lines for a model to read (the MCP server): what other users
        # wrote -- labels, process names -- is left out (waitlines.py).
        self.others_as_data = False

    def attach_only(self) -> None:
        """The run is a kept run (host/kept.py) this caller attaches to: the
        run's host side keeps its clocks and its wait record; the caller only
        shows it, and may leave (`detached`)."""
        self.kept = True
        self.idle = None
        self.backstop_margin = INF


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

    A transport to a kept run (`transport.kept`: transports/kept.py) makes
    this caller an attacher: the run's host side keeps the clocks and the
    wait record, and a stop signal makes the caller leave it (outcome
    `detached`), never cancels it.

    Raises UsageError when the host rejects the request as malformed (an
    unknown class); every other ending is a `RunResult`.
    """
    options = CallOptions(idle, stdout_fd, stderr_fd, status, handle_sigint, backstop_margin, credit_dir,
                          ledger_path, live, heartbeat_every)
    return call(spec, transport, options, clock)


def call(spec: RunSpec, transport: Transport, options: CallOptions, clock: Clock | None = None) -> RunResult:
    """`run` with its options as one object: for a caller in a thread of a
    server (the MCP server: cli/mcp.py), whose `options.interrupt` stops the
    run from another thread."""
    if transport.kept:
        options.attach_only()
    return _Call(spec, transport, options, clock or Clock()).run()


class Interrupt:
    """Stop a run from another thread, as a stop signal would: a kept run
    is left (`detached`, it goes on), any other cancelled. Fired before the
    run has started, it is sent as soon as the run starts."""

    def __init__(self) -> None:
        import _thread

        self._lock = _thread.allocate_lock()
        self._fd = -1
        self.fired = False

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            self._send()

    def bind(self, fd: int) -> None:
        with self._lock:
            self._fd = fd
            if self.fired:
                self._send()

    def unbind(self) -> None:
        with self._lock:
            self._fd = -1

    def _send(self) -> None:
        if self._fd >= 0:
            try:
                os.write(self._fd, f"cancel {Outcome.CANCELLED.value}\n".encode())
            except OSError:
                pass


class _Call:
    """One run, as its caller lives it:

        transfer (remote hosts) -> start -> the stream (queue, slot, command) -> verdict

    It owns the run's state: the result, the watchdogs, the wait recorder,
    the stop signals it was sent (the one place that catches them and puts
    the old handlers back: `_catching`)."""

    def __init__(self, spec: RunSpec, transport: Transport, options: CallOptions, clock: Clock) -> None:
        self.spec = spec
        self.transport = transport
        self.o = options
        self.clock = clock
        self.say = options.status or silent
        self.result = RunResult(spec, transport.host)
        self.result.details = transport.details
        # One time of submission, the host's too (RunSpec.submitted_on): when
        # the run joined its line (a local run's early ticket), or was made.
        self.result.phases["submitted"] = spec.submitted = transport.queued_since or spec.submitted or clock.wall()
        self.dogs = Watchdogs(clock, options.idle, options.backstop_margin)
        self.workdir = options.credit_dir or spec.cwd or os.getcwd()
        self._recorder: WaitRecorder | None = None
        self.stops: list[int] = []  # the stop signals this run was sent (handle_sigint)
        self.queue_start = clock.monotonic()
        if transport.came_back and transport.queued_since is not None:
            self.queue_start -= max(0.0, clock.wall() - transport.queued_since)  # in line since, away meanwhile
        self.to_fd = self.from_fd = -1
        self.exited = False  # the host said how the command ended
        self.beat_at = INF  # when a quiet run refreshes its open queue wait

    def run(self) -> RunResult:
        if self.transport.remote and not self._transfer():
            return self.result
        # The queue wait is recorded from its start, but written only once
        # the host says the run must wait: an uncontended run (slot at once)
        # costs no ledger write and no SQLite import.
        self.queue_wall = (self.clock.wall() if self.transport.remote
                           else self.result.phases["submitted"] or self.clock.wall())
        self.transport.keep_wait_end(self._wait_closer)
        if self.transport.came_back:
            self.waits().adopt("queue")  # opened before this process waited away (transports/away.py)
        self.to_fd, self.from_fd = self.transport.start(self.spec)
        turned_down = None
        held = self._catch(self._stop_run)
        interrupt = self.o.interrupt
        try:
            if interrupt is not None:
                interrupt.bind(self.to_fd)
            if self.stops:  # one came while slotq started, or after the transfer: it meant this run
                self._cancel_for(self.stops[0])
            self._stream()
        except (UsageError, StateDirError) as e:
            turned_down = e
        finally:
            if interrupt is not None:
                interrupt.unbind()
            self._restore(held)
            self._close_stream()
        if self._recorder is not None:
            self._recorder.finish(self.clock.wall())  # a run that ended without a slot: its wait ends now
        if turned_down is not None:
            # The host turned the request down (a bad class or partition, Slurm
            # refusing the job, an unusable state dir) and its side is over:
            # the transport still ends its part, as after any run -- Slurm's
            # sentinel is told `done` (else it took our exit for a vanished
            # caller and wrote that in the history).
            self.transport.wait()
            raise turned_down
        if self.result.queue_s is None and self.o.kept:
            self.result.queue_s = kept_wait(self.result, self.clock.wall())
        if self.result.queue_s is None:  # (never a slot)
            self.result.queue_s = self.clock.monotonic() - self.queue_start
        self._verdict(self.transport.wait())
        self.say(summary_line(self.result))
        return self.result

    # ---------------------------------------------------------------- the wait ledger

    def waits(self) -> WaitRecorder:
        """The run's wait recorder, made at its first wait: an uncontended
        local run never imports the ledger (nor SQLite, which only reading
        the ledger does)."""
        if self._recorder is None:
            from .ledger import WaitRecorder

            self._recorder = WaitRecorder(run_id=self.spec.run_id, workdir=self.workdir, host=self.transport.host,
                                          path=self.o.ledger_path,
                                          warn=lambda line: _write_line(self.o.stderr_fd, line))
        return self._recorder

    def _recordkept_wait(self) -> None:
        """A remote kept run's wait, from its submission to its slot, as the
        first attacher here to see the slot records it (the ledger keys it by
        run id: any later one changes nothing)."""
        from .ledger import WaitRecorder

        start, end = self.result.phases["submitted"], self.result.phases["slot"]
        if start is None or end is None:
            return
        rec = WaitRecorder(run_id=self.result.run_id, workdir=self.workdir, host=self.transport.host,
                           path=self.o.ledger_path, warn=lambda line: _write_line(self.o.stderr_fd, line))
        rec.open("queue", start)
        rec.close(max(start, end))

    def _wait_closer(self) -> Callable[[float], None]:
        """For a process of the run's host side that outlives us (a local
        standby keeper): how it closes our queue wait. A recorder of its
        own: the runner makes it in its thread, while ours may be in the
        making."""
        from .ledger import WaitRecorder

        return WaitRecorder(run_id=self.spec.run_id, workdir=self.workdir, host=self.transport.host,
                            path=self.o.ledger_path, warn=silent).closer("queue")

    # ---------------------------------------------------------------- stop signals

    def _catch(self, handler: Callable[[int, object], None]) -> dict[int, object]:
        """With `handle_sigint`, `handler` for the stop signals from now on
        -- and those that came since slotq's first line (signals.hold_stops)
        taken as ours. The handlers it replaced, for `_restore`."""
        if not self.o.handle_sigint:
            return {}
        old = signal.catch_stops(handler)
        self.stops.extend(signal.early)
        signal.early.clear()
        return old

    @staticmethod
    def _restore(old: dict[int, object]) -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _stop_run(self, signum: int, frame: object) -> None:
        """Ctrl-C, a polite SIGTERM (a CI job being stopped) and SIGHUP (the
        terminal closed) cancel the run and still deliver its result; the
        runner ends the command."""
        self.stops.append(signum)
        self._cancel_for(signum)

    def _cancel(self, reason: str) -> None:
        """`reason`: an outcome's value, or the stop signal's word
        (signals.stop_word), for the host's history."""
        try:
            os.write(self.to_fd, f"cancel {reason}\n".encode())
        except OSError:
            pass

    def _cancel_for(self, signum: int) -> None:
        self._cancel(signal.stop_word(signum) or Outcome.CANCELLED.value)

    # ---------------------------------------------------------------- transfer

    def _transfer(self) -> bool:
        """Connection, handshake and work tree transfer: a wait of its own
        kind, never counted as execution. A stop signal meanwhile (Ctrl-C, a
        harness's SIGTERM) ends the transfer (its rsync is killed) and the
        run: cancelled, with its result, as later. False if the run ended
        here (its result is said)."""
        result, clock, transport = self.result, self.clock, self.transport
        # An attacher connects; the run's transfer was its submitter's (the
        # record's `transferred` and `transfer_s` are that caller's to say).
        mine = not transport.attaching
        if mine:
            self.waits().open("transfer", result.phases["submitted"] or clock.wall())
        preparing = [True]

        def stop_transfer(signum: int, frame: object) -> None:
            self.stops.append(signum)
            if preparing[0]:
                preparing[0] = False
                raise _Stopped

        held = self._catch(stop_transfer)
        try:
            if self.stops:  # one came while slotq started: the run it meant to stop is this one
                raise _Stopped
            transport.prepare(self.spec)
            preparing[0] = False
        except WorkTreeError:
            preparing[0] = False
            self.waits().finish(clock.wall())  # the transfer's wait ends here: the caller's error, said as one
            raise
        except (HostUnavailable, _Stopped) as e:
            preparing[0] = False
            if isinstance(e, _Stopped):
                result.outcome = Outcome.CANCELLED
                result.message = (f"cancelled ({signal.stop_name(self.stops[0])}) before the run reached "
                                  f"host {transport.host} (connecting, or sending the work tree); nothing ran")
            else:
                result.message = str(e)
            result.phases["ended"] = clock.wall()
            if mine:
                result.transfer_s = clock.monotonic() - self.queue_start
                self.waits().finish(clock.wall())
            result.transport = transport.describe()
            self.say(summary_line(result))
            return False
        finally:
            self._restore(held)
        if mine:
            result.phases["transferred"] = clock.wall()
            result.transfer_s = clock.monotonic() - self.queue_start
        result.transport = transport.describe()
        for note in transport.notes():
            from ..records import printable

            self.say(f"slotq: warning: {printable(note, 1000)}")
        self.queue_start = clock.monotonic()
        if mine:
            self.waits().close(clock.wall())
        return True

    # ---------------------------------------------------------------- the stream

    def _stream(self) -> None:
        """Read the host's stream until it ends, keeping the watchdogs and
        the quiet run's heartbeat; raises UsageError or StateDirError when
        the host turned the request down."""
        decoder = protocol.Decoder()
        seen: set[str] = set()  # event names seen so far
        self.sinks = {protocol.STDOUT: self.o.stdout_fd, protocol.STDERR: self.o.stderr_fd}
        clock = self.clock
        while True:
            deadline = min(self.dogs.next_deadline(), self.beat_at)
            timeout = None if deadline == INF else max(0.0, deadline - clock.monotonic())
            ready, _, _ = select.select([self.from_fd], [], [], timeout)
            if clock.monotonic() >= self.beat_at:
                self.waits().heartbeat(clock.wall())
                self.beat_at = clock.monotonic() + self.o.heartbeat_every
            if self._watchdogs_fired():
                return
            if not ready:
                continue
            data = os.read(self.from_fd, 65536)
            if not data:
                return
            try:
                frames = decoder.feed(data)
                for kind, payload in frames:
                    if kind == protocol.EVENT:
                        check_sequence(payload, seen)  # type: ignore[arg-type]
            except ProtocolError as e:
                self.result.outcome = Outcome.UNAVAILABLE
                self.result.message = f"host {self.transport.host}: {e}"
                self.transport.kill()
                return
            for kind, payload in frames:
                if kind in self.sinks:
                    self._output(kind, payload)  # type: ignore[arg-type]
                else:
                    self._event(payload)  # type: ignore[arg-type]

    def _watchdogs_fired(self) -> bool:
        """The backstop (True: the run is over) or the idle watchdog."""
        fired = self.dogs.expired()
        if fired is Outcome.BACKSTOP:
            result = self.result
            result.outcome = Outcome.BACKSTOP
            slot_at = result.phases["slot"]
            result.message = (f"no result from host {self.transport.host} within budget + "
                              f"{self.o.backstop_margin:g}s after the slot was acquired"
                              + (f" (slot at {slot_at:.0f})" if slot_at else ""))
            self.transport.kill()
            return True
        if fired is Outcome.IDLE_TIMEOUT:
            self.say(f"slotq: no output for {format_duration(self.o.idle or 0)}: stopping the command")
            self._cancel(Outcome.IDLE_TIMEOUT.value)
        return False

    def _output(self, kind: bytes, payload: bytes) -> None:
        """The command's output, byte-exact, to our own stream."""
        self.dogs.on_output()
        fd = self.sinks[kind]
        if fd < 0:
            return
        try:
            protocol.write_all(fd, payload)
            if kind == protocol.STDOUT and payload:
                self.result.open_line = not payload.endswith(b"\n")
        except OSError as e:
            # Our reader went away (`slotq run ... | head`): as in a
            # pipeline, the command's own stream closes (it gets
            # SIGPIPE/EPIPE and ends its own way); drop the rest. Any other
            # failure (a full disk) is not silent.
            self.sinks[kind] = -1
            if not isinstance(e, BrokenPipeError):
                name = "stdout" if kind == protocol.STDOUT else "stderr"
                _write_line(self.o.stderr_fd, f"slotq: warning: cannot write the command's {name} "
                                              f"({e.strerror or e}): the rest of it is dropped, and the "
                                              f"command's {name} is closed")
            try:
                os.write(self.to_fd, b"close stdout\n" if kind == protocol.STDOUT else b"close stderr\n")
            except OSError:
                pass

    def _event(self, ev: dict[str, object]) -> None:
        """An event of the host's: the wait's record first, then the
        result and the status lines (events.on_event)."""
        clock, name = self.clock, ev.get("event")
        if self.o.kept:  # its host side records the wait (unless it is remote: below)
            if name == protocol.SLOT:
                self.result.phases["slot"] = float(ev["at"])  # type: ignore[arg-type]
                if isinstance(ev.get("host"), str) and not self.transport.remote:  # late-bound: the winner
                    from ..records import printable

                    self.result.host = printable(str(ev["host"]), 255)
                self.result.queue_s = kept_wait(self.result, self.clock.wall())
                if self.transport.waits_by_caller:
                    self._recordkept_wait()
            elif name == protocol.HELLO:
                adopt_request(self.result, ev)
                if isinstance(ev.get("credit_dir"), str):
                    self.workdir = str(ev["credit_dir"])
        elif name == protocol.QUEUED:
            recorder = self.waits()
            if not recorder.opened:
                recorder.open("queue", self.queue_wall)
            recorder.heartbeat(clock.wall())
            if self.spec.quiet and recorder.opened:
                # Far back in a local one-slot line, the host's standby
                # keeper closes the record if we die: nothing to refresh, no
                # wake-up until our turn.
                kept = ev.get("wait_kept") is True and not self.transport.remote
                self.beat_at = INF if kept else clock.monotonic() + self.o.heartbeat_every
        elif name == protocol.AWAY:  # wait away as a shell (host/away.py), if we can
            if self._recorder is not None and self._recorder.opened:
                self.transport.go_away(ev, recorder=self._recorder, stops=self.stops)  # returns only if we stay
            _write_line(self.to_fd, "stay")
        elif name == protocol.SLOT:
            if self.result.host != self.transport.host:  # late-bound over several hosts (transports/bound.py)
                self.result.host = self.transport.host
                self.result.transport = self.transport.describe()  # the one that won, and its transfer
                sent = self.transport.tree_sent
                if sent is not None and not self.transport.attaching:
                    self.result.phases["transferred"] = sent[0]
                    self.result.transfer_s = (self.result.transfer_s or 0.0) + sent[1]
                self.say(f"slotq: host {self.result.host} gave the first slot: the run goes there, its places "
                         f"in the other lines withdrawn")
            now = clock.wall()
            end = self.transport.slot_seen or wait_end(ev, self.queue_wall, now, self.transport.remote)
            if self._recorder is not None:
                self._recorder.close(end)
            self.beat_at = INF
            self.result.queue_s = max(0.0, clock.monotonic() - self.queue_start - (now - end))
        self.exited = on_event(ev, self.result, self.dogs, self.say, self.spec, self.o.live,
                               self.o.others_as_data, self.transport.attach_options()) or self.exited

    def _close_stream(self) -> None:
        try:
            os.close(self.to_fd)
        except OSError:
            pass
        os.close(self.from_fd)

    # ---------------------------------------------------------------- verdict

    def _verdict(self, diagnostics: str | None) -> None:
        """What the result says, once the host's side is over: the one
        place that words an outcome the stream left unsaid."""
        result, transport = self.result, self.transport
        if not self.exited and result.outcome is Outcome.UNAVAILABLE and not result.message:
            result.message = f"host runner on {transport.host} ended without a result"
            if diagnostics:
                result.message += f": {diagnostics.strip().splitlines()[-1]}"
            note = transport.after_loss(self.spec.run_id)
            if note:
                result.message += f"; on the host, {note}"
        if result.phases["ended"] is None:
            result.phases["ended"] = self.clock.wall()
        stops = self.stops
        if result.outcome is Outcome.IDLE_TIMEOUT and self.o.idle is not None:
            # The watchdog is ours (the host only heard "stop"): say what it saw.
            result.message = (f"no output for {format_duration(self.o.idle)} after the command started (--idle): "
                              "stopped")
        elif (result.outcome is Outcome.CANCELLED and stops and self.exited
              and "cancelled by slotq cancel" not in result.message
              and f"({signal.stop_name(stops[0])}" not in result.message):
            # Our cancel, for a stop signal, from a host that did not name it
            # (an older slotq there, of the same protocol): which, and when.
            phase = (WHILE_RUNNING if result.phases["started"] else WHILE_PREPARING if result.phases["slot"]
                     else WHILE_WAITING)
            result.message = f"cancelled ({signal.stop_name(stops[0])}) {phase}"


class _Stopped(Exception):
    """A stop signal during a remote run's transfer (raised by its handler)."""
