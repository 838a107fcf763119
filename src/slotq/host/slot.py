"""Slots: one lock file per slot, `slots/<pool>.<index>`.

The holder writes who it is into the file after winning the lock. Rules, each
preventing a real failure:

- Lock files are never deleted: deleting one splits waiters across two inodes
  and two callers would both "hold" the slot.
- Never truncate before winning the lock: the loser would erase the holder's
  record.
- Every descriptor on a slot file is opened read-write, so its last close
  raises IN_CLOSE_WRITE: a release -- or a transient look by `slotq status` --
  always wakes the head of the line, and no wake-up is lost.
- The command inherits the lock descriptor: the kernel releases the slot only
  when the last process holding it exits, so a slot is never handed on while
  an orphaned command of a dead holder still runs.
- After winning the lock, the locked file must still be the file at the
  slot's path (same device and inode): a slot file replaced while we waited
  on the old one would otherwise let two callers each "hold" the slot. In a
  shared directory made by `slotq host init` the slot files are root's, in
  a sticky directory: nobody can delete or replace them at all.
- Files are opened through statefile.open_state: never through a link, never
  blocking on a FIFO.
"""

from __future__ import annotations

import fcntl
import os

from ..errors import StateDirError
from ..records import clean_state, from_json, to_json
from ..statefile import StateFileError, make_dirs, open_state, share_created

MAX_RECORD = 65536


def write_record(fd: int, data: bytes) -> None:
    """Rewrite a slot's holder record in place (its lock is ours, or our
    command's), padded with spaces -- JSON's own whitespace -- to the
    file's present size rather than truncated: shrinking a file is a
    journalled truncate on ext4, 0.2-0.6 ms measured on the way to every
    command's start, where the write costs microseconds. A record is at
    most MAX_RECORD bytes, so the file stays within that; a larger one
    (not ours) is cut. Raises OSError."""
    size = os.fstat(fd).st_size
    if len(data) < size <= MAX_RECORD:
        data += b" " * (size - len(data))
    os.pwrite(fd, data, 0)
    if size > len(data):
        os.ftruncate(fd, len(data))


def slot_path(state_dir: str, pool: str, index: int) -> str:
    return os.path.join(state_dir, "slots", f"{pool}.{index}")


def slot_name(pool: str, index: int) -> str:
    return f"{pool}#{index}"


