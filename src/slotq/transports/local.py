"""This machine is the host: the local transport.

It runs the host side in a forked child -- no second Python
interpreter to start -- and talks to it over two pipes, exactly as a remote
runner is talked to over ssh: the same framed stream, and the same liveness
rule (the runner's stdin closing means the caller is gone).
"""

from __future__ import annotations

import os
import sys
import time

from .. import signals as signal
from ..config import HostConfig
from ..spec import RunSpec
from .base import Transport

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ..host.launch import Early
    from ..host.ticket import Ticket


_unreaped: set[int] = set()


def _reap_done() -> None:
    for pid in list(_unreaped):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _unreaped.discard(pid)


def _ignore(signum: int, frame: object) -> None:
    pass


class LocalTransport(Transport):
    """This machine is the host.

    The host side runs in a thread of the caller's process (`in_process`,
    the default): no second process to fork, COW-fault and reap on every run
    -- on two cores that is a good part of a hand-over's CPU. The caller's
    liveness is then its own: if the process dies, the thread dies with it,
    the kernel drops its ticket, and its keeper (whose parent thread is
    gone: PDEATHSIG) ends the command's group. `in_process=False` forks the
    host side into a child instead, as `slotq host run` is a process of its
    own on a remote host.
    """

    def __init__(self, state_dir: str | None = None, config: HostConfig | None = None, *,
                 in_process: bool = True, away: bool = False) -> None:
        """`away`: the caller may wait away (transports/away.py) -- only `slotq
        run` itself, whose process can be replaced and started again from
        its command line."""
        from ..config import state_dir_from_env

        self.state_dir = state_dir or state_dir_from_env()
        self.config = config or HostConfig.load(state_dir=self.state_dir)
        self.host = os.uname().nodename
        self.in_process = in_process
        self.pid = 0
        self._done: Any = None  # the thread's lock, released when it has finished
        self._killed = False
        self._failure = ""  # why the in-process runner failed, if it did
        self._ticket: Ticket | None = None  # taken early (reserve), for the runner to adopt
        self._early: Early | None = None  # what start_early did with it, for the runner to carry on
        self._wait_closer: Callable[[], Callable[[float], None]] | None = None  # keep_wait_end
        self.away = away and in_process
        self.came_back = False  # this process is a run that waited away and came back
        self.may_go_again = False  # ... and, if still far back, may go away again (not woken by a cancel)

    def reserve(self, spec: RunSpec) -> None:
        """Take the run's place in line now, before the client and the
        runner are loaded: the ticket then marks when the caller arrived
        (about 10 ms into its start-up, rather than 20), and callers that
        arrive close together line up as they arrived. The runner adopts it
        (`in_process` only: a forked runner takes its own). Anything out of
        the ordinary -- an unknown class, no state directory yet, the
        admission limits, an error -- leaves the ticket to the runner,
        which reports it as it always does."""
        if not self.in_process or self._ticket is not None:
            return
        if self.came_back:
            return  # its ticket is adopted already (come_back)
        try:
            pool = self.config.pool_for(spec.cls)
        except KeyError:
            return
        from ..host.ticket import run_info, take_early

        now = time.time()
        self._ticket = take_early(self.state_dir, pool, run_info(spec, self.config, now), self.config.waiting_limits,
                                  slots=self.config.pools.get(pool, 0))
        if self._ticket is not None:
            self.queued_since = now

    def start_early(self, spec: RunSpec) -> None:
        """The client is loaded: with a ticket at the head of its line and a
        slot free, the command starts now (launch.start_now), while the
        runner loads in its thread, which then carries the run on."""
        if self._ticket is None:
            return
        from ..host.launch import start_now

        self._early = start_now(spec, self.config, self.state_dir, self._ticket)
        if self._early is not None:
            self._ticket = None  # the runner takes it from there (the run started, or its waiter)

    def come_back(self, spec: RunSpec) -> None:
        """A run that waited away (transports/away.py) starts again: it takes back
        its ticket -- its place in line -- and its run id, and the time it
        joined the line. A stop signal that brought it back is taken as
        one sent to this run now. Raises UsageError if the environment
        says it comes back with a ticket that is not its own."""
        if "SLOTQ_AWAY" not in os.environ and "SLOTQ_AWAY_STOP" not in os.environ:
            return  # (every local run asks: no import for the answer)
        from .. import signals
        from . import away

        # Should the shell not have unblocked the stop signals (it does, once
        # its traps are set): one pending now is a stop of this run (early).
        signals.pthread_sigmask(signals.SIG_UNBLOCK, {signals.SIGTERM, signals.SIGINT, signals.SIGHUP})
        try:
            back = away.back(self.state_dir)
        except away.BackError as e:
            from ..errors import UsageError

            raise UsageError(f"cannot take back the run's place in line: {e}") from None
        if back is None:
            return
        from ..host.away import SIGUSR1

        signals.signal(SIGUSR1, _ignore)  # `slotq cancel`'s wake-up, if it comes late; default in the command
        info = back.ticket.info
        run_id, since = info.get("run_id"), info.get("since")
        if isinstance(run_id, str):
            spec.run_id = run_id
        self._ticket = back.ticket
        self.came_back = True
        self.may_go_again = back.looking
        self.queued_since = float(since) if isinstance(since, (int, float)) else time.time()
        if back.stop is not None:
            signals.early.append(back.stop)

    def go_away(self, ev: dict[str, object], *, recorder: Any, stops: list[int]) -> str:
        if not self.away or not self.in_process:
            return "not a local run of `slotq run`"
        from . import away

        ticket_fd, ahead_fd, path, slot = ev.get("ticket_fd"), ev.get("ahead_fd"), ev.get("ticket"), ev.get("slot")
        busy = ev.get("busy", [])
        if not isinstance(ticket_fd, int) or not isinstance(ahead_fd, int) or not isinstance(path, str) \
                or not isinstance(slot, str) or not isinstance(busy, list) \
                or not all(isinstance(fd, int) for fd in busy):
            return "a malformed away event"
        left = ev.get("max_wait_s")
        from ..host.ticket import Ticket

        look = self.config.away_look
        if isinstance(left, (int, float)):
            look = min(look, float(left))  # back at the end of --max-wait, to be turned away
        gone = {"run_id": recorder.run_id, "ledger": recorder.path, "workdir": recorder.workdir,
                "host": recorder.host}
        return away.go(Ticket(path, ticket_fd, 0, "", {}), ahead_fd, look, gone, stopped=stops, busy=busy,
                       slot=slot)

    def keep_wait_end(self, make_closer: Callable[[], Callable[[float], None]]) -> None:
        """The runner's standby keeper (a fork of this process, in a session
        of its own) closes the run's queue wait if the caller dies in line."""
        self._wait_closer = make_closer

    def start(self, spec: RunSpec) -> tuple[int, int]:
        _reap_done()
        ctl_r, ctl_w = os.pipe()
        ev_r, ev_w = os.pipe()
        if self.in_process:
            import _thread

            done = self._done = _thread.allocate_lock()
            done.acquire()
            ticket, self._ticket = self._ticket, None
            early, self._early = self._early, None
            signal.start_thread(_thread.start_new_thread, self._host_side, (spec, ctl_r, ev_w, done, ticket, early))
            return ctl_w, ev_r
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(ctl_w)
                os.close(ev_r)
                # Do not hold the caller's stdin/stdout: a reader of the
                # caller's output must see EOF when the caller is gone.
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                os.close(devnull)
                self._host_side(spec, ctl_r, ev_w, None, None)
                code = 0
            finally:
                os._exit(code)  # never return into the caller's code
        os.close(ctl_r)
        os.close(ev_w)
        self.pid = pid
        return ctl_w, ev_r

    def _host_side(self, spec: RunSpec, ctl_r: int, ev_w: int, done: Any, ticket: Ticket | None = None,
                   early: Early | None = None) -> None:
        runner = None
        try:
            from ..host.runner import Arrival, HostRunner

            may_go_away = self.away and done is not None and (self.may_go_again or not self.came_back)
            arrival = Arrival(None, ticket, early, self._wait_closer, may_go_away=may_go_away,
                              came_back=self.came_back)
            runner = HostRunner(spec, state_dir=self.state_dir, config=self.config, in_fd=ctl_r, out_fd=ev_w,
                                arrival=arrival)
            runner.run()
        except BaseException as e:
            why = (f"{e.strerror}" + (f" ({e.filename})" if e.filename else "") if isinstance(e, OSError)
                   and e.strerror else f"{type(e).__name__}: {e}")
            self._failure = f"it failed: {why}"
            if done is None:  # a child: the caller cannot read our memory; our stderr is its
                try:
                    sys.stderr.write(f"slotq: host runner failed: {why}\n")
                    sys.stderr.flush()
                except BaseException:
                    pass
        finally:
            if runner is not None:
                runner.close_stream()
            else:
                if ticket is not None:
                    ticket.withdraw()
                if early is not None and early.launch is not None:
                    early.launch.end()  # its keeper records the run itself
                elif early is not None:
                    early.waiter.withdraw()
                os.close(ev_w)
            os.close(ctl_r)
            if done is not None:
                done.release()

    def kill(self) -> None:
        # The runner went silent. A child: SIGKILL it; its keeper then ends
        # the command's group (PDEATHSIG) and the slot is released. A
        # thread: the caller's channel closes when run() returns, and the
        # runner ends the command when it sees that.
        self._killed = True
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self) -> str:
        if self._done is not None:
            # The thread has sent its result and closed the stream; it is
            # writing the history line. Wait for that (bounded), not for a
            # runner that went silent.
            done, self._done = self._done, None
            if not self._killed and not done.acquire(timeout=10):
                return "the host runner did not finish its bookkeeping within 10 s"
            return self._failure
        # A child may still be tidying up: reap it now if it is done, else
        # at the next start (a CLI process simply exits; init reaps).
        if self.pid:
            _unreaped.add(self.pid)
            self.pid = 0
        _reap_done()
        return ""
