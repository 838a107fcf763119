"""A kept run's process (`slotq host keep`): its runner, and a stand-in for
the caller that left (the caller's side, kept by the host: client/).

The runner (runner.py) carries the run as for any caller, in the main
thread; it talks to the stand-in, a thread, through the same two channels
a caller has: the framed stream, which the stand-in writes to the run's
log (kept.py) for attachers, and the caller's channel, on which the
stand-in says what a caller would say. It keeps every clock the caller
kept (docs/agents.md, "Every clock stays where it belongs"):

- the lease: when nobody is attached and nobody came back within it, the
  run ends `caller_gone` ("nobody attached within the 15m lease"), exactly
  as a dropped stdin ends an attached run;
- the no-output watchdog (`--idle`), counting only once the command started;
- the backstop, budget + 90 s from the slot: the runner is told to stop,
  and if it says nothing within the kill grace and a moment, our whole
  process goes (the command's keeper then ends the command's group);
- the wait ledger: the queue wait is recorded under the run's credit dir
  with this process as its waiter, and closed at the slot's time.
"""

from __future__ import annotations

import os
import select
import sys

from .. import protocol
from .. import signals as signal
from ..clock import INF, Clock
from ..host import kept
from ..signals import start_thread
from .watchdogs import Watchdogs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..config import HostConfig
    from ..transports.away import Back
    from .ledger import WaitRecorder
    from ..host.inotify import Watcher
    from ..spec import RunSpec

# The lease is looked at again when an attacher comes or goes (the run's
# directory is watched: an attacher renews the lease as it leaves, and its
# lock file closes if it is killed), and at least this often while one is
# attached; without inotify, this often whatever happens.
LEASE_LOOK_S = 30.0
POLL_LOOK_S = 1.0


