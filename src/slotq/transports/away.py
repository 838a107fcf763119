"""Waiting away, the local transport's side (the host's: host/away.py):
the caller's process -- with its own pid -- becomes a shell while its run
waits far back in a slow line, and slotq again a few places before its
turn.

When the runner offers it (an `away` event), `go` execs a `sh` that waits
in `flock -s` on the ticket AWAY_AHEAD + 1 places ahead, after starting
the watcher (host/away.py). The run's own ticket stays locked on an
inherited descriptor: its place in line, as before. When that ticket goes
(or at a stop signal, `slotq cancel`'s wake-up, or the end of --max-wait
or of [waiting] away_look: `flock -w`), the `sh` execs the run's own command line
again, with the ticket's descriptor in the environment (ENV). The run is parsed from its
own argv, in its own work dir and environment, takes back its ticket
(`back`) and goes on as a run AWAY_AHEAD places from the head -- whose
extra interpreter start is paid while others run. A stop signal the `sh`
caught is raised again once slotq's handlers are in place: `cancelled`, as
ever. A run that comes back ends its watcher first.
"""

from __future__ import annotations

import math
import os
import sys

from .. import signals as signal
from ..host.away import ENV_GONE, MAX_ENV, NAME, program

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..host.ticket import Ticket

ENV = "SLOTQ_AWAY"  # the come-back's ticket (JSON), set by the exec, read once
ENV_STOP = "SLOTQ_AWAY_STOP"  # the signal the sh caught: TERM, INT, HUP, or USR1 (slotq cancel's wake-up)

# The sh's script: descriptor {ahead} is the ticket to wait for, {own} our
# own ticket (closed in flock: a `kill -9` of the sh alone must free our
# place; nor does flock hold the caller's stdout, whose reader must see
# end-of-file when the caller is gone); sh names descriptors by one digit.
# $1: flock, $2: its -w seconds, $3: how many such waits before it looks
# anyway ([waiting] away_look, or the end of --max-wait), $4: the slot's
# file: after each wait, a slot free while the ticket ahead stays is a line
# that stands still (a ticket ahead that does not claim: host/claim.py):
# back, to judge it as a waiter in line does. It looks at the slot only when
# the slot file has not changed since its last wait (a line standing still,
# or one long holder): in a moving line every hand-over rewrites it, and the
# shared looks of a thousand shells, overlapping, kept the head's keeper from
# its exclusive lock of a free slot (a line of 1000 stood still after 21
# runs). $5: the pool's drain file (host/drain.py): while it is there, a
# free slot is the owner's doing, and the line stands still on purpose. The
# rest: the run's command line. A
# signal slotq was started with ignored (nohup's SIGHUP) cannot be trapped
# by sh: it stays ignored. The stop signals come blocked across the exec
# (one sent meanwhile is pending, never lost nor fatal). dash has no way to
# unblock them but this: when it has had to wait for a foreground child
# (the child still ran when it looked), it clears its signal mask. So, once
# the traps are set, a short `sleep` until /proc says nothing is blocked.
# USR1 is ignored across the exec back: slotq sets its own handler at once.
_SCRIPT = """\
# slotq run {run_id} waiting away (slotq status shows its place)
w=
trap 'w=TERM' TERM
trap 'w=INT' INT
trap 'w=HUP' HUP
trap 'w=USR1' USR1
f=$1 t=$2 k=$3 q=$4 d=$5 l=
shift 5
n=0
while [ $n -lt 100 ]; do
  m=
  while read -r x v; do [ "$x" = SigBlk: ] && m=$v; done </proc/$$/status
  case $m in *[1-9a-f]*) ;; *) break ;; esac
  sleep 0.01 </dev/null >/dev/null 2>&1
  n=$((n + 1))
done
while [ -z "$w" ]; do
  "$f" -s -w "$t" {ahead} {own}<&- </dev/null >/dev/null 2>&1 & p=$!
  while :; do wait $p; s=$?; [ -n "$w" ] && break; [ $s -le 128 ] && break; done
  [ -n "$w" ] && kill $p 2>/dev/null
  [ -n "$w" ] || [ $s -eq 0 ] && break
  k=$((k - 1))
  [ $k -le 0 ] && break
  c=$(stat -c %Y "$q" {own}<&- </dev/null 2>/dev/null)
  if [ "$c" = "$l" ] && [ ! -e "$d" ]; then
    "$f" -n -s "$q" true {own}<&- </dev/null >/dev/null 2>&1 && break
  fi
  l=$c
done
exec {ahead}<&-
trap '' USR1
export SLOTQ_AWAY_STOP="$w"
exec "$@"
"""


def _launcher() -> list[str]:
    """How this slotq was started, up to its own arguments: the interpreter,
    its options and the script (`python -S .../slotq`, `python -m slotq`)."""
    orig = list(sys.orig_argv)
    return [sys.executable, *orig[1:len(orig) - len(sys.argv) + 1]]


