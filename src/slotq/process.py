"""Running one command so that nothing of it outlives its run.

    runner ──fork──► keeper ──posix_spawn──► command (own session = own process group)

The keeper is a forked copy of the runner (no new interpreter). It exists so
that the command's whole process group is taken down whatever happens to the
runner:

- the runner asks it to stop the command with SIGTERM;
- if the runner dies (even by SIGKILL) the kernel sends the keeper SIGTERM
  (PR_SET_PDEATHSIG), and it does the same;
- it is a child subreaper, so descendants that leave the group (setsid,
  double fork) are re-parented to it and can be found and ended too;
- after the command's leader exits, leftovers of the group are ended, because
  they would otherwise keep the inherited slot lock -- and the slot -- busy.

The command itself is started with posix_spawn (no Python between fork and
exec). A standby keeper (`lock_path`) first waits for the slot in flock(2),
as flock(1) does, and starts the command the moment the kernel grants it.
What this does not cover: a keeper that is itself SIGKILLed leaves its
command running (holding the slot until it exits, so still no overlap).

Stopping is one policy, `terminate_group`: TERM to the group, `grace`
seconds, then KILL. The keeper reports how the leader ended through a pipe
whose end-of-file also tells the runner that everything is gone.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import time

from . import signals as signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# How the runner asks a keeper to stop (and how it learns its runner is gone).
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGHUP}
# Reset to default in the command: Python ignores SIGPIPE (and we SIGINT).
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGXFSZ, signal.SIGQUIT)

_prctl: Any = None


def _set_prctl(option: int, value: int) -> bool:
    global _prctl
    if _prctl is None:
        _prctl = _load_prctl()
    if not _prctl:
        return False
    return bool(_prctl(option, value, 0, 0, 0) == 0)


def preload_for_start() -> None:
    """Load what starting a command needs (prctl) ahead of time: a waiting
    runner does this while it waits, so its hand-over does not."""
    global _prctl
    if _prctl is None:
        _prctl = _load_prctl()


def _load_prctl() -> Any:
    """prctl(2) from libc. Built on `_ctypes`, the C core of ctypes: importing
    `ctypes` itself costs about 1.6 ms here, on the path of every command's
    start; this takes 0.4 ms. Falls back to `ctypes` (then to nothing)."""
    try:
        import _ctypes

        class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]
            _type_ = "i"

        class _Fn(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = _Int

        return _Fn(_ctypes.dlsym(_ctypes.dlopen(None), "prctl"))  # type: ignore[arg-type]
    except (ImportError, AttributeError, OSError, TypeError):
        pass
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop()


class ChildEnd:
    """How a command ended: `status` is its raw wait status, or `exec_errno`
    is set when it could not be started at all."""

    __slots__ = ("status", "exec_errno", "stopped")

    def __init__(self, status: int | None, exec_errno: int | None, stopped: bool) -> None:
        self.status = status
        self.exec_errno = exec_errno
        self.stopped = stopped  # ended by terminate_group on request

    @property
    def exit_code(self) -> int:
        """Shell convention: the exit code, or 128 + signal number."""
        if self.exec_errno is not None:
            return 127 if self.exec_errno == errno.ENOENT else 126
        assert self.status is not None
        if os.WIFSIGNALED(self.status):
            return 128 + os.WTERMSIG(self.status)
        return os.waitstatus_to_exitcode(self.status)

    @property
    def signal(self) -> int | None:
        if self.status is not None and os.WIFSIGNALED(self.status):
            return os.WTERMSIG(self.status)
        return None


class Child:
    """A running command, seen from the runner."""

    def __init__(self, keeper_pid: int, done_fd: int) -> None:
        self.keeper_pid = keeper_pid
        self.done_fd = done_fd  # readable (EOF) when the keeper has finished
        self._report = b""
        self.end: ChildEnd | None = None
        # With a slot to wait for (spawn(lock_path=...)): when the keeper got
        # it and started the command (wall, monotonic), else None.
        self.started: tuple[float, float] | None = None

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
            if self.started is None and b"\n" in self._report:
                line, self._report = self._report.split(b"\n", 1)
                wall, mono = line.split(b"=", 1)[1].split(b",")
                self.started = (float(wall), float(mono))
            return False
        os.close(self.done_fd)
        os.waitpid(self.keeper_pid, 0)
        self.end = _parse_report(self._report)
        return True


def _parse_report(raw: bytes) -> ChildEnd:
    fields = dict(part.split(b"=", 1) for part in raw.split() if b"=" in part)
    stopped = fields.get(b"stopped") == b"1"
    if b"execfail" in fields:
        return ChildEnd(None, int(fields[b"execfail"]), stopped)
    if b"status" in fields:
        return ChildEnd(int(fields[b"status"]), None, stopped)
    # The keeper died without a word (killed): treat as killed.
    return ChildEnd(signal.SIGKILL, None, stopped)


def spawn(
    argv: list[str],
    *,
    cwd: str | None,
    env: dict[str, str] | None,
    stdout_fd: int,
    stderr_fd: int,
    inherit_fds: tuple[int, ...] = (),
    grace: float = 10.0,
    stdin_fd: int | None = None,
    lock_path: str | None = None,
    record: dict[str, object] | None = None,
    ticket: tuple[int, str, int] | None = None,
    history: tuple[str, dict[str, object]] | None = None,
) -> Child:
    """Start `argv` in its own session under a keeper process.

    `stdout_fd`/`stderr_fd` become the command's fd 1 and 2, `stdin_fd` its
    fd 0 (None: /dev/null); all three are closed here after the fork.
    `inherit_fds` stay open in the command (the slot lock). The keeper holds
    nothing else of ours open. Raises OSError if the keeper cannot fork.

    With `lock_path` (a slot file), the keeper first waits for that slot
    itself, blocked in flock(2) as flock(1) would be: the kernel grants the
    lock at the holder's release and the command starts at once, with no
    wake-up and no Python on the way. It then writes `record` (plus `since`)
    as the holder record and reports `started=<wall>,<monotonic>` first.
    SIGTERM before that simply ends the wait. `ticket` (fd, path, seq):
    the waiter's ticket, which the keeper keeps; it first waits for every
    ticket ahead to go (`ticket.wait_turn`), and withdraws its own (unlink,
    close) right after the command's start, so the successor moves up at once.
    `history` (state dir, record so far): if the runner vanishes (killed, or
    the caller's process it was a thread of), the keeper ends the command
    and writes the run's history line itself.
    """
    done_r, done_w = os.pipe()
    runner_pid = os.getpid()
    # A stop request must reach the keeper's own handler, never the
    # runner's that a fork inherits: blocked here, it stays pending in the
    # keeper until its handlers are set (or goes to another of our threads).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    if pid == 0:  # keeper
        code = 1
        try:
            # A collection would walk every object we share with the runner
            # and copy their pages (copy-on-write); the keeper makes no
            # garbage worth collecting before it exits.
            gc.disable()
            os.close(done_r)
            code = _keeper(argv, cwd, env, stdout_fd, stderr_fd, stdin_fd, inherit_fds, grace,
                           done_w, runner_pid, lock_path, record, ticket, history)
        except BaseException:
            pass
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(done_w)
    for fd in (stdout_fd, stderr_fd, stdin_fd):
        if fd is not None:
            os.close(fd)
    return Child(pid, done_r)


def _keeper(
    argv: list[str],
    cwd: str | None,
    env: dict[str, str] | None,
    stdout_fd: int,
    stderr_fd: int,
    stdin_fd: int | None,
    inherit_fds: tuple[int, ...],
    grace: float,
    done_w: int,
    runner_pid: int,
    lock_path: str | None,
    record: dict[str, object] | None,
    ticket: tuple[int, str, int] | None,
    history: tuple[str, dict[str, object]] | None,
) -> int:
    stopped = False
    # A stop request (blocked since before the fork) stays pending until
    # the `try` below, where it is handled.
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        signal.set_wakeup_fd(-1)  # the runner's wake-up pipe is not ours
    except ValueError:
        pass
    _set_prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    _set_prctl(PR_SET_CHILD_SUBREAPER, 1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        # The runner's channel or the caller's own terminal or pipes (the
        # runner may be a thread of the caller's process): hold them and a
        # reader would not see EOF when the caller is gone.
        os.dup2(devnull, fd)
    # Hold nothing else of the runner's: a copy of its ticket, of a pending
    # lock of its waiting threads or of its slot probes would keep those
    # locks -- and the line -- held until we exit.
    keep = {devnull, done_w, stdout_fd, stderr_fd, *inherit_fds}
    if ticket is not None:
        keep.add(ticket[0])
    if stdin_fd is not None:
        keep.add(stdin_fd)
    _close_all_but(keep)
    if os.getppid() != runner_pid:
        return 1  # the runner died before PDEATHSIG was armed

    # Everything the command's start needs is ready before the wait below,
    # so that nothing but posix_spawn stands between the slot's release and
    # the command (posix_spawn: vfork + exec in C, no Python in the child).
    # Its own session and group; default signal handling; empty mask.
    for fd in inherit_fds:
        os.set_inheritable(fd, True)  # the slot lock: the command holds it too
    if cwd:
        os.chdir(cwd)
    if env is not None and "PATH" in env:
        os.environ["PATH"] = env["PATH"]  # posix_spawnp searches our PATH
    actions = [(os.POSIX_SPAWN_DUP2, devnull if stdin_fd is None else stdin_fd, 0),
               (os.POSIX_SPAWN_DUP2, stdout_fd, 1), (os.POSIX_SPAWN_DUP2, stderr_fd, 2)]
    # Arguments and environment as bytes in a plain dict: os.environ is a
    # Python-level mapping that would decode and re-encode every variable
    # during the spawn call.
    spawn_argv = [os.fsencode(a) for a in argv]
    spawn_env = {os.fsencode(k): os.fsencode(v) for k, v in (os.environ if env is None else env).items()}
    lock_fd = -1
    if lock_path is not None:
        from .records import to_json  # now, not after the command's start
        from .ticket import wait_turn

        lock_fd = os.open(lock_path, os.O_RDWR)
        os.set_inheritable(lock_fd, True)  # the command holds the slot (os.open sets O_CLOEXEC)
        inherit_fds = (*inherit_fds, lock_fd)
        # We are a fork of the runner: every page we write first is copied
        # then (copy-on-write), about 60 page faults on the way from the
        # release to the command. Take them now, while waiting costs nothing:
        # a throw-away pass over what the spawn call will touch.
        _prefault(spawn_argv, spawn_env, actions)
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
            if ticket is not None:
                wait_turn(ticket[1], ticket[2])  # first in line: the head's turn
            fcntl.flock(lock_fd, fcntl.LOCK_EX)  # the wait: in the kernel, no CPU
            signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        except _Stop:
            # Never started. The wait is over (the runner asked, or it is
            # gone): our ticket goes too; exiting releases a lock got just now.
            if ticket is not None:
                _unlink(ticket[1])
            _orphan_history(history, runner_pid, None, "left the queue before getting a slot")
            os.write(done_w, b"stopped=1")
            return 0
    exec_errno: int | None = None
    leader = -1
    try:
        leader = os.posix_spawnp(spawn_argv[0], spawn_argv, spawn_env, file_actions=actions,
                                 setsid=True, setsigmask=(), setsigdef=_DEFAULT_SIGNALS)
    except OSError as e:
        exec_errno = e.errno or errno.ENOENT
    if ticket is not None:  # out of the line: the successor is the head now
        _unlink(ticket[1])
        os.close(ticket[0])
    if lock_fd >= 0:
        started = b"started=%r,%r\n" % (time.time(), time.monotonic())
        if record is not None:
            data = to_json(dict(record, since=time.time())).encode()
            os.ftruncate(lock_fd, 0)  # we hold the lock: safe to truncate
            os.pwrite(lock_fd, data, 0)
        os.write(done_w, started)
    for passed in (stdout_fd, stderr_fd, stdin_fd):
        if passed is not None:
            os.close(passed)
    for fd in inherit_fds:
        os.close(fd)  # only the command keeps the slot lock beyond us
    if exec_errno is not None:
        os.write(done_w, b"execfail=%d" % exec_errno)
        return 0

    report = b""
    status: int | None = None
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        _, status = os.waitpid(leader, 0)
        report = b"status=%d" % status
    except _Stop:
        stopped = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        status = terminate_group(leader, grace, leader_is_child=True)
        report = b"status=%d" % status
        _orphan_history(history, runner_pid, status, "the command's group was ended by its keeper")
    else:
        # The leader ended; end what it left behind, quietly. From here on
        # all that is left is bookkeeping: the next holder's command, whose
        # slot was freed just now, should have the CPU first.
        _yield_cpu()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        terminate_group(leader, grace, leader_is_child=False)
    os.write(done_w, report + (b" stopped=1" if stopped else b""))
    return 0


def _orphan_history(history: tuple[str, dict[str, object]] | None, runner_pid: int, status: int | None,
                    what: str) -> None:
    """If our runner is gone (not merely asking us to stop), nobody else will
    record how the run ended: do it (outcome caller_gone)."""
    if history is None or os.getppid() == runner_pid:
        return
    from . import history as hist

    state_dir, record = history
    phases = dict(record.get("phases") or {})  # type: ignore[call-overload]
    phases["ended"] = time.time()
    code = None if status is None else ChildEnd(status, None, True).exit_code
    hist.append(state_dir, dict(record, outcome="caller_gone", exit_code=code, phases=phases,
                                message=f"caller gone (its host runner vanished); {what}"))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _prefault(argv: list[bytes], env: dict[bytes, bytes], actions: list[tuple[int, int, int]]) -> None:
    """Touch (and so copy, in a fork) the objects and allocator pages that
    the spawn call will: build and drop what posix_spawn builds."""
    scratch = [k + b"=" + v for k, v in env.items()] + [a + b"" for a in argv] + [tuple(a) for a in actions]
    del scratch
    try:  # its keyword parser initialises on the first call: make that this one
        os.posix_spawnp(argv[0], [], env, file_actions=actions, setsid=True, setsigmask=(),
                        setsigdef=_DEFAULT_SIGNALS)
    except ValueError:
        pass  # "argv must not be empty": refused before anything is started


def _close_all_but(keep: set[int]) -> None:
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 256))
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the directory listing's own descriptor, already gone


def _yield_cpu() -> None:
    try:
        os.nice(10)
    except OSError:
        pass


def _children() -> list[int]:
    """Our direct children (re-parented orphans included, as subreaper)."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _signal_all(pgid: int, sig: int, skip: set[int] | None = None) -> bool:
    """Signal the group and every child of ours (but those in `skip`, which
    then gets them added); True if anything was there."""
    found = False
    try:
        os.killpg(pgid, sig)
        found = True
    except (ProcessLookupError, PermissionError):
        pass
    for child in _children():
        if skip is not None:
            if child in skip:
                continue
            skip.add(child)
        try:
            os.kill(child, sig)
            found = True
        except ProcessLookupError:
            pass
    return found


def _reap() -> dict[int, int]:
    reaped: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = status


def terminate_group(leader: int, grace: float, *, leader_is_child: bool) -> int:
    """End the command's group and our other descendants: TERM (+CONT, so a
    stopped process can act on it), up to `grace` seconds, then KILL.

    Returns the leader's wait status when it is still our child to reap
    (SIGKILL's status if it vanished unseen), else 0.
    """
    status: int | None = None
    termed: set[int] = set()
    if _signal_all(leader, signal.SIGTERM, termed):
        _signal_all(leader, signal.SIGCONT)
    end = time.monotonic() + grace
    delay = 0.002
    while True:
        reaped = _reap()
        if leader_is_child and leader in reaped:
            status = reaped[leader]
        if not _alive(leader):
            break
        if end != float("inf"):
            # Descendants that left the group (setsid) reach us as orphans
            # only once their parent is gone: they get their TERM then.
            for child in _children():
                if child not in termed:
                    termed.add(child)
                    for sig in (signal.SIGTERM, signal.SIGCONT):
                        try:
                            os.kill(child, sig)
                        except ProcessLookupError:
                            pass
        if time.monotonic() >= end:
            _signal_all(leader, signal.SIGKILL)
            end = float("inf")
        time.sleep(delay)  # product code: bounded back-off while processes exit
        delay = min(delay * 2, 0.05)
    if status is None and leader_is_child:
        status = signal.SIGKILL  # raw status of a SIGKILLed process
    return status or 0


def _alive(pgid: int) -> bool:
    """Anything left of the group, or any unreaped child of ours?"""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        pass
    except PermissionError:
        return True
    return bool(_children())
