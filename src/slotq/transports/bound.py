"""Several hosts as one line: late binding (`slotq run --host A,B,C`).

The run takes a place in every host's line at once -- a reservation: a
`slotq host run` over ssh whose request names the other hosts (`bind`) --
and keeps the first slot it gets (docs/remote.md; Sparrow's late binding,
without a central server: the caller holds a connection to each host).
A host's runner that gets the slot offers it (`offered`) and holds it
until told `go` or `pass` (host/runner.py). The relay here, a thread of
the client:

- sends the client one line of waiting: the best place among the hosts,
  the others named in its notes;
- at the first offer, says `pass` to every other host -- each withdraws
  its ticket, or releases the slot it was offering at that very moment:
  never two commands -- sends the work tree to the winner, says `go`, and
  from then on passes the winner's stream and the client's word through;
- leaves out a host whose connection ends or that refuses the run (named
  in the next line of waiting); only when every host is gone does the run
  end, as the last one said.

The client sees one stream and records one wait, from the first ticket to
the slot. Liveness is unchanged: should the caller go, every ssh session
closes, and each host withdraws its reservation as for any caller.
"""

from __future__ import annotations

import os
import select
import time

from .. import protocol
from ..errors import HostUnavailable, ProtocolError, WorkTreeError
from ..records import to_json
from ..signals import start_thread
from .base import Transport

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading

    from ..spec import RunSpec
    from .ssh import SshTransport


class LateBound(Transport):
    """A run late-bound over `hosts` (each an SshTransport, not yet
    prepared): see the module doc."""

    remote = True

    def __init__(self, hosts: list[SshTransport]) -> None:
        self.hosts = hosts
        self.host = ",".join(t.host for t in hosts)  # the winner's name, once there is one
        self.winner: SshTransport | None = None
        self.left_out: list[str] = []  # hosts that could not take part, and why
        self.src: str | None = None  # the work tree the winner gets (rsync), else None
        self.pinned: int | None = None  # ... the directory it named when the run was asked for (ssh.pin)
        self.transfer_s = 0.0
        self._thread: threading.Thread | None = None  # the relay's

    def prepare(self, spec: RunSpec) -> None:
        """Masters and handshakes with every host at once; a host that
        fails is left out (said as a warning). HostUnavailable if none is
        left. The work tree goes to the winner only (start)."""
        from concurrent.futures import ThreadPoolExecutor

        def ready(t: SshTransport) -> str | None:
            try:
                t.ssh.ensure_master()
                t.info = t.ssh.handshake()
            except HostUnavailable as e:
                return str(e)
            return None

        with ThreadPoolExecutor(max_workers=min(16, len(self.hosts))) as pool:
            problems = list(pool.map(ready, self.hosts))
        self.left_out += [f"host {t.host} is left out: {p}" for t, p in zip(self.hosts, problems) if p]
        up = [t for t, p in zip(self.hosts, problems) if p is None]
        if not up:
            raise HostUnavailable("no host of " + self.host + " could be used: " + "; ".join(
                p for p in problems if p), self.host)
        self.hosts = up
        if self.hosts[0].sync == "rsync":
            from .ssh import pin, work_id

            self.src = spec.cwd or os.getcwd()
            spec.work_id, spec.cwd = work_id(self.src), None
            try:
                # Sent after the wait: the tree of the directory named now,
                # not of whatever the name leads to by then (issue 65).
                self.pinned = pin(self.src)
            except OSError as e:
                raise WorkTreeError(f"cannot open the work tree {self.src}: {e.strerror}; nothing ran") from None
        else:
            spec.cwd = os.path.realpath(spec.cwd or os.getcwd())

    def notes(self) -> list[str]:
        return self.left_out + (self.winner.notes() if self.winner is not None else [])

    def describe(self) -> dict[str, object]:
        names = [t.host for t in self.hosts]
        if self.winner is None:
            return {"kind": "ssh", "late_binding": {"hosts": names, "won": None}}
        return {**self.winner.describe(), "rsync_s": round(self.transfer_s, 4),
                "late_binding": {"hosts": names, "won": self.winner.host}}

    def start(self, spec: RunSpec) -> tuple[int, int]:
        import threading

        names = [t.host for t in self.hosts]
        for t in self.hosts:
            spec.bind = [n for n in names if n != t.host]
            t._launch(spec, await_sync=False)
        spec.bind = None
        ctl_r, ctl_w = os.pipe()
        ev_r, ev_w = os.pipe()
        relay = Relay(self, spec, ctl_r, ev_w)
        thread = threading.Thread(target=relay.run, name="slotq-late-binding", daemon=True)
        self._thread = thread
        start_thread(thread.start)
        return ctl_w, ev_r

    def bind(self, winner: SshTransport) -> None:
        self.winner = winner
        self.host = winner.host

    def kill(self) -> None:
        for t in self.hosts:
            t.kill()

    def wait(self) -> str:
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self.pinned is not None:
            os.close(self.pinned)
            self.pinned = None
        said = ""
        for t in self.hosts:
            text = t.wait()
            if t is self.winner or (self.winner is None and text):
                said = text
        return said

    def after_loss(self, run_id: str) -> str:
        return self.winner.after_loss(run_id) if self.winner is not None else ""


