"""Waking a waiter when inotify cannot: a thread blocked in flock(2).

Each waiter normally has an inotify instance of its own, but the kernel caps
them per user (fs.inotify.max_user_instances, 128 by default): with hundreds
of waiters, later ones get EMFILE. They fall back to this: a thread that
blocks in the kernel on the lock they are waiting for -- shared on the ticket
just ahead (granted when its owner leaves or dies), exclusive on a slot
(granted when the holder lets go; the lock is then ours to keep, as a
lease). No polling, no CPU while blocked, woken within milliseconds.
"""

from __future__ import annotations

import fcntl
import os
import threading

from ..signals import start_thread


class LockWatch:
    """One blocked flock in a thread; `wake_w` gets a byte when it is granted."""

    def __init__(self, path: str, exclusive: bool, wake_w: int) -> None:
        self.path = path
        self.exclusive = exclusive
        # Slot files are opened read-write so that our eventual close raises
        # IN_CLOSE_WRITE for inotify watchers (see slot.py).
        from ..statefile import open_state

        self.fd, _ = open_state(path, os.O_RDWR if exclusive else os.O_RDONLY)
        self.granted = False
        self._cancelled = False
        self._taken = False
        self._lock = threading.Lock()
        self._wake_w = wake_w
        start_thread(threading.Thread(target=self._wait, name=f"slotq-lockwait {path}", daemon=True).start)

    def _wait(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH)
        except OSError:
            pass  # closed under us: treat as granted, the owner re-checks
        with self._lock:
            if self._cancelled:
                os.close(self.fd)
                return
            self.granted = True
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass

    def take(self) -> int:
        """Hand the granted lock's descriptor over to the caller."""
        with self._lock:
            assert self.granted and not self._taken
            self._taken = True
            return self.fd

    def cancel(self) -> None:
        """Stop caring: a granted lock is released now, a pending one as
        soon as it is granted."""
        with self._lock:
            if self._taken:
                return
            if self.granted:
                os.close(self.fd)
                self._taken = True
            else:
                self._cancelled = True


class LockWaits:
    """The set of blocked flocks of one waiter, and its wake-up pipe."""

    def __init__(self) -> None:
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.watches: dict[str, LockWatch] = {}

    def watch_only(self, paths: list[str], exclusive: bool) -> None:
        """Be blocked on exactly these paths (cancel the others)."""
        for path in list(self.watches):
            if path not in paths or self.watches[path].exclusive != exclusive:
                self.watches.pop(path).cancel()
        for path in paths:
            if path not in self.watches:
                try:
                    self.watches[path] = LockWatch(path, exclusive, self.wake_w)
                except FileNotFoundError:
                    os.write(self.wake_w, b"!")  # gone already: look again
                except OSError:
                    pass  # not a file we may wait on (statefile refused it); the poll looks again

    def granted(self) -> LockWatch | None:
        return next((w for w in self.watches.values() if w.granted), None)

    def drain(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        for w in self.watches.values():
            w.cancel()
        self.watches.clear()
        os.close(self.wake_r)
        os.close(self.wake_w)
