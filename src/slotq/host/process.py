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

The runner builds the keeper's plan (`KeeperPlan`) before the fork and
hands it over whole; the keeper (keeper.py, a small state machine) imports
nothing after it. The command itself is started with posix_spawn (no
Python between fork and exec), with `SLOTQ_RUN_ID=<run id>` in its
environment. A standby keeper (`Standby`) first waits for the slot in
flock(2), as flock(1) does, and starts the command the moment the kernel
grants it.
A keeper that is itself killed is noticed by its runner (end-of-file with no
report), which ends the command's processes itself (orphans.py); if the
runner is gone too, the next in line does (see orphans.py).

Stopping is one policy, `terminate_group` (terminate.py): TERM to the
group, `grace` seconds, then KILL. The keeper reports how the leader ended through a pipe
whose end-of-file also tells the runner that everything is gone.
"""

from __future__ import annotations

import gc
import os

from .. import signals as signal
from .child import Child
from .keeper import MARKER, STOP_SIGNALS, Keeper, preload_for_start

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Command", "Streams", "Standby", "Books", "KeeperPlan", "spawn", "preload_for_start", "MARKER"]


class Command:
    """What to start: `argv` in `cwd` (None: ours) with `env` (None: ours),
    plus `SLOTQ_RUN_ID=<run_id>` (how its processes are found if the
    keeper is killed) and `slot_env` (SLOTQ_POOL, SLOTQ_SLOT,
    SLOTQ_SLOT_INDEX, SLOTQ_BUDGET); `grace`: seconds between TERM and
    KILL when its group is ended."""

    __slots__ = ("argv", "cwd", "env", "run_id", "slot_env", "grace")

    def __init__(self, argv: list[str], cwd: str | None = None, env: dict[str, str] | None = None,
                 run_id: str | None = None, slot_env: dict[str, str] | None = None, grace: float = 10.0) -> None:
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.run_id = run_id
        self.slot_env = slot_env or {}
        self.grace = grace


class Streams:
    """The command's descriptors: `stdout_fd`/`stderr_fd` become its fd 1
    and 2, `stdin_fd` its fd 0 (None: /dev/null) -- all three closed here
    after the fork; `inherit_fds` stay open in it (the slot lock)."""

    __slots__ = ("stdout_fd", "stderr_fd", "stdin_fd", "inherit_fds")

    def __init__(self, stdout_fd: int, stderr_fd: int, stdin_fd: int | None = None,
                 inherit_fds: tuple[int, ...] = ()) -> None:
        self.stdout_fd = stdout_fd
        self.stderr_fd = stderr_fd
        self.stdin_fd = stdin_fd
        self.inherit_fds = inherit_fds


class Standby:
    """A keeper that waits for the slot (`lock_path`, a slot file) itself,
    blocked in flock(2) as flock(1) would be: the kernel grants the lock at
    the holder's release and the command starts at once, with no wake-up
    and no Python on the way. SIGTERM before that simply ends the wait.
    `ticket` (fd, path, seq): the waiter's ticket, which the keeper keeps;
    it first waits for every ticket ahead to go (`ticket.wait_turn`), and
    withdraws its own right after the command's start, so the successor
    moves up at once. With `tell_head` (seconds), it reports `head` once no
    ticket has been ahead for that long and the slot is still not free (a
    quiet run's runner reports from then on); a head that gets the slot
    sooner -- in a moving line, every one -- wakes nobody for it.
    `drain`: (state dir, pool), whose drain the keeper honours (drain.py)."""

    __slots__ = ("lock_path", "ticket", "tell_head", "drain")

    def __init__(self, lock_path: str, ticket: tuple[int, str, int] | None = None,
                 tell_head: float | None = None, drain: tuple[str, str] | None = None) -> None:
        self.lock_path = lock_path
        self.ticket = ticket
        self.tell_head = tell_head
        self.drain = drain


class Books:
    """What the keeper records. `record` with `slot_path`: the holder
    record it writes there once the command has started (adding its own
    and the command's pid and start time), marked `stopping` when it ends
    the command on request. `history` (state dir, record so far): if the
    runner vanishes, the keeper writes the run's history line itself
    (outcome caller_gone); with `wait_end` it also closes the caller's
    queue wait in its wait ledger, at the moment the runner was found gone
    (or the command's start, if that came first). `ack_fd` (a pipe's read
    end): after its last report the keeper waits there for the runner's
    one byte saying it recorded the run; end-of-file without it means the
    runner died first."""

    __slots__ = ("record", "slot_path", "history", "ack_fd", "wait_end")

    def __init__(self, record: dict[str, object] | None = None, slot_path: str | None = None,
                 history: tuple[str, dict[str, object]] | None = None, ack_fd: int | None = None,
                 wait_end: Callable[[float], None] | None = None) -> None:
        self.record = record
        self.slot_path = slot_path
        self.history = history
        self.ack_fd = ack_fd
        self.wait_end = wait_end


class KeeperPlan:
    """Everything one keeper is to do, built by the runner before the fork
    and given to the keeper whole."""

    __slots__ = ("command", "streams", "standby", "books")

    def __init__(self, command: Command, streams: Streams, standby: Standby | None = None,
                 books: Books | None = None) -> None:
        self.command = command
        self.streams = streams
        self.standby = standby
        self.books = books or Books()


def spawn(plan: KeeperPlan) -> Child:
    """Start the plan's command in its own session under a keeper process
    (in a session of its own too, so a kill of the caller's process group
    spares it). The keeper holds nothing else of ours open. It reports
    `started=<wall>,<monotonic>,<command pid>` on its pipe in every case,
    then how the command ended (child.py). Raises OSError if the keeper
    cannot fork."""
    preload_for_start()
    done_r, done_w = os.pipe()
    runner_pid = os.getpid()
    # A stop request must reach the keeper's own handler, never the
    # runner's that a fork inherits: blocked here, it stays pending in the
    # keeper until its handlers are set. (A runner in a thread of the
    # caller has them blocked for good: signals.start_thread.)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    if pid == 0:  # keeper
        code = 1
        keeper = None
        try:
            # A collection would walk every object we share with the runner
            # and copy their pages (copy-on-write); the keeper makes no
            # garbage worth collecting before it exits.
            gc.disable()
            os.close(done_r)
            keeper = Keeper(plan, done_w, runner_pid)
            code = keeper.run()
        except BaseException as e:
            if keeper is not None and keeper.before_start:
                # An error of our own before the command started: said as
                # such. Silence would read as a kill of the keeper.
                keeper.setup_failed(f"its keeper failed before the command started ({type(e).__name__}: {e})")
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(done_w)
    streams = plan.streams
    for fd in (streams.stdout_fd, streams.stderr_fd, streams.stdin_fd):
        if fd is not None:
            os.close(fd)
    return Child(pid, done_r, lingers=plan.books.ack_fd is not None)