class Relay:
    """The hosts' streams and the client's channel (see the module doc)."""

    def __init__(self, bound: LateBound, spec: RunSpec, ctl_r: int, ev_w: int) -> None:
        self.bound = bound
        self.spec = spec
        self.ctl_r = ctl_r
        self.ev_w = ev_w
        self.live: dict[int, SshTransport] = {t._fds[1]: t for t in bound.hosts}  # their streams, by fd
        self.decoders = {fd: protocol.Decoder() for fd in self.live}
        self.passed: set[int] = set()  # streams of hosts told `pass`: read to their end, unheard
        self.places: dict[str, dict[str, object]] = {}  # each host's last `queued`
        self.gone: dict[str, str] = {}  # hosts left out while waiting, and why
        self.hello_sent = False
        self.next_line = 0.0  # when the next line of waiting may go to the client
        self.ended = False  # the client has its final event

    # ----------------------------------------------------------- to the client
    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.ev_w, view):]

    def event(self, ev: dict[str, object]) -> None:
        if ev.get("event") in (protocol.EXITED, protocol.ERROR):
            self.ended = True
        self.send(protocol.frame(protocol.EVENT, to_json(ev).encode()))

    # ----------------------------------------------------------- the pump
    def run(self) -> None:
        try:
            self._pump()
        except BaseException as e:  # never silent: the client gets an ending
            if not self.ended:
                try:
                    self._hello({"event": protocol.HELLO, "at": time.time(), "protocol": protocol.PROTOCOL_VERSION})
                    self.event({"event": protocol.ERROR, "at": time.time(), "kind": "unavailable",
                                "message": f"the late-binding relay failed: {e!r}"})
                except OSError:
                    pass
        finally:
            for t in self.bound.hosts:
                _hang_up(t)
            for fd in self.live:
                _close(fd)
            os.close(self.ev_w)
            os.close(self.ctl_r)

    def _pump(self) -> None:
        client_open = True
        while self.live and not self.ended:
            reads = list(self.live) + ([self.ctl_r] if client_open else [])
            ready, _, _ = select.select(reads, [], [])
            for fd in ready:
                if fd == self.ctl_r:
                    client_open = self._from_client()
                elif fd in self.live:
                    self._from_host(fd)
        if not self.ended and not self.live:
            self._hello({"event": protocol.HELLO, "at": time.time(), "protocol": protocol.PROTOCOL_VERSION})
            self.event({"event": protocol.ERROR, "at": time.time(), "kind": "unavailable",
                        "message": "every host's connection ended: " + "; ".join(
                            f"{h}: {why}" for h, why in self.gone.items())})

    def _from_client(self) -> bool:
        """The client's word: to every host while none is bound, then to
        the winner. False once the client has closed its channel (every
        host is told so: each withdraws, as for a caller gone)."""
        data = os.read(self.ctl_r, 65536)
        targets = [self.bound.winner] if self.bound.winner is not None else list(self.live.values())
        for t in targets:
            if not data:
                _hang_up(t)
            else:
                _write(t._fds[0], data)
        return bool(data)

    def _from_host(self, fd: int) -> None:
        t = self.live[fd]
        data = os.read(fd, 65536)
        if fd in self.passed:
            if not data:
                self._lose(fd, "")
            return
        if not data:
            if t is self.bound.winner:
                self.ended = True  # without its result: the client says so, and asks the host (after_loss)
            self._lose(fd, "its connection ended")
            return
        try:
            frames = self.decoders[fd].feed(data)
        except ProtocolError as e:
            if t is self.bound.winner:
                raise
            self._lose(fd, str(e))
            return
        for kind, payload in frames:
            if self.bound.winner is t:
                self._forward(kind, payload)
            elif self.bound.winner is None and kind == protocol.EVENT:
                self._waiting(fd, t, payload)  # type: ignore[arg-type]

    def _forward(self, kind: bytes, payload: bytes | dict[str, object]) -> None:
        if kind != protocol.EVENT:
            self.send(protocol.frame(kind, payload))  # type: ignore[arg-type]
        elif isinstance(payload, dict) and payload.get("event") == protocol.SLOT:
            self.event(dict(payload, host=self.bound.host))  # the winner, named (a kept run's log: client/standin.py)
        else:
            self.event(payload)  # type: ignore[arg-type]

    def _lose(self, fd: int, why: str) -> None:
        """A host's stream ended (or broke): no longer read (`why`: it was
        left out while waiting)."""
        t = self.live.pop(fd)
        self.decoders.pop(fd, None)
        self.passed.discard(fd)
        self.places.pop(t.host, None)
        _hang_up(t)
        _close(fd)
        if why and t is not self.bound.winner:
            self.gone[t.host] = why

    # ----------------------------------------------------------- waiting
    def _waiting(self, fd: int, t: SshTransport, ev: dict[str, object]) -> None:
        """An event of a host not yet bound."""
        name = ev.get("event")
        if name == protocol.HELLO:
            self._hello(ev)
        elif name == protocol.QUEUED:
            self.places[t.host] = ev
            self._line_of_waiting()
        elif name == protocol.OFFERED:
            self._take(t)
        elif name in (protocol.EXITED, protocol.ERROR):
            # This host ended its reservation (refused it, was cancelled,
            # could not start the command): the last one's word is the run's.
            self._lose(fd, str(ev.get("message") or name))
            if not self.live:
                self.event(ev)

    def _hello(self, ev: dict[str, object]) -> None:
        if not self.hello_sent:
            self.hello_sent = True
            self.send(protocol.MAGIC)
            self.event(dict(ev, host=self.bound.host))

    def _line_of_waiting(self) -> None:
        """The best place among the hosts, at most once a report period."""
        now = time.monotonic()
        if now < self.next_line or not self.places:
            return
        self.next_line = now + self.spec.report_every
        order = [t.host for t in self.live.values()]
        best = min(self.places, key=lambda h: (_position(self.places[h]), order.index(h) if h in order else 0))
        others = [f"{h} (position {_position(ev)})" for h, ev in self.places.items() if h != best]
        others += [f"{h} (left out: {why})" for h, why in self.gone.items()]
        waiting = f"in line on {len(self.places)} hosts, best on {best}" if len(self.places) > 1 else \
            f"in line on {best} (the others' places not known yet)"
        note = waiting + ("; also on " + ", ".join(others) if others else "")
        ev = dict(self.places[best])
        notes = ev.get("notes") if isinstance(ev.get("notes"), list) else []
        ev["notes"] = [note, *notes]  # type: ignore[misc]
        self.event(ev)

    def _take(self, t: SshTransport) -> None:
        """The first slot offered: every other host is told `pass` (and its
        stream is no longer read), the work tree goes to the winner, which
        is then told `go`."""
        self.bound.slot_seen = time.time()
        self.bound.bind(t)
        for fd, other in self.live.items():
            if other is not t:
                _write(other._fds[0], b"pass\n")
                self.passed.add(fd)
        if self.bound.src is not None:
            t0 = time.monotonic()
            try:
                assert self.spec.work_id is not None
                t.send_tree(self.bound.src, self.spec.work_id, self.bound.pinned)
            except (HostUnavailable, WorkTreeError) as e:
                _write(t._fds[0], b"pass\n")  # its slot is released at once
                self.event({"event": protocol.ERROR, "at": time.time(), "message": str(e),
                            "kind": "worktree" if isinstance(e, WorkTreeError) else "unavailable"})
                return
            self.bound.transfer_s = time.monotonic() - t0
            self.bound.tree_sent = (time.time(), self.bound.transfer_s)
        _write(t._fds[0], b"go\n")


def _position(ev: dict[str, object]) -> int:
    pos = ev.get("position")
    return pos if isinstance(pos, int) and not isinstance(pos, bool) else 1 << 30


def _write(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass  # that host's connection is gone: its stream says so


def _hang_up(t: SshTransport) -> None:
    """Close our channel to a host's runner (once): it hears end-of-file."""
    to_w, from_r = t._fds
    t._fds = (-1, from_r)
    _close(to_w)


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass
