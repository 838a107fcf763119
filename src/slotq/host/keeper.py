"""The keeper's life, in the forked process (process.py forks it).

    forked ──► waiting (standby: for its turn, then the slot) ──► started ──► ending ──► ended
       │                 │ a stop: the line left, nothing ran               (a stop: TERM, grace, KILL)
       └─ set-up failed: said so, nothing ran

What the keeper needs after the fork was loaded before it (the plan, its
modules, prctl): no import on the way to the command's start. What the
spawn call needs is built while the keeper waits, when that costs nothing:
between the slot's release and posix_spawn there is no Python work.

A stop (the runner's SIGTERM, or the kernel's parent-death signal) is one
stop however many signals bring it: the parent-death signal comes again
each time the kernel hands the keeper on to another dying thread of a
caller. During the slot wait it is an exception out of flock(2), raised
once; while the command runs the keeper takes signals one at a time
(sigwaitinfo), so a stop and the command's end never both half happen.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

from .. import procinfo
from .. import signals as signal
from ..errors import SlotqError
from ..outcome import KEEP_PLACE
from ..records import to_json
from . import libc
from .child import ChildEnd
from .drain import drained, wait_resumed
from .line import wait_turn
from .slot import open_slot_file, still_at_path, write_record
from .terminate import terminate_group, yield_cpu

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .process import KeeperPlan, Standby

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# How the runner asks a keeper to stop (and how it learns its runner is gone).
STOP_SIGNALS = {signal.SIGTERM, signal.SIGHUP}
MARKER = os.fsencode(procinfo.MARKER)  # in the command's environment: how its processes are found
# Reset to default in the command: Python ignores SIGPIPE (and we SIGINT).
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGXFSZ, signal.SIGQUIT)

_prctl: Any = None
_stopping = False  # a stop is being handled


def preload_for_start() -> None:
    """Load prctl(2) from libc (libc.py: without importing ctypes, which
    would cost about 1.6 ms on the path of every command's start), before
    the fork: a fork of a threaded process (a runner is a thread of its
    caller) must not dlopen -- another thread may have held the loader's
    lock at the fork. A waiting runner does it while it waits."""
    global _prctl
    if _prctl is None:
        _prctl = libc.function("prctl") or False


class _Stop(Exception):
    pass


class _SetupFailed(Exception):
    """The command cannot be set up (work dir, slot file): nothing runs."""


def _raise_stop(signum: int, frame: object) -> None:
    global _stopping
    if _stopping:
        return  # the same stop again (a second _Stop would cut the first one's handling short)
    _stopping = True
    raise _Stop()


class Keeper:
    """One keeper: its plan, its pipe to the runner (`done_w`), and what it
    learns on the way (the slot lock, the command's leader)."""

    def __init__(self, plan: KeeperPlan, done_w: int, runner_pid: int) -> None:
        self.plan = plan
        self.done_w = done_w
        self.runner_pid = runner_pid
        # True until we have tried to start the command or told the runner why not.
        self.before_start = True
        self.record = plan.books.record  # the holder record, completed once the command runs
        self.inherit_fds = plan.streams.inherit_fds
        self.lock_fd = -1
        self.keeper_start = 0  # our start time (procinfo), for the holder record
        self.leader = -1
        self.started_at = 0.0
        self.spawn: tuple[list[bytes], dict[bytes, bytes], list[tuple[int, int, int]]] = ([], {}, [])

    def run(self) -> int:
        """The keeper's life; its exit code."""
        devnull = self._become_keeper()
        if os.getppid() != self.runner_pid:
            # The runner died before PDEATHSIG was armed: nothing was started.
            self._leave_line()
            _orphan_history(self.plan, None, "its keeper found it gone before the command started")
            return 1
        try:
            self._prepare(devnull)
            if self.plan.standby is not None:
                if not self._wait_for_slot():
                    self._stopped_in_line()
                    return 0
        except _SetupFailed as e:
            self.setup_failed(str(e))
            return 1
        exec_errno = self._start()
        if exec_errno is not None:
            self._tell_exec_failed(exec_errno)
            return 0
        status, stopped = self._watch()
        self._finish(status, stopped)
        return 0

    # -- forked --

    def _become_keeper(self) -> int:
        """Our own session, name, signals and descriptors; /dev/null's fd."""
        try:
            os.setsid()  # out of the caller's process group: `kill -9 -PGID` spares us
        except OSError:
            pass
        _name_self()
        # A stop request (blocked since before the fork) stays pending
        # until the slot wait, or the command's watch, takes it.
        signal.signal(signal.SIGTERM, _raise_stop)
        signal.signal(signal.SIGHUP, _raise_stop)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # taken by _command_end, never lost
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
        streams = self.plan.streams
        keep = {devnull, self.done_w, streams.stdout_fd, streams.stderr_fd, *self.inherit_fds}
        ticket = self.plan.standby.ticket if self.plan.standby is not None else None
        for maybe in (streams.stdin_fd, self.plan.books.ack_fd, ticket[0] if ticket is not None else None):
            if maybe is not None:
                keep.add(maybe)
        _close_all_but(keep)
        return devnull

    def _prepare(self, devnull: int) -> None:
        """Everything the command's start needs, ready before the wait, so
        that nothing but posix_spawn stands between the slot's release and
        the command (posix_spawn: vfork + exec in C, no Python in the
        child): its own session and group; default signal handling; empty
        mask."""
        command, streams = self.plan.command, self.plan.streams
        for fd in self.inherit_fds:
            os.set_inheritable(fd, True)  # the slot lock: the command holds it too
        if command.cwd:
            try:
                os.chdir(command.cwd)
            except OSError as e:
                raise _SetupFailed(f"cannot enter the work dir {command.cwd}: {e.strerror}") from None
        if command.env is not None and "PATH" in command.env:
            os.environ["PATH"] = command.env["PATH"]  # posix_spawnp searches our PATH
        actions = [(os.POSIX_SPAWN_DUP2, devnull if streams.stdin_fd is None else streams.stdin_fd, 0),
                   (os.POSIX_SPAWN_DUP2, streams.stdout_fd, 1), (os.POSIX_SPAWN_DUP2, streams.stderr_fd, 2)]
        # Arguments and environment as bytes in a plain dict: os.environ is a
        # Python-level mapping that would decode and re-encode every variable
        # during the spawn call.
        argv = [os.fsencode(a) for a in command.argv]
        env = {os.fsencode(k): os.fsencode(v) for k, v in (os.environ if command.env is None else command.env).items()}
        if command.run_id is not None:
            env[MARKER] = os.fsencode(command.run_id)
        for k, v in command.slot_env.items():
            env[os.fsencode(k)] = os.fsencode(v)
        self.spawn = (argv, env, actions)
        if self.record is not None and self.plan.books.slot_path is not None:
            self.keeper_start = procinfo.own_start()

    # -- waiting --

    def _wait_for_slot(self) -> bool:
        """Standby: wait for our turn in line, then for the slot, in
        flock(2) -- the kernel grants the lock at the holder's release and
        the command starts at once. True with the slot held; False if a
        stop came first."""
        standby = self.plan.standby
        assert standby is not None
        try:
            # Made if it is not there yet: a keeper behind others can start
            # before any run of the pool has been at the head.
            self.lock_fd = open_slot_file(standby.lock_path)
        except (OSError, SlotqError) as e:
            raise _SetupFailed(f"cannot open the slot file: {e}") from None
        # We are a fork of the runner: every page we write first is copied
        # then (copy-on-write), about 60 page faults on the way from the
        # release to the command. Take them now, while waiting costs nothing:
        # a throw-away pass over what the spawn call will touch.
        _prefault(*self.spawn)
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            if standby.ticket is not None:
                wait_turn(standby.ticket[1], standby.ticket[2], [standby.lock_path])  # first in line: the head's turn
                if standby.tell_head is not None:
                    signal.signal(signal.SIGALRM, lambda signum, frame: _tell(self.done_w, b"head\n"))
                    signal.setitimer(signal.ITIMER_REAL, standby.tell_head)  # flock resumes after it (PEP 475)
            self._take_slot(standby)
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            if standby.tell_head is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
            os.set_inheritable(self.lock_fd, True)  # the command holds the slot (open_state sets O_CLOEXEC)
            self.inherit_fds = (*self.inherit_fds, self.lock_fd)
        except _Stop:
            if standby.tell_head is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)  # no `head` once done_w is closed (its number reused)
            return False
        return True

    def _take_slot(self, standby: Standby) -> None:
        """Wait for the slot's lock, in the kernel; with it, look whether
        the pool is drained (drain.py): then let it go and wait for the
        resume, in our place, and wait for the lock again."""
        while True:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)  # the wait: in the kernel, no CPU
            while not still_at_path(self.lock_fd, standby.lock_path):
                # The slot file was replaced while we waited on it: the lock
                # we got is on a file nobody else will look at. Wait again,
                # on the slot's file now.
                os.close(self.lock_fd)
                self.lock_fd = open_slot_file(standby.lock_path)
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
            if standby.drain is None or not drained(*standby.drain):
                return
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
            wait_resumed(*standby.drain)

    def _stopped_in_line(self) -> None:
        """Never started. The wait is over (the runner asked, or it is
        gone): our ticket goes too; exiting releases a lock got just now."""
        self._leave_line()
        _tell(self.done_w, b"stopped=1")
        self._told()
        history = self.plan.books.history
        kept = history is not None and history[1].get("kept") is not None
        _last_word(self, None, "left the queue before getting a slot" + ("" if kept else f"; {KEEP_PLACE}"),
                   time.time())

    # -- started --

    def _start(self) -> int | None:
        """Start the command; tell the runner and leave the line. The errno
        if it could not be started."""
        argv, env, actions = self.spawn
        exec_errno: int | None = None
        try:
            self.leader = os.posix_spawnp(argv[0], argv, env, file_actions=actions, setsid=True, setsigmask=(),
                                          setsigdef=_DEFAULT_SIGNALS)
        except OSError as e:
            exec_errno = e.errno or errno.ENOEXEC
            script = _located(argv[0]) if exec_errno == errno.ENOEXEC else None
            if script is not None:
                # A file of no executable format (a script without `#!`): as
                # execvp(3) does -- and so timeout, env, xargs and the shells --
                # run it with /bin/sh. (posix_spawnp stopped doing so in glibc.)
                try:
                    self.leader = os.posix_spawn(b"/bin/sh", [b"/bin/sh", script, *argv[1:]], env,
                                                 file_actions=actions, setsid=True, setsigmask=(),
                                                 setsigdef=_DEFAULT_SIGNALS)
                    exec_errno = None
                except OSError as e2:
                    exec_errno = e2.errno or errno.ENOEXEC
        self.before_start = False
        self.started_at = time.time()
        started = b"started=%r,%r,%d\n" % (self.started_at, time.monotonic(), self.leader)
        books = self.plan.books
        if self.record is not None and books.slot_path is not None and self.inherit_fds and exec_errno is None:
            # Who holds the slot, written before our ticket goes: nobody is the
            # head behind us until then, so nobody judges a stale record. Through
            # the lock's own descriptor: a descriptor of our own would wake the
            # head's watch when it closes, for nothing.
            record = dict(self.record, keeper=os.getpid(), keeper_start=self.keeper_start, cmd=self.leader,
                          cmd_start=procinfo.start_ticks(self.leader))
            if self.lock_fd >= 0:
                record["since"] = time.time()
            self.record = record
            _write_record(self.inherit_fds[-1], to_json(record))
        ticket = self.plan.standby.ticket if self.plan.standby is not None else None
        if ticket is not None:  # out of the line: the successor is the head now
            _unlink(ticket[1])
            os.close(ticket[0])
        _tell(self.done_w, started)
        streams = self.plan.streams
        for fd in (streams.stdout_fd, streams.stderr_fd, streams.stdin_fd):
            if fd is not None:
                os.close(fd)
        for fd in self.inherit_fds:
            os.close(fd)  # only the command keeps the slot lock beyond us
        return exec_errno

    def _tell_exec_failed(self, exec_errno: int) -> None:
        # ENOENT for a file that is there: its #! line names an interpreter
        # that is not (the runner then says so, not "command not found").
        there = exec_errno == errno.ENOENT and _located(self.spawn[0][0]) is not None
        _tell(self.done_w, b"execfail=%d" % exec_errno + (b" interpreter=missing" if there else b""))

    def _watch(self) -> tuple[int, bool]:
        """Until the command's leader ends, or a stop comes (then: ending,
        its group TERM, grace, KILL). Its wait status, and whether we
        stopped it."""
        status = _command_end(self.leader)
        if status is None:  # a stop came first
            slot_path = self.plan.books.slot_path
            if self.record is not None and slot_path is not None:
                try:
                    fd = os.open(slot_path, os.O_RDWR | os.O_CLOEXEC)
                except OSError:
                    pass
                else:
                    _write_record(fd, to_json(dict(self.record, phase="stopping")))
                    os.close(fd)
            return terminate_group(self.leader, self.plan.command.grace, leader_is_child=True), True
        # The leader ended; end what it left behind, quietly. From here on
        # all that is left is bookkeeping: the next holder's command, whose
        # slot was freed just now, should have the CPU first.
        yield_cpu()
        terminate_group(self.leader, self.plan.command.grace, leader_is_child=False)
        return status, False

    # -- ended --

    def _finish(self, status: int, stopped: bool) -> None:
        _tell(self.done_w, b"status=%d" % status + (b" stopped=1" if stopped else b""))
        os.close(self.done_w)  # end-of-file: the runner reads our report now
        _last_word(self, status, "the command's group was ended by its keeper" if stopped
                   else "the command ended, but its runner vanished before recording the run", self.started_at)

    def setup_failed(self, why: str) -> None:
        """The keeper cannot set the command up: say so (the runner reports
        it as slotq's failure, `unavailable`), leave the line, start
        nothing."""
        self._leave_line()
        _tell(self.done_w, b"setup=" + why.encode("utf-8", "replace").hex().encode())
        self._told()

    def _leave_line(self) -> None:
        if self.plan.standby is not None and self.plan.standby.ticket is not None:
            _unlink(self.plan.standby.ticket[1])

    def _told(self) -> None:
        """The runner has our last report: end-of-file on the pipe."""
        self.before_start = False
        os.close(self.done_w)


