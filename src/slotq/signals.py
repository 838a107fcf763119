"""The signal API without the `signal` module's start-up cost.

`import signal` builds IntEnums of every signal and handler, which imports
`enum` -- about a quarter of the time budget of `slotq run -- true`
(benchmarks/). The C module underneath, `_signal`, offers the same
functions and constants as plain ints; this module re-exports it, falling
back to `signal` where `_signal` does not exist. Type checkers see `signal`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    T = TypeVar("T")
    from signal import (SIG_BLOCK, SIG_DFL, SIG_IGN, SIG_SETMASK, SIG_UNBLOCK, SIGALRM, SIGCHLD, SIGCONT, SIGHUP,
                        SIGINT, SIGKILL, SIGPIPE, SIGQUIT, SIGSTOP, SIGTERM, SIGXFSZ, ITIMER_REAL, pthread_sigmask,
                        getsignal, set_wakeup_fd, setitimer, sigwaitinfo, signal)
else:
    try:
        from _signal import (SIG_BLOCK, SIG_DFL, SIG_IGN, SIG_SETMASK, SIG_UNBLOCK, SIGALRM, SIGCHLD, SIGCONT, SIGHUP,
                             SIGINT, SIGKILL, SIGPIPE, SIGQUIT, SIGSTOP, SIGTERM, SIGXFSZ, ITIMER_REAL, pthread_sigmask,
                             getsignal, set_wakeup_fd, setitimer, sigwaitinfo, signal)
    except ImportError:  # not CPython
        from signal import (SIG_BLOCK, SIG_DFL, SIG_IGN, SIG_SETMASK, SIG_UNBLOCK, SIGALRM, SIGCHLD, SIGCONT, SIGHUP,
                            SIGINT, SIGKILL, SIGPIPE, SIGQUIT, SIGSTOP, SIGTERM, SIGXFSZ, ITIMER_REAL, pthread_sigmask,
                            getsignal, set_wakeup_fd, setitimer, sigwaitinfo, signal)

__all__ = ["SIG_BLOCK", "SIG_DFL", "SIG_IGN", "SIG_SETMASK", "SIG_UNBLOCK", "SIGALRM", "SIGCHLD", "SIGCONT",
           "SIGHUP", "SIGINT", "SIGKILL", "SIGPIPE", "SIGQUIT", "SIGSTOP", "SIGTERM", "SIGXFSZ", "ITIMER_REAL",
           "pthread_sigmask", "set_wakeup_fd", "setitimer", "sigwaitinfo", "signal", "getsignal", "catch_stops", "hold_stops",
           "early", "stop_name", "stop_word", "word_name", "start_thread", "STOPS"]


STOPS = frozenset({SIGINT, SIGTERM, SIGHUP})  # the stop signals: Ctrl-C, a polite kill, the terminal gone


def catch_stops(handler: object) -> dict[int, object]:
    """`handler` for Ctrl-C (SIGINT), SIGTERM and SIGHUP (the terminal
    closed), but not for a signal we were started with ignored: `nohup`
    ignores SIGHUP and a shell's background jobs ignore SIGINT, and both
    mean "do not stop this". The handlers replaced, to put back."""
    old: dict[int, object] = {}
    for sig in STOPS:
        if getsignal(sig) != SIG_IGN:
            old[sig] = signal(sig, handler)  # type: ignore[arg-type]
    return old


_STOP_NAMES: dict[int, str] = {SIGINT: "Ctrl-C", SIGTERM: "SIGTERM", SIGHUP: "SIGHUP"}


def stop_name(signum: int) -> str:
    """How a cancel names the stop signal that caused it."""
    return _STOP_NAMES.get(signum, "a signal")


# The stop signals as the caller's channel names them (`cancel SIGTERM`): a
# host runner reads any other word but `idle_timeout` as a plain cancel.
_STOP_WORDS: dict[int, str] = {SIGINT: "SIGINT", SIGTERM: "SIGTERM", SIGHUP: "SIGHUP"}


def stop_word(signum: int) -> str | None:
    """The word for a stop signal on the caller's channel."""
    return _STOP_WORDS.get(signum)


def word_name(word: str) -> str | None:
    """How a cancel names the stop signal the channel's `word` stands for
    (`stop_name`), None for any other word."""
    return next((stop_name(num) for num, w in _STOP_WORDS.items() if w == word), None)


# Stop signals that came between `hold_stops()` and the run's own handlers.
early: list[int] = []


def hold_stops() -> dict[int, object]:
    """From `slotq run`'s first line on, until the run sets its own
    handlers (client/caller.py), a stop signal is noted in `early` rather
    than fatal: the run it meant to stop then ends as a cancel, with its
    line and its result, as one a moment later would (a harness's SIGTERM
    to a slotq that has just started). The handlers replaced, to put back."""
    early.clear()
    return catch_stops(_note)


def _note(signum: int, frame: object) -> None:
    early.append(signum)


def start_thread(start: Callable[..., T], *args: object) -> T:
    """`start(*args)` -- a thread's start: `_thread.start_new_thread(...)`,
    `Thread.start` -- with the stop signals blocked, so the thread is born
    with them blocked (it inherits our mask) and keeps them so.

    The kernel gives a signal sent to the process to any thread that does
    not block it, but Python runs its handler only in the main thread, at
    its next bytecode. A SIGTERM taken by a helper thread while the main
    thread sleeps in select() with no timeout is never handled: a caller
    waiting in line ignored its harness's stop for ever (CI, 2026-12-06,
    1 run in 30 under load). Blocked in every other thread, a stop goes to
    the main thread and ends its select() (EINTR), or waits pending while
    the main thread blocks it too (transports/away.py's exec)."""
    held = pthread_sigmask(SIG_BLOCK, STOPS)
    try:
        return start(*args)
    finally:
        pthread_sigmask(SIG_SETMASK, held)