class StandIn:
    def __init__(self, path: str, log: kept.KeptLog, ctl_fd: int, terms: dict[str, object], clock: Clock,
                 run_id: str, host: str, away: Away | None = None) -> None:
        self.path = path
        self.log = log
        self.ctl_fd = ctl_fd
        self.clock = clock
        self.run_id = run_id
        self.away = away
        lease, idle = terms.get("lease_s"), terms.get("idle")
        self.lease_s = float(lease) if isinstance(lease, (int, float)) else kept.LEASE_S
        self.dogs = Watchdogs(clock, float(idle) if isinstance(idle, (int, float)) else None)
        self.grace = float(terms.get("kill_grace") or 5.0)  # type: ignore[arg-type]
        self.said: str | None = None  # what we told the runner, once
        self.given_up_at = INF  # the backstop's last resort
        self.lease_look = clock.monotonic()  # when the lease is looked at next
        self.watch = _watch(path)
        self.recorder = None
        credit_dir, queued_since = terms.get("credit_dir"), terms.get("queued_since")
        if isinstance(credit_dir, str) and terms.get("ledger") is not False:
            from .ledger import WaitRecorder

            self.recorder = WaitRecorder(run_id=run_id, workdir=credit_dir, host=host, warn=lambda line: None)
        self.queued_since = float(queued_since) if isinstance(queued_since, (int, float)) else None
        if away is not None and away.back is not None:
            # Back from waiting away: the stream's header and hello are in the
            # log already, and so is the run's open queue wait in the ledger.
            self.skip = [protocol.HELLO]
            if self.recorder is not None:
                self.recorder.adopt("queue")
            if away.back.stop is not None:  # the shell was sent a stop signal: as to our process
                self._say(f"cancel {signal.stop_word(away.back.stop)}", "stop")
        else:
            self.skip = []

    def run(self, from_fd: int) -> None:
        """Read the runner's stream until it ends."""
        buf = b""
        magic = False
        while True:
            timeout = max(0.0, min(self.dogs.next_deadline(), self.given_up_at, self.lease_look)
                          - self.clock.monotonic())
            fds = [from_fd] + ([self.watch.fileno()] if self.watch is not None else [])
            ready, _, _ = select.select(fds, [], [], timeout)
            if self.watch is not None and self.watch.fileno() in ready:
                self.watch.drain()
                self.lease_look = self.clock.monotonic()  # an attacher came or went
            self._keep_clocks()
            if from_fd not in ready:
                continue
            data = os.read(from_fd, 1 << 16)
            if not data:
                break
            buf += data
            if not magic:
                if len(buf) < len(protocol.MAGIC):
                    continue
                if not self.log.pos:
                    self.log.write(buf[:len(protocol.MAGIC)], True)
                buf, magic = buf[len(protocol.MAGIC):], True
            frames, used = kept.split_frames(buf)
            at = 0
            for kind, payload in frames:
                size = protocol.HEADER_SIZE + len(payload)
                self._frame(kind, payload, buf[at:at + size])
                at += size
            buf = buf[used:]
        if self.recorder is not None:
            self.recorder.finish(self.clock.wall())
        if self.watch is not None:
            self.watch.close()
        self.log.close()

    def _frame(self, kind: bytes, payload: bytes, raw: bytes) -> None:
        if kind != protocol.EVENT:
            self.dogs.on_output()
            self.log.write(raw, False)
            return
        name = kept.event_name(payload)
        if name in self.skip:
            self.skip.remove(name)
            return
        if name == protocol.AWAY:
            self._go_away(payload)  # returns only if we stay
            return
        self.log.write(raw, name != protocol.QUEUED)
        if name in (protocol.QUEUED, protocol.SLOT, protocol.PREPARED, protocol.STARTED):
            self._on_event(name, payload)

    def _on_event(self, name: str, payload: bytes) -> None:
        from ..records import from_json

        ev = from_json(payload.decode("utf-8", "replace"), protocol.EVENT_DEPTH)
        if not isinstance(ev, dict):
            return
        at = ev.get("at")
        at = float(at) if isinstance(at, (int, float)) else self.clock.wall()
        rec = self.recorder
        if name == protocol.QUEUED and rec is not None:
            if not rec.opened:
                rec.open("queue", min(self.queued_since or at, at))
            rec.heartbeat(at)
        elif name == protocol.SLOT and rec is not None:
            rec.close(at)
        self.dogs.on_event(name, ev, at)  # the clocks, as the caller keeps them (watchdogs.py)

    def _go_away(self, payload: bytes) -> None:
        """The runner offers the run to wait away (host/away.py): far back
        in a slow line, this process becomes a shell -- the run's ticket
        and `alive` lock still held -- until a few places before its turn,
        the end of the lease or a look again ([waiting] away_look), then
        `slotq host keep-back` carries the run on (cli/hostkeep.py). An
        attacher meanwhile reports the run's place itself (host/follow.py).
        Where it cannot go, or should not, we say `stay`."""
        from ..records import from_json
        from ..transports import away as shell

        ev = from_json(payload.decode("utf-8", "replace"), protocol.EVENT_DEPTH)
        plan = self.away
        fields = (ev.get("ticket_fd"), ev.get("ahead_fd"), ev.get("ticket"), ev.get("slot"), ev.get("busy")) \
            if isinstance(ev, dict) else None
        if plan is not None and fields is not None and self.said is None:
            ends = kept.lease_ends(self.path, self.lease_s)
            if ends is None:
                ends = self.clock.wall() + self.lease_s  # an attacher is here: it renews the lease as it leaves
            ticket_fd, ahead_fd, path, slot, busy = fields
            if isinstance(ticket_fd, int) and isinstance(ahead_fd, int) and isinstance(path, str) \
                    and isinstance(slot, str) and isinstance(busy, list) and all(isinstance(f, int) for f in busy):
                from ..host.ticket import Ticket

                look = min(plan.look, max(1.0, ends - self.clock.wall()))  # back to end the run if the lease lapses
                left = ev.get("max_wait_s") if isinstance(ev, dict) else None
                if isinstance(left, (int, float)):
                    look = min(look, float(left))
                rec = self.recorder
                gone = {"run_id": self.run_id, "ledger": rec.path if rec is not None else "",
                        "workdir": rec.workdir if rec is not None else "", "host": rec.host if rec else ""}
                os.set_inheritable(plan.alive, True)  # the shell holds it: the run is alive, away
                again = shell.Return([sys.executable, "-m", "slotq"], ["host", "keep-back", self.run_id,
                                                                        str(plan.alive)])
                shell.go(Ticket(path, ticket_fd, 0, "", {}), ahead_fd, look, gone, stopped=[], busy=busy, slot=slot,
                         again=again)
                os.set_inheritable(plan.alive, False)  # (it did not go)
        self._tell("stay")

    def _keep_clocks(self) -> None:
        now = self.clock.monotonic()
        if now >= self.given_up_at:
            os.kill(os.getpid(), signal.SIGKILL)  # the runner is stuck: the keeper ends the command
        fired = self.dogs.expired()
        if fired is not None and fired.value == "backstop" and self.said != "backstop":
            self._say("cancel backstop", "backstop")
            self.given_up_at = now + self.grace + 30.0
        elif fired is not None and fired.value == "idle_timeout":
            self._say("cancel idle_timeout", "idle")
        if self.said is None and now >= self.lease_look:
            ends = kept.lease_ends(self.path, self.lease_s)
            left = LEASE_LOOK_S if ends is None else ends - self.clock.wall()
            if left <= 0:
                self._say(f"lapsed {float(self.lease_s)!r}", "lease")  # read back exactly (callerlink)
                left = INF
            self.lease_look = now + min(left, LEASE_LOOK_S if self.watch is not None else POLL_LOOK_S)

    def _say(self, line: str, what: str) -> None:
        self.said = what
        self._tell(line)

    def _tell(self, line: str) -> None:
        try:
            os.write(self.ctl_fd, line.encode() + b"\n")
        except OSError:
            pass