def _command_end(leader: int) -> int | None:
    """Wait for the command's leader to end: its wait status, or None if a
    stop came first. The stop signals and SIGCHLD stay blocked and are
    taken one at a time (sigwaitinfo): a stop that comes as the command
    ends is the one or the other, never half of both -- as a handler's
    exception, raised after the leader was reaped, would make it."""
    while True:
        pid, status = os.waitpid(leader, os.WNOHANG)
        if pid:
            return status
        if signal.sigwaitinfo({signal.SIGCHLD, *STOP_SIGNALS}).si_signo != signal.SIGCHLD:
            return None


def _last_word(keeper: Keeper, status: int | None, what: str, waited_until: float) -> None:
    """Make sure the run has a history line: wait for the runner's word that
    it wrote one (a byte on the ack pipe); if it died first, write it here,
    and close the caller's queue wait (`wait_end`) at `waited_until`."""
    books = keeper.plan.books
    if books.ack_fd is None:
        if os.getppid() != keeper.runner_pid:  # gone, not merely asking us to stop
            _orphan_history(keeper.plan, status, what)
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second stop must not cut this short
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        acked = os.read(books.ack_fd, 1) == b"1"
    except OSError:
        acked = False
    if not acked:
        _orphan_history(keeper.plan, status, what)  # first: the run's own record
        if books.wait_end is not None:
            books.wait_end(min(waited_until, time.time()))


