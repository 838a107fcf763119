"""The runner's view of a keeper (process.py): the report it reads on the
keeper's done pipe, and what it makes of it; and the command's output,
streamed to the caller until the command ends, under its budget (`pump`).

A standby keeper asked to (`tell_head`) writes `head` once no ticket has
been ahead of its own for a while. The keeper writes
`started=<wall>,<monotonic>,<command pid>` once the command runs, then one
report and end-of-file: `status=<wait status>`, `execfail=<errno>` (with
` interpreter=missing` for a file whose #! interpreter is not there), or
`setup=<hex message>` (it could not set the command up); ` stopped=1` when
it ended the command on request. End-of-file with no
report means the keeper itself was killed (`ChildEnd.lost`).
"""

from __future__ import annotations

import errno
import os
import select

from .. import protocol
from .. import signals as signal
from ..outcome import Outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..clock import Clock
    from .callerlink import CallerLink


class ChildEnd:
    """How a command ended: `status` is its raw wait status, or `exec_errno`
    is set when it could not be started at all, or `lost`: the keeper died
    without a word (killed), and how the command ended is unknown."""

    __slots__ = ("status", "exec_errno", "stopped", "lost", "setup_error", "no_interpreter")

    def __init__(self, status: int | None, exec_errno: int | None, stopped: bool, lost: bool = False,
                 setup_error: str | None = None, no_interpreter: bool = False) -> None:
        self.status = status
        self.exec_errno = exec_errno
        self.no_interpreter = no_interpreter  # the file is there; the interpreter its #! line names is not
        self.stopped = stopped  # ended by terminate_group on request
        self.lost = lost
        # The keeper could not set the command up (work dir, slot file):
        # nothing ran; slotq's own failure, never the command's.
        self.setup_error = setup_error

    @property
    def exit_code(self) -> int:
        """Shell convention: the exit code, or 128 + signal number."""
        if self.exec_errno is not None:
            return 127 if self.exec_errno == errno.ENOENT else 126
        if self.status is None:
            return 128 + signal.SIGKILL  # lost: not a code of the command's
        if os.WIFSIGNALED(self.status):
            return 128 + os.WTERMSIG(self.status)
        return os.waitstatus_to_exitcode(self.status)

    @property
    def signal(self) -> int | None:
        if self.status is not None and os.WIFSIGNALED(self.status):
            return os.WTERMSIG(self.status)
        return None

    def describe(self, program: str) -> str:
        """How the command `program` ended, in words (`slotq run` and
        `slotq task` say it alike)."""
        if self.exec_errno is not None:
            if self.no_interpreter:  # (127, as bash: "cannot execute: required file not found")
                return f"cannot execute: {program!r}: the interpreter its #! line names is not found"
            what = "command not found" if self.exit_code == 127 else "cannot execute"
            return f"{what}: {program!r} ({os.strerror(self.exec_errno)})"
        sig = self.signal
        return f"command killed by signal {sig}" if sig else f"command exited {self.exit_code}"


def unrunnable(program: str, cwd: str, path: str | None = None) -> int | None:
    """Why the command `program` cannot start here, as execvp would find
    it (a name searched in `path`, default $PATH; one with a slash taken
    relative to `cwd`): ENOENT, EACCES (a directory, or no execute right),
    or None if it can. Checked before a run joins the line, by the
    caller here or by the host's runner (a `--prepare` step may make the
    program: not then)."""
    import stat

    if "/" in program:
        candidates = [os.path.join(cwd, program)]
    else:
        dirs = (os.environ.get("PATH", "/usr/bin:/bin") if path is None else path).split(":")
        candidates = [os.path.join(cwd if not d else os.path.join(cwd, d), program) for d in dirs]
    found = errno.ENOENT
    for candidate in candidates:
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and os.access(candidate, os.X_OK):
            return None
        found = errno.EACCES  # there, but not a program we may run: execvp goes on, then says so
    return found


