"""A host runner's link to its caller: everything the run hears and says.

- out: the framed stream (protocol.py) on `out_fd`; a write error means
  nobody listens any more (`gone`).
- in: the caller's channel on `in_fd`: `cancel <reason>` lines (an
  outcome, or the stop signal the caller was sent: `cancel SIGTERM`),
  `close stdout|stderr` (its reader is gone), `stay` (it will not wait
  away after all: host/away.py), `lapsed <seconds>` (a kept run's lease
  ran out: client/standin.py), `go` / `pass` (a late-bound reservation's
  slot is taken, or not: the caller took one elsewhere; runner.py);
  end-of-file or a read error means the caller is gone.
- signals: SIGTERM/SIGHUP to the runner's process (`slotq host run` over
  ssh, or a forked local runner) cancel the run, through a wake-up pipe;
  SIGINT is ignored (the client relays Ctrl-C as `cancel`). A runner that is
  a thread of the client's process leaves signals to the client.
- `slotq cancel` from another shell: the control socket (control.py),
  opened only once the run lives long enough to be cancelled by hand.

The runner's loops select on `fds()` and hand what was ready to `check()`,
which says whether the run must end, and how.
"""

from __future__ import annotations

import os

from .. import protocol
from .. import signals as signal
from ..clock import Clock
from ..outcome import Outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .control import ControlSocket

_CANCEL_REASONS = {"cancelled": Outcome.CANCELLED, "idle_timeout": Outcome.IDLE_TIMEOUT,
                   "backstop": Outcome.BACKSTOP}  # (a kept run's stand-in keeps the backstop: client/standin.py)
_STREAMS = {"stdout": protocol.STDOUT, "stderr": protocol.STDERR}


class CallerLink:
    def __init__(self, in_fd: int, out_fd: int, run_id: str, clock: Clock, ctl_buffer: bytes = b"",
                 label: str | None = None) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.run_id = run_id
        self.label = label  # told to our own user's `slotq cancel --label` over the control socket
        self.clock = clock
        self.gone = False  # nobody reads our stream any more
        self._in_open = True
        self._ctl_buf = ctl_buffer  # caller-channel bytes read before we started
        self._sig_r, self._sig_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        if b"\n" in ctl_buffer:
            # Words that came with the request (a late-bound caller's `pass`
            # can arrive before this runner has started): nothing more may
            # come on in_fd, so the first select must wake for them.
            os.write(self._sig_w, b"\0")
        self._signalled = False
        self._wakeup_set = False
        self._control: ControlSocket | None = None
        self.control_tried = False
        self.cancel_note: str | None = None  # who cancelled us through `slotq cancel`
        self.stopped_by: str | None = None  # the stop signal that cancelled us, as the history names it
        self.lapsed: str | None = None  # a kept run's lease lapsed (client/standin.py): how, for the history
        self.stayed = False  # the caller said `stay`: it will not wait away (host/away.py)
        self.went = False  # a late-bound reservation: the caller said `go` (its slot is taken)
        self.passed = False  # ... or `pass`: it took a slot elsewhere (the wait ends, unrecorded)
        self.closed: set[bytes] = set()  # streams whose reader is gone (`close stdout`): close them, as a pipe would

    # ------------------------------------------------------------ out
    def send(self, data: bytes) -> None:
        if self.gone:
            return
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.out_fd, view)
                view = view[n:]
        except OSError:  # EPIPE, EBADF, EIO: nobody is listening any more
            self.gone = True

    def event(self, name: str, **fields: object) -> None:
        self.send(protocol.event_frame(name, self.clock.wall(), **fields))

    def close_stream(self) -> None:
        """End the stream to the caller (once)."""
        self.gone = True
        if self.out_fd >= 0:
            try:
                os.close(self.out_fd)
            except OSError:
                pass
            self.out_fd = -1

    # ------------------------------------------------------------ in
    def take_signals(self) -> None:
        """Stop signals to our process cancel the run (not in a thread of
        the client's process: the client handles signals there)."""
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client relays Ctrl-C as `cancel`
            signal.set_wakeup_fd(self._sig_w)
            self._wakeup_set = True
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGHUP, self._on_signal)
        except ValueError:
            pass  # a thread of the client's process

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signalled = True
        if self.stopped_by is None:
            self.stopped_by = f"{signal.stop_name(signum)} to the host runner"

    def listen_for_cancel(self) -> None:
        """Open the control socket `slotq cancel` reaches us through (once):
        when the run has to wait, and once its command has run a moment."""
        if self._control is not None or self.control_tried:
            return
        self.control_tried = True
        from .control import ControlSocket

        try:
            self._control = ControlSocket(self.run_id, self.label)
        except OSError:
            self._control = None  # no sockets here, or the name is taken: `slotq cancel` cannot reach us

    def fds(self) -> list[int]:
        """What to select on for the caller's word."""
        fds = [self._sig_r]
        if self._in_open:
            fds.append(self.in_fd)
        if self._control is not None:
            fds.append(self._control.fileno())
        return fds

    def check(self, ready: list[int]) -> Outcome | None:
        """After a select over (among others) `fds()`: an outcome if the run
        must end (cancelled, the caller gone, idle timeout relayed)."""
        if self._sig_r in ready:
            try:
                os.read(self._sig_r, 64)
            except BlockingIOError:
                pass
        if self._signalled:
            return Outcome.CANCELLED
        if self._control is not None and self._control.fileno() in ready:
            note = self._control.accept_cancel()
            if note is not None:
                self.cancel_note = f"cancelled by slotq cancel ({note})"
                return Outcome.CANCELLED
        if self.in_fd in ready and self._in_open:
            return self._read_ctl()
        return self._words()

    def _read_ctl(self) -> Outcome | None:
        try:
            chunk = os.read(self.in_fd, 4096)
        except OSError:
            chunk = b""
        if not chunk:
            self._in_open = False
            said = self._words()  # what it said before it went (a late-bound caller's `pass`) counts first
            return said if said is not None else Outcome.CALLER_GONE
        self._ctl_buf += chunk
        return self._words()

    def _words(self) -> Outcome | None:
        """The caller's whole lines read so far, in order: an outcome as soon
        as one ends the run (the rest stay for the next check)."""
        while b"\n" in self._ctl_buf:
            line, self._ctl_buf = self._ctl_buf.split(b"\n", 1)
            words = line.decode(errors="replace").split()
            if len(words) == 2 and words[0] == "cancel":
                if self.stopped_by is None:
                    self.stopped_by = signal.word_name(words[1])
                return _CANCEL_REASONS.get(words[1], Outcome.CANCELLED)
            if len(words) == 2 and words[0] == "lapsed":  # a kept run's lease: nobody came back
                from ..durations import format_duration

                lease = float(words[1]) if words[1].replace(".", "", 1).isdigit() else 0.0
                self.lapsed = f"nobody attached within the {format_duration(lease)} lease"
                return Outcome.CALLER_GONE
            if words == ["stay"]:
                self.stayed = True
            if words == ["go"]:
                self.went = True
            if words == ["pass"]:
                self.passed = True
                return Outcome.CANCELLED
            if len(words) == 2 and words[0] == "close" and words[1] in _STREAMS:
                self.closed.add(_STREAMS[words[1]])
        return None

    def close(self) -> None:
        if self._wakeup_set:
            signal.set_wakeup_fd(-1)
            self._wakeup_set = False
        os.close(self._sig_r)
        os.close(self._sig_w)
        if self._control is not None:
            self._control.close()
            self._control = None