class Away:
    """What a kept run here needs to wait away: its process's `alive` lock
    (the shell holds it meanwhile), how long it may stay away before it
    looks again ([waiting] away_look), and -- a run back from away -- how
    it came back (transports/away.Back)."""

    __slots__ = ("alive", "look", "back")

    def __init__(self, alive: int, look: float, back: Back | None) -> None:
        self.alive, self.look, self.back = alive, look, back


def _closer(rec: WaitRecorder) -> Callable[[float], None]:
    """How the runner's standby keeper closes the run's queue wait (a
    recorder of its own: made in the runner's thread, as for a caller)."""
    from .ledger import WaitRecorder

    return WaitRecorder(run_id=rec.run_id, workdir=rec.workdir, host=rec.host, path=rec.path,
                        warn=lambda line: None).closer("queue")


def _watch(path: str) -> Watcher | None:
    """The run's directory, for an attacher's coming and going: the lease
    renewed (its time changes), a lock file closed."""
    from ..host import inotify

    if not inotify.available():
        return None
    w = inotify.Watcher()
    if not w.watch(path, inotify.IN_ATTRIB | inotify.IN_CLOSE_WRITE):
        w.close()
        return None
    return w


def run_kept(path: str, spec: RunSpec, terms: dict[str, object], alive: int, back: Back | None = None) -> None:
    """The kept run's process: the run's carrier -- this host's runner,
    (terms["slurm"]: its srun options) the srun of its Slurm job, or
    (terms["hosts"]) its reservations on several hosts -- and the stand-in
    reading its stream; returns when both are done. `alive`: the run's
    lock, held for its life; `back`: a run here back from waiting away."""
    from ..config import HostConfig, state_dir_from_env

    state_dir = state_dir_from_env()
    config = HostConfig.load(state_dir=state_dir)
    lease = terms.get("lease_s")
    spec.kept = float(lease) if isinstance(lease, (int, float)) else kept.LEASE_S
    log_max = terms.get("log_max")
    log = kept.KeptLog(path, int(log_max) if isinstance(log_max, int) else kept.KEPT_MAX_BYTES, resume=back is not None)
    slurm, reach = terms.get("slurm"), terms.get("hosts")
    if isinstance(slurm, list):
        _in_slurm(path, spec, terms, log, config, [str(o) for o in slurm])
    elif isinstance(reach, dict):
        _late_bound(path, spec, terms, log, reach)
    else:
        _here(path, spec, terms, log, config, state_dir, Away(alive, config.away_look, back))