class SlotLease:
    """A held slot. `fd` is the lock; closing it (in every process that
    inherited it) releases the slot."""

    __slots__ = ("path", "fd", "pool", "index", "info")

    def __init__(self, path: str, fd: int, pool: str, index: int) -> None:
        self.path = path
        self.fd = fd
        self.pool = pool
        self.index = index
        self.info: dict[str, object] = {}

    @property
    def name(self) -> str:
        return slot_name(self.pool, self.index)

    def record(self, **info: object) -> None:
        """Update the holder record (phase, pid, ...) that `status` shows."""
        self.info.update(info)
        try:
            write_record(self.fd, to_json(self.info).encode())
        except OSError:
            pass  # the record is for display; the lock is what counts

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class GrantedSlot(SlotLease):
    """A slot a scheduler granted (a Slurm allocation): there is no lock to
    hold or release here; the allocation is the slot. `name` says which."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        super().__init__("", -1, name, 0)
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def record(self, **info: object) -> None:
        self.info.update(info)


class SlotProbe:
    """The head of a line's open descriptors on its pool's slot files.

    They stay open while the head waits: a failed `flock` attempt closes
    nothing, so trying again raises no inotify event of our own (which would
    wake us in a loop).
    """

    def __init__(self, state_dir: str, pool: str, count: int) -> None:
        self.state_dir = state_dir
        self.pool = pool
        self.paths = [slot_path(state_dir, pool, i) for i in range(count)]
        self._fds: list[int] = []
        try:
            for p in self.paths:
                try:
                    self._fds.append(open_slot_file(p))
                except FileNotFoundError:  # no slots dir yet (the runner makes it first)
                    make_dirs(os.path.join(state_dir, "slots"), state_dir)
                    self._fds.append(open_slot_file(p))
        except StateDirError:
            self.close()
            raise
        except OSError as e:
            self.close()
            raise StateDirError(f"state directory {state_dir} is not usable: {e.strerror}", state_dir) from None

    def try_lease(self) -> SlotLease | None:
        """Take the first free slot, or None if all are held."""
        for i, fd in enumerate(self._fds):
            if fd < 0 or not self._lock(i):
                continue
            fd = self._fds[i]
            self._fds[i] = -1  # handed over to the lease
            lease = SlotLease(self.paths[i], fd, self.pool, i)
            self.close()
            return lease
        return None

    def _lock(self, i: int) -> bool:
        """Lock slot `i` if it is free. The locked file must still be the
        slot's: one deleted or replaced while we held it open is let go and
        the file now at the path tried instead."""
        for _ in range(3):
            try:
                fcntl.flock(self._fds[i], fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            if still_at_path(self._fds[i], self.paths[i]):
                return True
            os.close(self._fds[i])
            self._fds[i] = -1
            try:
                self._fds[i] = open_slot_file(self.paths[i])
            except OSError:
                return False
        return False

    def close(self) -> None:
        for fd in self._fds:
            if fd >= 0:
                os.close(fd)
        self._fds = [-1] * len(self._fds)


def open_slot_file(path: str) -> int:
    """A slot file, read-write (created if missing: then, and only then,
    made usable by the other users of a shared directory). Whoever waits
    for a slot may be the first to: slot files are made on first use."""
    try:
        fd, created = open_state(path, os.O_RDWR, create=True)
    except PermissionError:
        raise StateFileError(f"slot file {path} is not writable for you: a shared state dir needs "
                             "`slotq host init` (see the README)", path) from None
    if created:
        share_created(fd, os.path.dirname(path))
    return fd


def poke(path: str) -> None:
    """Wake the head of the line watching a slot file: a close of a
    descriptor opened for writing (IN_CLOSE_WRITE), as a release makes.
    For whoever tried the slot's lock for a moment (a head that tried it
    just then found it taken, and would wait for the next event)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError:
        pass


def still_at_path(fd: int, path: str) -> bool:
    """Is the file open on `fd` still the one at `path`?"""
    try:
        st = os.fstat(fd)
        at = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (at.st_dev, at.st_ino)


def read_slot(state_dir: str, pool: str, index: int,
              locked: set[tuple[int, int]] | None = None) -> tuple[bool, dict[str, object] | None]:
    """(held, holder record) for one slot, as `status` sees it.

    With `locked` (proclocks.held()), nothing is locked or opened for
    writing: no side effects on the line. Without it, we probe with a brief
    shared lock on a read-write descriptor -- if that makes the head of the
    line miss the slot, our close wakes it again.
    """
    path = slot_path(state_dir, pool, index)
    if locked is not None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False, None
        if (st.st_dev, st.st_ino) not in locked:
            return False, None
        try:
            fd, _ = open_state(path, os.O_RDONLY)
        except (FileNotFoundError, PermissionError):
            return True, None
        try:
            raw = os.pread(fd, MAX_RECORD + 1, 0)
        finally:
            os.close(fd)
        return True, _parse_record(raw)
    try:
        fd, _ = open_state(path, os.O_RDWR)
    except FileNotFoundError:
        return False, None
    except PermissionError:
        fd, _ = open_state(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            held = False
        except BlockingIOError:
            held = True
        raw = os.pread(fd, MAX_RECORD + 1, 0)
    finally:
        os.close(fd)
    return held, (_parse_record(raw) if held else None)


def _parse_record(raw: bytes) -> dict[str, object] | None:
    """A holder record, or None: being rewritten just now, or corrupt
    (too large, too deep, not JSON) -- shown as a holder with no record."""
    if len(raw) > MAX_RECORD:
        return None
    try:
        parsed = from_json(raw.decode("utf-8", "replace") or "null")
    except ValueError:
        return None
    return clean_state(parsed) if isinstance(parsed, dict) else None