class Return:
    """How the waiting sh comes back: the `slotq` it runs (how a slotq is
    started: `python -m slotq`) and its `args`."""

    __slots__ = ("slotq", "args")

    def __init__(self, slotq: list[str], args: list[str]) -> None:
        self.slotq, self.args = slotq, args

    @classmethod
    def as_started(cls) -> "Return":
        """This very process again: its launcher and its own arguments."""
        return cls(_launcher(), sys.argv[1:])


def go(ticket: Ticket, ahead_fd: int, look: float, gone: dict[str, str], *, stopped: list[int],
       busy: list[int], slot: str, again: Return | None = None) -> str:
    """Exec the waiting `sh` (never returns), or say why not: a stop signal
    came first (`stopped`: the caller's list of them), or the watcher or
    the exec failed. `look`: come back after at most that many seconds
    (to look again, or at the end of --max-wait); before that, once the
    pool's `slot` (its file) is free at one of the looks LOOK_MOST apart
    (host/claim.py); `gone`: what the watcher
    needs to close the run's wait should it die away (run_id, ledger,
    workdir, host; an empty ledger: no wait of ours to close). Called in
    the caller's main thread (or a kept run's stand-in, client/standin.py);
    the runner thread has blocked the stop signals and waits for `stay` on
    the descriptors `busy`. Back, the sh runs `again` (default: this very
    process, Return.as_started)."""
    flock = program("flock")
    if flock is None:
        return "no flock(1)"
    held = signal.pthread_sigmask(signal.SIG_BLOCK, signal.STOPS)
    watcher = -1
    try:
        if _came(stopped):
            return "a stop signal came"
        again = again or Return.as_started()
        watcher = _watch(flock, ticket.path, again.slotq, **gone)
        from ..records import to_json

        env = dict(os.environ)
        env.pop(ENV_STOP, None)
        own, ahead = digits_for(ticket.fd, ahead_fd, busy)
        env[ENV] = to_json({"fd": own, "path": ticket.path, "watcher": watcher})
        from ..host.claim import LOOK_MOST

        each = min(max(0.0, look), LOOK_MOST)
        looks = max(1, math.ceil(max(0.0, look) / each)) if each > 0 else 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        script = _SCRIPT.format(own=own, ahead=ahead, run_id=_plain(gone["run_id"]))
        from ..host.drain import drain_path

        state_dir, pool = os.path.dirname(os.path.dirname(slot)), os.path.basename(slot).rpartition(".")[0]
        argv = ["sh", "-c", script, NAME, flock, f"{each:.3f}", str(looks), slot, drain_path(state_dir, pool),
                *again.slotq, *again.args]
        saved = _place({own: ticket.fd, ahead: ahead_fd})
        try:
            # The stop signals stay blocked across the exec: one sent from
            # now on is pending, and the sh's trap gets it (_SCRIPT).
            os.execve("/bin/sh", argv, env)
        finally:
            _put_back(saved)
    except OSError as e:
        return f"cannot wait away: {e.strerror or e}"
    finally:  # (only if we stay)
        if watcher > 0:
            end_watcher(watcher)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return "exec returned"  # (never)


def digits_for(ticket_fd: int, ahead_fd: int, busy: list[int]) -> tuple[int, int]:
    """The descriptors from 3 to 9 (sh names descriptors by one digit)
    where the sh gets our ticket and the one to wait for: the very ones
    they are on, if below 10 (the same file stays there), else ones that
    are free or close-on-exec (gone at the exec anyway) -- never one a
    program that started us passed on (a make jobserver's pipe), nor one
    in `busy`: those the runner's thread selects on until the exec. (Its
    caller's pipe replaced by a ticket file under it read as its caller
    gone: the thread withdrew the ticket, and the run came back to a place
    no longer in line, issue 51.)"""
    import fcntl

    usable = []
    for fd in range(3, 10):
        if fd in busy or fd in (ticket_fd, ahead_fd):
            continue
        try:
            if fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                usable.append(fd)
        except OSError:
            usable.append(fd)  # free
    own = ticket_fd if 3 <= ticket_fd <= 9 else (usable.pop(0) if usable else -1)
    ahead = ahead_fd if 3 <= ahead_fd <= 9 else (usable.pop(0) if usable else -1)
    if own < 0 or ahead < 0:
        raise OSError(0, "no two descriptors below 10 to give the shell")
    return own, ahead


def _place(moves: dict[int, int]) -> dict[int, int | None]:
    """dup2 each source onto its target, inherited; what the targets held
    is kept (above 9), to put back should the exec fail."""
    import fcntl

    copies = {dst: fcntl.fcntl(src, fcntl.F_DUPFD_CLOEXEC, 10) for dst, src in moves.items()}
    saved: dict[int, int | None] = {}
    try:
        for dst in moves:
            try:
                saved[dst] = fcntl.fcntl(dst, fcntl.F_DUPFD_CLOEXEC, 10)
            except OSError:
                saved[dst] = None
        for dst, copy in copies.items():
            os.dup2(copy, dst, inheritable=True)
    except OSError:
        _put_back(saved)
        raise
    finally:
        for fd in copies.values():
            os.close(fd)
    return saved


