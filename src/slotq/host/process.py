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

The keeper starts a session of its own at once: a harness that stops a
job with `kill -9 -PGID` (the caller's process group) must not take the
supervision down with the caller. The kernel then tells the keeper its
runner is gone, and it ends the command as above.

The command itself is started with posix_spawn (no Python between fork and
exec), with `SLOTQ_RUN_ID=<run id>` in its environment. A standby keeper
(`lock_path`) first waits for the slot in flock(2), as flock(1) does, and
starts the command the moment the kernel grants it.
A keeper that is itself killed is noticed by its runner (end-of-file with no
report), which ends the command's processes itself (orphans.py); if the
runner is gone too, the next in line does (see orphans.py).

A stop is one stop however many signals bring it (the parent-death signal
comes once for each dying thread of a caller the kernel hands the keeper
on to): during the slot wait it is an exception out of flock(2), raised
once; while the command runs the keeper takes signals one at a time
(sigwaitinfo), so a stop and the command's end never both half happen.

Stopping is one policy, `terminate_group` (terminate.py): TERM to the
group, `grace` seconds, then KILL. The keeper reports how the leader ended through a pipe
whose end-of-file also tells the runner that everything is gone.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import time

from .. import signals as signal
from ..errors import SlotqError
from . import libc
from .child import Child, ChildEnd
from .orphans import KEEPER_NAME
from .terminate import terminate_group

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# How the runner asks a keeper to stop (and how it learns its runner is gone).
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGHUP}
MARKER = b"SLOTQ_RUN_ID"  # in the command's environment: how its processes are found
# Reset to default in the command: Python ignores SIGPIPE (and we SIGINT).
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGXFSZ, signal.SIGQUIT)

_prctl: Any = None
# In a keeper: True until it has tried to start the command or has told its
# runner why not (and closed the pipe it tells it on).
_before_start = True


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
    """prctl(2) from libc (libc.py: without importing ctypes, which would
    cost about 1.6 ms on the path of every command's start), or False."""
    return libc.function("prctl") or False


class _Stop(Exception):
    pass


_stopping = False  # (in the keeper) a stop is being handled


def _raise_stop(signum: int, frame: object) -> None:
    """The keeper's stop handler: one stop, however many signals. The
    parent-death signal comes again each time the kernel hands the keeper
    on to another thread of a dying caller (a runner is a thread of it):
    a second _Stop would cut the first one's handling short -- no history
    line, the wait left open."""
    global _stopping
    if _stopping:
        return
    _stopping = True
    raise _Stop()


def _located(name: bytes) -> bytes | None:
    """The executable file posix_spawnp took for `name` (a path, or
    searched in PATH as it searches), None if there is none: the script to
    retry through /bin/sh, or the file whose #! interpreter is missing."""
    candidates = [name] if b"/" in name else [os.path.join(os.fsencode(d or "."), name)
                                               for d in os.environ.get("PATH", "/usr/bin:/bin").split(":")]
    return next((path for path in candidates if os.path.isfile(path) and os.access(path, os.X_OK)), None)


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
    run_id: str | None = None,
    slot_path: str | None = None,
    ack_fd: int | None = None,
    slot_env: dict[str, str] | None = None,
    tell_head: float | None = None,
    wait_end: Callable[[float], None] | None = None,
) -> Child:
    """Start `argv` in its own session under a keeper process (in a session
    of its own too, so a kill of the caller's process group spares it).

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
    With `tell_head` (seconds), it reports `head` on its pipe once no
    ticket has been ahead for that long and the slot is still not free (a
    quiet run's runner reports from then on). A head that gets the slot
    sooner -- in a moving line, every one -- wakes nobody for it.
    `history` (state dir, record so far): if the runner vanishes (killed, or
    the caller's process it was a thread of), the keeper ends the command
    and writes the run's history line itself; and with `wait_end`, it
    closes the caller's queue wait in its wait ledger, at the moment the
    runner was found gone (or the command's start, if that came first).
    `run_id` goes into the command's environment as `SLOTQ_RUN_ID` (how
    its processes are found if the keeper is killed), and so does
    `slot_env` (SLOTQ_POOL, SLOTQ_SLOT, SLOTQ_SLOT_INDEX, SLOTQ_BUDGET). `slot_path` with
    `record`: the keeper writes the holder record there once the command
    has started (adding its own and the command's pid and start time), and
    marks it `stopping` when it ends the command on request. It reports
    `started=<wall>,<monotonic>,<command pid>` on its pipe in every case.
    `ack_fd` (a pipe's read end): after its last report the keeper waits
    there for the runner's one byte saying it recorded the run; end-of-file
    without it means the runner died first, and the keeper writes the
    run's history line (outcome caller_gone) itself.
    """
    # prctl is found through a dlopen: done here, never in the keeper. A
    # fork of a threaded process (a runner is a thread of its caller) must
    # not dlopen: another thread may have held the loader's lock at the fork.
    preload_for_start()
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
                           done_w, runner_pid, lock_path, record, ticket, history, run_id,
                           slot_path or lock_path, ack_fd, slot_env, tell_head, wait_end)
        except BaseException as e:
            if _before_start:
                # An error of our own before the command started: said as
                # such. Silence would read as a kill of the keeper.
                _setup_failed(done_w, ticket, f"its keeper failed before the command started "
                                              f"({type(e).__name__}: {e})")
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(done_w)
    for fd in (stdout_fd, stderr_fd, stdin_fd):
        if fd is not None:
            os.close(fd)
    return Child(pid, done_r, lingers=ack_fd is not None)