class Child:
    """A running command, seen from the runner."""

    def __init__(self, keeper_pid: int, done_fd: int, lingers: bool = False) -> None:
        self.keeper_pid = keeper_pid
        # With an ack pipe the keeper outlives its report until the runner
        # has written the history line: reap it then (reap()), not here.
        self._lingers = lingers
        self.done_fd = done_fd  # readable (EOF) when the keeper has finished
        self._reaped = False
        self._report = b""
        self.end: ChildEnd | None = None
        # When the keeper started the command (wall, monotonic), else None.
        self.started: tuple[float, float] | None = None
        self.cmd_pid: int | None = None  # the command's leader (= its session)
        self.cmd_start: int | None = None  # and its start time, if seen alive
        self.at_head = False  # a standby keeper said no ticket is ahead (`tell_head`)

    def stop(self) -> None:
        """Ask the keeper to end the command's group (TERM, grace, KILL)."""
        if self.end is None:
            try:
                os.kill(self.keeper_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def on_readable(self) -> bool:
        """Read the keeper's report; True once the keeper is done."""
        chunk = os.read(self.done_fd, 256)
        if chunk:
            self._report += chunk
            while self.started is None and b"\n" in self._report:
                line, self._report = self._report.split(b"\n", 1)
                if line == b"head":
                    self.at_head = True
                    continue
                wall, mono, pid = line.split(b"=", 1)[1].split(b",")
                self.started = (float(wall), float(mono))
                self.cmd_pid = int(pid)
                if self.cmd_pid > 0:
                    from ..procinfo import start_ticks

                    self.cmd_start = start_ticks(self.cmd_pid)
            return False
        os.close(self.done_fd)
        self.end = _parse_report(self._report)
        if not self._lingers:
            self.reap()
        return True

    def reap(self) -> None:
        """Reap the keeper process (once it has reported, and -- with an ack
        pipe -- been told the run is recorded, it exits). If it has not quite
        exited yet, a small thread waits for it: a caller must not wait for
        a keeper at nice 10 to be scheduled (under load that cost a fifth
        of the throughput of 200 callers)."""
        if self._reaped:
            return
        self._reaped = True
        try:
            pid, _ = os.waitpid(self.keeper_pid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            import _thread

            signal.start_thread(_thread.start_new_thread, _reap_one, (self.keeper_pid,))


def _reap_one(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _parse_report(raw: bytes) -> ChildEnd:
    fields = dict(part.split(b"=", 1) for part in raw.split() if b"=" in part)
    stopped = fields.get(b"stopped") == b"1"
    if b"setup" in fields:
        try:
            why = bytes.fromhex(fields[b"setup"].decode()).decode("utf-8", "replace")
        except ValueError:
            why = "the keeper could not set the command up"
        return ChildEnd(None, None, stopped, setup_error=why)
    if b"execfail" in fields:
        return ChildEnd(None, int(fields[b"execfail"]), stopped,
                        no_interpreter=fields.get(b"interpreter") == b"missing")
    if b"status" in fields:
        return ChildEnd(int(fields[b"status"]), None, stopped)
    # The keeper died without a word (killed): how the command ended, if
    # it even did, nobody knows. The runner deals with it (orphans.py).
    return ChildEnd(None, None, stopped, lost=True)


# A running command becomes reachable by `slotq cancel` after this long:
# nobody cancels a run by hand sooner, and a run that ends first never pays
# for the socket module (about 0.5 ms of start-up, on every run).
CONTROL_AFTER = 0.1


def pump(link: CallerLink, clock: Clock, child: Child, streams: dict[int, bytes], limit: float,
         end_lost: Callable[[Child], None]) -> tuple[ChildEnd, Outcome | None]:
    """Stream the command's output until it ends; the limit starts now.
    `end_lost`: what to do when its keeper was killed (end its processes).
    Returns how it ended, and why slotq stopped it (None: it ended)."""
    timer = clock.timer("budget", limit)
    reason: Outcome | None = None
    done = False
    control_at = clock.monotonic() + CONTROL_AFTER
    while not done or streams:
        now = clock.monotonic()
        if not link.control_tried and now >= control_at:
            link.listen_for_cancel()
        fds = list(streams)
        if not done:
            fds.append(child.done_fd)
        fds += link.fds()
        timeout = None if reason is not None else max(0.0, timer.remaining(now))
        if not link.control_tried:
            timeout = max(0.0, control_at - now) if timeout is None else min(timeout, max(0.0, control_at - now))
        ready, _, _ = select.select(fds, [], [], timeout)
        if reason is None and timer.remaining(clock.monotonic()) <= 0:
            reason = Outcome.EXEC_TIMEOUT
            child.stop()
        for fd in ready:
            if fd in streams:
                chunk = os.read(fd, 65536)
                if chunk:
                    link.send(protocol.frame(streams[fd], chunk))
                else:
                    os.close(fd)
                    del streams[fd]
            elif fd == child.done_fd:
                done = child.on_readable()
                if done and child.end is not None and child.end.lost:
                    end_lost(child)  # its output pipes close as its processes go
        ended = link.check(ready)
        if ended is not None and reason is None:
            reason = ended
            child.stop()
        for fd in [fd for fd, kind in streams.items() if kind in link.closed]:
            # The caller's reader is gone (`slotq run ... | head`): close
            # our end, so the command meets EPIPE/SIGPIPE as it would
            # without slotq, and ends its own way.
            os.close(fd)
            del streams[fd]
    assert child.end is not None
    return child.end, reason