def _put_back(saved: dict[int, int | None]) -> None:
    for dst, old in saved.items():
        if old is None:
            try:
                os.close(dst)
            except OSError:
                pass
        else:
            os.dup2(old, dst, inheritable=False)
            os.close(old)


def _plain(text: str) -> str:
    return "".join(c for c in text if c.isascii() and c.isalnum())[:64]


def _came(stopped: list[int]) -> bool:
    """A function call: the stop signals' Python handlers, pending since
    they were blocked, run on its entry, before the list is read."""
    return bool(stopped)


def _watch(flock: str, path: str, slotq: list[str], **gone: str) -> int:
    """Start the watcher: `flock -x` on a new descriptor of our ticket (the
    lock comes when we die), in a session of its own, holding nothing else
    of ours, then `slotq host away-gone`."""
    from ..records import to_json
    from ..statefile import open_state

    fd, _ = open_state(path, os.O_RDONLY)
    try:
        os.set_inheritable(fd, True)
        env = dict(os.environ)
        env[ENV_GONE] = to_json({"path": path, "fd": fd, **gone})
        env.pop(ENV, None)
        env.pop(ENV_STOP, None)
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, null, 1),
                                              (os.POSIX_SPAWN_DUP2, null, 2)]
            for name in os.listdir("/proc/self/fd"):
                other = int(name)
                if other > 2 and other != fd:
                    try:
                        if os.get_inheritable(other):  # one our own caller passed us (a pipe's end)
                            actions.append((os.POSIX_SPAWN_CLOSE, other))
                    except OSError:
                        pass
            return os.posix_spawn(flock, [flock, "-x", f"/dev/fd/{fd}", *slotq, "host", "away-gone"], env,
                                  file_actions=actions, setsid=True, setsigmask=())
        finally:
            os.close(null)
    finally:
        os.close(fd)


def end_watcher(pid: int) -> None:
    """End our watcher (a child of this process), if it is one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        ppid = -1
    if ppid != os.getpid():
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass


class Back:
    """A run that came back: its ticket, and the stop signal (if any) that
    brought it back. `woken`: by slotq cancel's wake-up (no stop: its
    cancel follows through the control socket). `looking`: by neither (its
    turn nears, or it looks again): it may go away again if it is still
    far back."""

    __slots__ = ("ticket", "stop", "woken")

    def __init__(self, ticket: Ticket, stop: int | None, woken: bool = False) -> None:
        self.ticket = ticket
        self.stop = stop
        self.woken = woken

    @property
    def looking(self) -> bool:
        return self.stop is None and not self.woken


class BackError(Exception):
    """The environment says the run comes back, but its ticket is not ours."""


def back(state_dir: str) -> Back | None:
    """A run coming back (ENV set by `go`'s exec): end its watcher and
    adopt its ticket. Clears ENV and ENV_STOP (never the command's).
    Raises BackError naming what is wrong; None for a run that was never
    away."""
    raw = os.environ.pop(ENV, None)
    stop_word = os.environ.pop(ENV_STOP, None)
    if raw is None:
        return None
    if len(raw) > MAX_ENV:
        raise BackError(f"${ENV} is {len(raw)} bytes long (at most {MAX_ENV})")
    from ..records import from_json

    try:
        what = from_json(raw, max_depth=2)
    except ValueError as e:
        raise BackError(f"${ENV} is not JSON ({e})") from None
    if not isinstance(what, dict) or not all(isinstance(what.get(k), t) and not isinstance(what.get(k), bool)
                                             for k, t in (("fd", int), ("path", str), ("watcher", int))):
        raise BackError(f"${ENV} does not name a ticket (fd, path, watcher)")
    fd, path = int(what["fd"]), str(what["path"])
    if int(what["watcher"]) > 0:
        end_watcher(int(what["watcher"]))
    import fcntl

    from ..host.line import MAX_INFO, pool_dir
    from ..host.ticket import Ticket

    try:
        st = os.fstat(fd)
        named = os.lstat(path)
        if (st.st_dev, st.st_ino) != (named.st_dev, named.st_ino) or st.st_uid != os.getuid():
            raise BackError(f"descriptor {fd} is not our ticket {path}")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: a no-op; another's: refused
        info = from_json(os.pread(fd, MAX_INFO, 0).decode("utf-8", "replace") or "null")
    except (OSError, ValueError) as e:
        raise BackError(f"ticket {path} on descriptor {fd}: {getattr(e, 'strerror', None) or e}") from None
    os.set_inheritable(fd, False)
    pool = info.get("pool") if isinstance(info, dict) else None
    seq = info.get("seq") if isinstance(info, dict) else None
    if (not isinstance(info, dict) or not isinstance(pool, str) or not isinstance(seq, int)
            or os.path.dirname(path) != pool_dir(state_dir, pool)):
        raise BackError(f"ticket {path} is not one of this state dir's ({state_dir})")
    stop = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "HUP": signal.SIGHUP}.get(stop_word or "")
    return Back(Ticket(path, fd, seq, pool, info), stop, woken=stop_word == "USR1")
