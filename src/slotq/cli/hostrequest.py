"""What a host command reads and where it works: the run's request on
stdin (`slotq host run` and `host keep`, `--request-stdin`) and the
caller's own directory for synced work trees."""

from __future__ import annotations

import os

from slotq.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slotq.spec import RunSpec


def request_from_stdin(state_dir: str, await_sync: bool) -> tuple[RunSpec | None, bytes]:
    """The run's request, the first line of stdin (and what was read past
    it). With `await_sync`, started while the client's rsync runs (our
    start-up overlaps it): None unless the next line is `synced` (the
    transfer failed, or the client is gone)."""
    from slotq.spec import RunSpec

    line, leftover = _read_line(0)
    try:
        spec = RunSpec.from_request(line)
    except (ValueError, TypeError) as e:
        from slotq.records import printable

        raise UsageError(f"bad run request on stdin: {printable(e, 300)}") from None
    if await_sync:
        word, leftover = _read_line(0, leftover, eof_ok=True)
        if word != b"synced":
            return None, b""
    if spec.work_id is not None:
        spec.cwd = os.path.join(work_root(state_dir), spec.work_id)
        _check_own_dir(spec.cwd, private=False)
    return spec, leftover


def _read_line(fd: int, buf: bytes = b"", eof_ok: bool = False) -> tuple[bytes, bytes]:
    """One line from `fd` (after what `buf` holds already), and the bytes
    read past it. End-of-file: b"" if `eof_ok`, else a usage error."""
    from slotq.spec import MAX_REQUEST

    while b"\n" not in buf:
        chunk = os.read(fd, 65536)
        if not chunk:
            if eof_ok:
                return b"", b""
            raise UsageError("no run request on stdin")
        buf += chunk
        if len(buf) > MAX_REQUEST and b"\n" not in buf:
            raise UsageError(f"bad run request on stdin: longer than {MAX_REQUEST} bytes")
    line, rest = buf.split(b"\n", 1)
    return line, rest


def work_root(state_dir: str) -> str:
    """The caller's own directory for synced work trees: `work/<uid>`,
    made here (mode 0700), and refused unless it is a real directory of
    ours that nobody else can enter -- in a shared state dir, another user
    could otherwise have planted a link there and had our rsync --delete
    run into their choice of directory."""
    from slotq.errors import StateDirError
    from slotq.statefile import make_dirs

    shared = os.path.join(state_dir, "work")
    root = os.path.join(shared, str(os.getuid()))
    try:
        make_dirs(shared, state_dir)
        try:
            os.mkdir(root, 0o700)
        except FileExistsError:
            if not _is_ours(root):
                # Taken first by someone else (`mkdir work/<our uid>`, a link):
                # in a sticky dir we cannot remove it, so we live beside it,
                # under a name nobody can guess. The client is told which
                # (`slotq host hello`).
                return _own_root_beside(shared, root)
    except OSError as e:
        raise StateDirError(f"cannot make the work dir root {root}: {e.strerror}", root) from None
    _check_own_dir(root, private=True)
    return root


def _is_ours(path: str) -> bool:
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def _own_root_beside(shared: str, taken: str) -> str:
    """Our work dir root when `taken` (work/<uid>) is someone else's: the
    one we made before (work/<uid>.<random>, ours, private), or a new one."""
    prefix = os.path.basename(taken) + "."
    for name in sorted(os.listdir(shared)):
        path = os.path.join(shared, name)
        if name.startswith(prefix) and _is_ours(path):
            _check_own_dir(path, private=True)
            return path
    while True:
        path = taken + "." + os.urandom(8).hex()
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        _check_own_dir(path, private=True)
        return path


def _check_own_dir(path: str, private: bool) -> None:
    import stat

    from slotq.errors import StateDirError

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return  # not synced yet: the runner says so
    except OSError as e:
        raise StateDirError(f"work dir {path}: {e.strerror}", path) from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"work dir {path} is not a plain directory (a planted link?): refused", path)
    if st.st_uid != os.getuid():
        raise StateDirError(f"work dir {path} belongs to uid {st.st_uid}, not to you: refused", path)
    if private and st.st_mode & 0o077:
        raise StateDirError(f"work dir root {path} can be entered by others (mode "
                            f"{stat.S_IMODE(st.st_mode):04o}): refused", path)