def _in_slurm(path: str, spec: RunSpec, terms: dict[str, object], log: kept.KeptLog, config: HostConfig,
              options: list[str]) -> None:
    """A Slurm job's caller: the srun of the job and its relay (a thread,
    transports/slurm), as `slotq run --slurm` has them; the stand-in, here,
    reads what the relay sends. Should this process die, the job's
    sentinel cancels the job, as for any caller of Slurm's."""
    from ..transports.slurm import SlurmTransport

    transport = SlurmTransport(config, options=options)
    ctl_w, ev_r = transport.start(spec)
    try:
        StandIn(path, log, ctl_w, terms, Clock(), spec.run_id, "slurm").run(ev_r)
    finally:
        transport.wait()
        os.close(ctl_w)
        os.close(ev_r)


def _late_bound(path: str, spec: RunSpec, terms: dict[str, object], log: kept.KeptLog,
                reach: dict[str, object]) -> None:
    """The caller of a run late-bound over several hosts: their ssh
    sessions and the relay (a thread, transports/bound.py), as `slotq run
    --host A,B,C` has them; the stand-in, here, reads what the relay sends.
    Should this process die, every ssh session closes and each host
    withdraws its reservation, as for any caller's."""
    from ..errors import HostUnavailable
    from ..transports.bound import LateBound
    from ..transports.kept import Reach

    bound = None
    try:
        # Checked again as it is read back: the request file is ours, but a file.
        bound = LateBound(Reach.from_dict(reach).transports())
        bound.prepare(spec)
        ctl_w, ev_r = bound.start(spec)
    except (HostUnavailable, ValueError) as e:  # no host could be used: the run ends so, in its log
        ctl_w, ev_r = _ended(str(e), bound.host if bound is not None else "several hosts")
    try:
        StandIn(path, log, ctl_w, terms, Clock(), spec.run_id, bound.host if bound else "several hosts").run(ev_r)
    finally:
        if bound is not None:
            bound.wait()
        os.close(ctl_w)
        os.close(ev_r)


def _ended(message: str, host: str) -> tuple[int, int]:
    """A stream that says the run could not be had (hello, then the
    error), and a channel nobody reads (a word said there fails, unheard:
    StandIn._say)."""
    import time

    from ..records import to_json

    ev_r, ev_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    hello = {"event": protocol.HELLO, "at": time.time(), "protocol": protocol.PROTOCOL_VERSION, "host": host}
    error = {"event": protocol.ERROR, "at": time.time(), "kind": "unavailable", "message": message}
    os.write(ev_w, protocol.MAGIC + b"".join(protocol.frame(protocol.EVENT, to_json(ev).encode())
                                             for ev in (hello, error)))
    os.close(ev_w)
    os.close(ctl_r)
    return ctl_w, ev_r


def _here(path: str, spec: RunSpec, terms: dict[str, object], log: kept.KeptLog, config: HostConfig,
          state_dir: str, away: Away) -> None:
    """This host's runner in this thread, the stand-in in another. Far
    back in a slow line, the process may wait away (StandIn._go_away)."""
    import _thread

    from ..host.runner import Arrival, HostRunner

    ctl_r, ctl_w = os.pipe()
    out_r, out_w = os.pipe()
    stand_in = StandIn(path, log, ctl_w, terms, Clock(), spec.run_id, os.uname().nodename, away)
    rec = stand_in.recorder
    back = away.back
    arrival = Arrival(ticket=back.ticket if back is not None else None, came_back=back is not None,
                      wait_closer=(lambda: _closer(rec)) if rec is not None else None,
                      may_go_away=back is None or back.looking)
    done = _thread.allocate_lock()
    done.acquire()

    def read() -> None:
        try:
            stand_in.run(out_r)
        finally:
            done.release()

    start_thread(_thread.start_new_thread, read, ())
    runner = HostRunner(spec, state_dir=state_dir, config=config, in_fd=ctl_r, out_fd=out_w, arrival=arrival)
    try:
        runner.run()
    finally:
        runner.close_stream()
        done.acquire()
