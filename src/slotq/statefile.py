"""Opening state files safely in a directory other users can write.

In a shared state directory anyone in the group can put a name there: a
symbolic link to a victim's file, a FIFO that blocks every reader, a
directory. Every state file slotq opens goes through `open_state`:

- `O_NOFOLLOW`: a link is refused (ELOOP), never written through;
- `O_NONBLOCK`: opening a FIFO returns at once instead of hanging; it is
  then refused by the type check (no effect on regular files);
- `fstat` after the open: anything but a regular file is refused;
- a missing file is created with `O_CREAT | O_EXCL`, so slotq knows whether
  it created the file itself -- the only case in which it may `chmod` it.

A refusal is a `StateFileError` (exit 73) whose message names the path and
what is wrong with it, in one line.
"""

from __future__ import annotations

import os
import stat

from .errors import StateDirError

_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class StateFileError(StateDirError):
    """A state file is not what slotq expects (a link, a FIFO, a directory,
    another user's file) or cannot be opened."""


def kind(mode: int) -> str:
    """'a FIFO', 'a symbolic link', ... for a file mode."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def describe_error(path: str, e: OSError) -> str:
    import errno

    if e.errno == errno.ELOOP:
        return f"state file {path} is a symbolic link: refused (someone may be trying to redirect slotq's writes)"
    if e.errno == errno.ENOSPC:
        return f"state file {path}: no space left on the device"
    return f"state file {path}: {e.strerror}"


def open_state(path: str, flags: int, *, create: bool = False, mode: int = 0o644) -> tuple[int, bool]:
    """Open `path` safely; returns (fd, created). `flags`: O_RDONLY,
    O_RDWR, O_WRONLY | O_APPEND ... (never O_CREAT: say `create=True`).
    Raises StateFileError naming the path; FileNotFoundError and
    PermissionError as they are."""
    created = False
    try:
        if create:
            # Usually the file is there: one call. If not, create it with
            # O_EXCL (so we know it is ours), and if someone beat us to it,
            # open theirs.
            try:
                fd = os.open(path, flags | _SAFE)
            except FileNotFoundError:
                try:
                    fd = os.open(path, flags | _SAFE | os.O_CREAT | os.O_EXCL, mode)
                    created = True
                except FileExistsError:
                    fd = os.open(path, flags | _SAFE)
        else:
            fd = os.open(path, flags | _SAFE)
    except (FileNotFoundError, PermissionError):
        raise  # the caller knows what a missing or forbidden file means to it
    except OSError as e:
        raise StateFileError(describe_error(path, e), path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError(f"state file {path} is {kind(st.st_mode)}, not a regular file: refused", path)
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def share_created(fd: int, dir_path: str, *, writable: bool = True) -> None:
    """A file we have just created in a directory other users write to:
    make it usable by them, whatever our umask -- read-write (the lock
    files every run opens read-write), or with `writable=False` readable
    only (a ticket, which its owner alone may change). Only ever called on
    a file this process created (open_state's `created`)."""
    try:
        dmode = os.stat(dir_path).st_mode
    except OSError:
        return
    if not dmode & (stat.S_IWOTH | stat.S_IWGRP):
        return  # a private directory: the umask's mode is right
    if not writable:
        want = 0o644
    elif dmode & stat.S_IWOTH:
        want = 0o666
    else:
        want = 0o660
    try:
        os.fchmod(fd, want)
    except OSError:
        pass


def read_limited(fd: int, limit: int, path: str) -> bytes:
    """Read a whole small state file; StateFileError if it is larger than
    `limit` (a corrupt or planted file, never slotq's own)."""
    data = os.pread(fd, limit + 1, 0)
    if len(data) > limit:
        raise StateFileError(f"state file {path} is larger than {limit} bytes: refused as corrupt", path)
    return data


def make_private_dirs(path: str) -> None:
    """Make directory `path` and its missing parents with mode 0700, as the
    XDG Base Directory spec asks of state directories: a per-user queue's
    history and wait ledger (commands, labels, work dirs) are no one else's
    to read. Directories that exist are left as they are. OSError as
    os.mkdir raises it."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        make_private_dirs(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not os.path.isdir(path):
            import errno

            raise NotADirectoryError(errno.ENOTDIR, "it is not a directory", path) from None


def make_dirs(path: str, top: str) -> None:
    """Make `path` and its missing parents up to `top` (the state dir),
    refusing a link or a non-directory on the way. A directory created in
    a directory other users write to gets that directory's mode (sticky
    and setgid bits included), so a pool added to the config later is as
    safe to share as those `slotq host init` made."""
    rel = os.path.relpath(path, top)
    if rel == "." or rel.startswith(".."):
        parts: list[str] = []
    else:
        parts = rel.split(os.sep)
    current = top
    _check_dir(current)
    for part in parts:
        parent = current
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            _check_dir(current)
            continue
        pmode = os.stat(parent).st_mode
        if pmode & (stat.S_IWGRP | stat.S_IWOTH):
            try:
                os.chmod(current, stat.S_IMODE(pmode))  # ours: we just made it
            except OSError:
                pass


MAX_OWN_LOOK = 10_000  # entries looked at to tell a private dir from a shared one


def refuse_unsafe_sharing(top: str, dirs: list[str]) -> None:
    """StateDirError if one of `dirs` (in state dir `top`) lets another
    user delete or replace our files: writable by others, and not sticky
    with a trusted owner (root, the state dir's owner, us) -- the old
    advice, a plain group-writable 2775 dir, where any member could delete
    a slot file under a running command. A dir of our own that only our
    umask made group-writable (nothing in it anyone else's) is private and
    passes. Costs one lstat a dir; a look inside only for an open dir."""
    uid = os.getuid()
    owner = None
    for d in dirs:
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            continue
        if owner is None:
            owner = st.st_uid if d == top else _owner(top)
        if st.st_mode & stat.S_ISVTX and st.st_uid in (0, owner, uid):
            continue
        if st.st_uid == uid and _only_mine(d, uid):
            continue
        why = "is not sticky" if not st.st_mode & stat.S_ISVTX else f"belongs to uid {st.st_uid}"
        raise StateDirError(f"state dir {top} is shared unsafely: {d} is writable by others and {why} (anyone "
                            f"could delete or replace a slot or ticket there). Make it safe in place, as root: "
                            f"slotq host init --shared {top} --group GROUP", top)


def _owner(path: str) -> int:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return -1


def _only_mine(d: str, uid: int) -> bool:
    try:
        with os.scandir(d) as it:
            for n, e in enumerate(it):
                if n >= MAX_OWN_LOOK or e.stat(follow_symlinks=False).st_uid != uid:
                    return False
    except OSError:
        return False
    return True


def _check_dir(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise StateFileError(describe_error(path, e), path) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StateFileError(f"state path {path} is {kind(st.st_mode)}, not a directory: refused", path)


def read_private(path: str, limit: int) -> bytes | None:
    """The bytes of `path` if it is this user's own regular file, writable
    by nobody else, of at most `limit` bytes; else None. For a user's own
    caches in a shared directory: one another user planted or could have
    changed is never used."""
    try:
        fd = os.open(path, os.O_RDONLY | _SAFE)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022 or st.st_size > limit:
            return None
        raw = os.read(fd, st.st_size + 1)  # what fstat said (a buffer of `limit` would cost every read)
    except OSError:
        return None
    finally:
        os.close(fd)
    return raw if len(raw) <= st.st_size else None  # grown meanwhile: not what we checked


def write_private(path: str, data: bytes) -> None:
    """Replace `path` with `data`, mode 0600, whole: written to a new file
    of ours first, then renamed over it (readers see the old or the new).
    Best effort: a cache that cannot be written is simply not kept."""
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.new"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _SAFE, 0o600)
    except OSError:
        return
    try:
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
