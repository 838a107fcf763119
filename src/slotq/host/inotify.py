"""A minimal inotify binding (Linux), through libc.py: no dependency.

A waiter watches the one file whose change can let it move (the ticket just
ahead of it, or the slot files when it is at the head), so a release wakes
the waiters that can act, not all of them. A process that closes a file it
held open for writing produces IN_CLOSE_WRITE -- also when it is killed --
so releases and deaths both wake the watcher within milliseconds.

Where inotify is missing (`available()` is False) callers fall back to a
slow poll.
"""

from __future__ import annotations

import os
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_MOVE_SELF = 0x00000800
IN_DELETE_SELF = 0x00000400
IN_CLOEXEC = 0o2000000
IN_NONBLOCK = 0o4000

# What a watched lock file does when its holder lets go or dies: the last
# close of a writable descriptor (release, death), an unlink (link count ->
# IN_ATTRIB, then IN_DELETE_SELF), or a rename.
LOCK_EVENTS = IN_CLOSE_WRITE | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF

_libc: Any = None


class _Libc:
    """The three inotify calls (libc.py)."""

    def __init__(self) -> None:
        from .libc import function

        init1, add, rm = function("inotify_init1"), function("inotify_add_watch"), function("inotify_rm_watch")
        if init1 is None or add is None or rm is None:
            raise OSError("no inotify in libc")
        self.inotify_init1, self.inotify_add_watch, self.inotify_rm_watch = init1, add, rm


def _load() -> Any:
    global _libc
    if _libc is None:
        try:
            _libc = _Libc()
        except OSError:
            _libc = False
    return _libc or None


def available() -> bool:
    return os.environ.get("SLOTQ_NO_INOTIFY") != "1" and _load() is not None


class Watcher:
    """One inotify instance; `fileno()` becomes readable when a watch fires."""

    def __init__(self) -> None:
        lib = _load()
        if lib is None:
            raise OSError("inotify is not available")
        self._lib = lib
        fd = lib.inotify_init1(IN_CLOEXEC | IN_NONBLOCK)
        if fd < 0:
            from .libc import errno

            e = errno()
            raise OSError(e, os.strerror(e))
        self._fd: int = fd
        self._watches: dict[str, int] = {}

    def fileno(self) -> int:
        return self._fd

    def watch(self, path: str, mask: int = LOCK_EVENTS) -> bool:
        """Watch `path`; False if it does not exist (any more)."""
        if path in self._watches:
            return True
        wd = self._lib.inotify_add_watch(self._fd, os.fsencode(path), mask)
        if wd < 0:
            return False
        self._watches[path] = wd
        return True

    def watching(self) -> set[str]:
        return set(self._watches)

    def unwatch(self, path: str) -> None:
        wd = self._watches.pop(path, None)
        if wd is not None:
            self._lib.inotify_rm_watch(self._fd, wd)

    def unwatch_all(self) -> None:
        for wd in self._watches.values():
            # A watch whose file is already gone was removed by the kernel.
            self._lib.inotify_rm_watch(self._fd, wd)
        self._watches.clear()

    def drain(self) -> int:
        """Consume pending events; return how many bytes were read."""
        n = 0
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                return n
            if not chunk:
                return n
            n += len(chunk)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._watches.clear()