def _orphan_history(plan: KeeperPlan, status: int | None, what: str) -> None:
    """Our runner is gone: nobody else will record how the run ended. Do it
    (outcome caller_gone)."""
    if plan.books.history is None:
        return
    from .. import history as hist

    state_dir, record = plan.books.history
    phases = dict(record.get("phases") or {})  # type: ignore[call-overload]
    phases["ended"] = time.time()
    code = None if status is None else ChildEnd(status, None, True).exit_code
    hist.append(state_dir, hist.run_record(
        run_id=record.get("run_id"), label=record.get("label"), cls=record.get("class"), host=record.get("host"),
        pool=record.get("pool"), slot=record.get("slot") if phases.get("slot") is not None else None,
        ticket=record.get("ticket"), budget=record.get("budget"), kept=record.get("kept"),
        outcome="caller_gone", exit_code=code, phases=phases,
        message=f"caller gone (its host runner vanished); {what}"))


def _set_prctl(option: int, value: int) -> bool:
    if not _prctl:
        return False
    return bool(_prctl(option, value, 0, 0, 0) == 0)


def _name_self() -> None:
    """Call ourselves `slotq-keeper` (our comm): how the next head knows a
    slot's command is still watched (orphans.supervised) -- a name only
    our own user can give us, unlike anything in the shared state dir."""
    try:
        fd = os.open("/proc/self/comm", os.O_WRONLY)
    except OSError:
        return
    try:
        os.write(fd, procinfo.KEEPER_NAME)
    except OSError:
        pass
    finally:
        os.close(fd)


def _located(name: bytes) -> bytes | None:
    """The executable file posix_spawnp took for `name` (a path, or
    searched in PATH as it searches), None if there is none: the script to
    retry through /bin/sh, or the file whose #! interpreter is missing."""
    candidates = [name] if b"/" in name else [os.path.join(os.fsencode(d or "."), name)
                                               for d in os.environ.get("PATH", "/usr/bin:/bin").split(":")]
    return next((path for path in candidates if os.path.isfile(path) and os.access(path, os.X_OK)), None)


def _tell(fd: int, report: bytes) -> None:
    try:
        os.write(fd, report)
    except OSError:
        pass  # EPIPE: the runner is gone; our history line says how it ended


def _write_record(fd: int, text: str) -> None:
    """Rewrite the holder record in place (our command holds the slot)."""
    try:
        write_record(fd, text.encode())
    except OSError:
        pass  # the record is for display and healing; the lock is what counts


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