def _name_self() -> None:
    """Call ourselves `slotq-keeper` (our comm): how the next head knows a
    slot's command is still watched (orphans.supervised) -- a name only
    our own user can give us, unlike anything in the shared state dir."""
    try:
        fd = os.open("/proc/self/comm", os.O_WRONLY)
    except OSError:
        return
    try:
        os.write(fd, KEEPER_NAME)
    except OSError:
        pass
    finally:
        os.close(fd)


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
    run_id: str | None,
    slot_path: str | None,
    ack_fd: int | None,
    slot_env: dict[str, str] | None,
    tell_head: float | None = None,
    wait_end: Callable[[float], None] | None = None,
) -> int:
    stopped = False
    try:
        os.setsid()  # out of the caller's process group: `kill -9 -PGID` spares us
    except OSError:
        pass
    _name_self()
    # A stop request (blocked since before the fork) stays pending until
    # the `try` below, where it is handled.
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
    keep = {devnull, done_w, stdout_fd, stderr_fd, *inherit_fds}
    if ticket is not None:
        keep.add(ticket[0])
    if stdin_fd is not None:
        keep.add(stdin_fd)
    if ack_fd is not None:
        keep.add(ack_fd)
    _close_all_but(keep)
    if os.getppid() != runner_pid:
        # The runner died before PDEATHSIG was armed: nothing was started.
        if ticket is not None:
            _unlink(ticket[1])
        _orphan_history(history, None, "its keeper found it gone before the command started")
        return 1

    # Everything the command's start needs is ready before the wait below,
    # so that nothing but posix_spawn stands between the slot's release and
    # the command (posix_spawn: vfork + exec in C, no Python in the child).
    # Its own session and group; default signal handling; empty mask.
    for fd in inherit_fds:
        os.set_inheritable(fd, True)  # the slot lock: the command holds it too
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as e:
            return _setup_failed(done_w, ticket, f"cannot enter the work dir {cwd}: {e.strerror}")
    if env is not None and "PATH" in env:
        os.environ["PATH"] = env["PATH"]  # posix_spawnp searches our PATH
    actions = [(os.POSIX_SPAWN_DUP2, devnull if stdin_fd is None else stdin_fd, 0),
               (os.POSIX_SPAWN_DUP2, stdout_fd, 1), (os.POSIX_SPAWN_DUP2, stderr_fd, 2)]
    # Arguments and environment as bytes in a plain dict: os.environ is a
    # Python-level mapping that would decode and re-encode every variable
    # during the spawn call.
    spawn_argv = [os.fsencode(a) for a in argv]
    spawn_env = {os.fsencode(k): os.fsencode(v) for k, v in (os.environ if env is None else env).items()}
    if run_id is not None:
        spawn_env[MARKER] = os.fsencode(run_id)
    for k, v in (slot_env or {}).items():
        spawn_env[os.fsencode(k)] = os.fsencode(v)
    keeper_start = 0
    if record is not None and slot_path is not None:
        from ..records import to_json  # now, not after the command's start
        from .. import procinfo

        keeper_start = procinfo.own_start()
    lock_fd = -1
    if lock_path is not None:
        from .ticket import wait_turn

        from .slot import open_slot_file, still_at_path

        try:
            # Made if it is not there yet: a keeper behind others can start
            # before any run of the pool has been at the head.
            lock_fd = open_slot_file(lock_path)
        except (OSError, SlotqError) as e:
            return _setup_failed(done_w, ticket, f"cannot open the slot file: {e}")
        # We are a fork of the runner: every page we write first is copied
        # then (copy-on-write), about 60 page faults on the way from the
        # release to the command. Take them now, while waiting costs nothing:
        # a throw-away pass over what the spawn call will touch.
        _prefault(spawn_argv, spawn_env, actions)
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
            if ticket is not None:
                wait_turn(ticket[1], ticket[2], [lock_path])  # first in line: the head's turn
                if tell_head is not None:
                    signal.signal(signal.SIGALRM, lambda signum, frame: _tell(done_w, b"head\n"))
                    signal.setitimer(signal.ITIMER_REAL, tell_head)  # flock resumes after it (PEP 475)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)  # the wait: in the kernel, no CPU
            while not still_at_path(lock_fd, lock_path):
                # The slot file was replaced while we waited on it: the lock
                # we got is on a file nobody else will look at. Wait again,
                # on the slot's file now.
                os.close(lock_fd)
                lock_fd = open_slot_file(lock_path)
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
            if tell_head is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
            os.set_inheritable(lock_fd, True)  # the command holds the slot (open_state sets O_CLOEXEC)
            inherit_fds = (*inherit_fds, lock_fd)
        except _Stop:
            # Never started. The wait is over (the runner asked, or it is
            # gone): our ticket goes too; exiting releases a lock got just now.
            if tell_head is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)  # no `head` once done_w is closed (its number reused)
            if ticket is not None:
                _unlink(ticket[1])
            _tell(done_w, b"stopped=1")
            _told()
            os.close(done_w)  # end-of-file: the runner reads our report now
            _last_word(ack_fd, history, runner_pid, None, "left the queue before getting a slot",
                       wait_end, time.time())
            return 0
    exec_errno: int | None = None
    leader = -1
    try:
        leader = os.posix_spawnp(spawn_argv[0], spawn_argv, spawn_env, file_actions=actions,
                                 setsid=True, setsigmask=(), setsigdef=_DEFAULT_SIGNALS)
    except OSError as e:
        exec_errno = e.errno or errno.ENOEXEC
        script = _located(spawn_argv[0]) if exec_errno == errno.ENOEXEC else None
        if script is not None:
            # A file of no executable format (a script without `#!`): as
            # execvp(3) does -- and so timeout, env, xargs and the shells --
            # run it with /bin/sh. (posix_spawnp stopped doing so in glibc.)
            try:
                leader = os.posix_spawn(b"/bin/sh", [b"/bin/sh", script, *spawn_argv[1:]], spawn_env,
                                        file_actions=actions, setsid=True, setsigmask=(), setsigdef=_DEFAULT_SIGNALS)
                exec_errno = None
            except OSError as e2:
                exec_errno = e2.errno or errno.ENOEXEC
    _told()
    started_at = time.time()
    started = b"started=%r,%r,%d\n" % (started_at, time.monotonic(), leader)
    if record is not None and slot_path is not None and inherit_fds and exec_errno is None:
        # Who holds the slot, written before our ticket goes: nobody is the
        # head behind us until then, so nobody judges a stale record. Through
        # the lock's own descriptor: a descriptor of our own would wake the
        # head's watch when it closes, for nothing.
        record = dict(record, keeper=os.getpid(), keeper_start=keeper_start, cmd=leader,
                      cmd_start=procinfo.start_ticks(leader))
        if lock_fd >= 0:
            record["since"] = time.time()
        _write_record(inherit_fds[-1], to_json(record))
    if ticket is not None:  # out of the line: the successor is the head now
        _unlink(ticket[1])
        os.close(ticket[0])
    _tell(done_w, started)
    for passed in (stdout_fd, stderr_fd, stdin_fd):
        if passed is not None:
            os.close(passed)
    for fd in inherit_fds:
        os.close(fd)  # only the command keeps the slot lock beyond us
    if exec_errno is not None:
        # ENOENT for a file that is there: its #! line names an interpreter
        # that is not (the runner then says so, not "command not found").
        there = exec_errno == errno.ENOENT and _located(spawn_argv[0]) is not None
        _tell(done_w, b"execfail=%d" % exec_errno + (b" interpreter=missing" if there else b""))
        return 0

    status = _command_end(leader)
    if status is None:  # a stop came first
        stopped = True
        if record is not None and slot_path is not None:
            try:
                fd = os.open(slot_path, os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                pass
            else:
                _write_record(fd, to_json(dict(record, phase="stopping")))
                os.close(fd)
        status = terminate_group(leader, grace, leader_is_child=True)
    else:
        # The leader ended; end what it left behind, quietly. From here on
        # all that is left is bookkeeping: the next holder's command, whose
        # slot was freed just now, should have the CPU first.
        _yield_cpu()
        terminate_group(leader, grace, leader_is_child=False)
    _tell(done_w, b"status=%d" % status + (b" stopped=1" if stopped else b""))
    os.close(done_w)  # end-of-file: the runner reads our report now
    _last_word(ack_fd, history, runner_pid, status,
               "the command's group was ended by its keeper" if stopped
               else "the command ended, but its runner vanished before recording the run", wait_end, started_at)
    return 0


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
        if signal.sigwaitinfo({signal.SIGCHLD, *_STOP_SIGNALS}).si_signo != signal.SIGCHLD:
            return None


def _setup_failed(done_w: int, ticket: tuple[int, str, int] | None, why: str) -> int:
    """The keeper cannot set the command up: say so (the runner reports it
    as slotq's failure, `unavailable`), leave the line, start nothing."""
    if ticket is not None:
        _unlink(ticket[1])
    _tell(done_w, b"setup=" + why.encode("utf-8", "replace").hex().encode())
    _told()
    os.close(done_w)
    return 1


def _told() -> None:
    global _before_start
    _before_start = False


def _tell(fd: int, report: bytes) -> None:
    try:
        os.write(fd, report)
    except OSError:
        pass  # EPIPE: the runner is gone; our history line says how it ended


def _last_word(ack_fd: int | None, history: tuple[str, dict[str, object]] | None, runner_pid: int,
               status: int | None, what: str, wait_end: Callable[[float], None] | None = None,
               waited_until: float = 0.0) -> None:
    """Make sure the run has a history line: wait for the runner's word that
    it wrote one (a byte on `ack_fd`); if it died first, write it here, and
    close the caller's queue wait (`wait_end`) at `waited_until`."""
    if ack_fd is None:
        if os.getppid() != runner_pid:  # gone, not merely asking us to stop
            _orphan_history(history, status, what)
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second stop must not cut this short
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    try:
        acked = os.read(ack_fd, 1) == b"1"
    except OSError:
        acked = False
    if not acked:
        _orphan_history(history, status, what)  # first: the run's own record
        if wait_end is not None:
            wait_end(min(waited_until, time.time()))


def _orphan_history(history: tuple[str, dict[str, object]] | None, status: int | None, what: str) -> None:
    """Our runner is gone: nobody else will record how the run ended. Do it
    (outcome caller_gone)."""
    if history is None:
        return
    from .. import history as hist

    state_dir, record = history
    phases = dict(record.get("phases") or {})  # type: ignore[call-overload]
    phases["ended"] = time.time()
    code = None if status is None else ChildEnd(status, None, True).exit_code
    hist.append(state_dir, hist.run_record(
        run_id=record.get("run_id"), label=record.get("label"), cls=record.get("class"), host=record.get("host"),
        pool=record.get("pool"), slot=record.get("slot"), outcome="caller_gone", exit_code=code, phases=phases,
        message=f"caller gone (its host runner vanished); {what}"))


def _write_record(fd: int, text: str) -> None:
    """Rewrite the holder record in place (our command holds the slot)."""
    from .slot import write_record

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


def _yield_cpu() -> None:
    try:
        os.nice(10)
    except OSError:
        pass
