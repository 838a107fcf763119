"""Where the ssh master connections' sockets live (transports/ssh.py):
a directory of the user's own that nobody else can plant anything in,
swap, or take first.

$XDG_RUNTIME_DIR/slotq-ssh, else (unset, relative -- the XDG spec asks
that it be ignored -- or too long for a socket's path, which made every
remote run `unavailable`) /tmp/slotq-ssh-<uid>; and if another user took
that name first (a directory, a link: in a sticky /tmp they can, and we
cannot remove it), a fresh /tmp/slotq-ssh-<uid>-<random> of ours, found
again by the next run. It is looked at without following links: only a
real directory, ours, mode 0700 (issue 65: a link swapped in between a
check that followed it and the use had a run write its lock and log
through links planted in a directory of the other user's)."""

from __future__ import annotations

import os

from ..errors import HostUnavailable

# ssh makes a master's socket as ControlPath + ".XXXXXXXXXXXXXXXX" first,
# and a socket's path has room for 107 bytes: the directory, a slash and
# the 20-character name below must leave room for those 17.
MAX_CONTROL_DIR = 107 - 17 - 1 - 20
FALLBACK_BASE = "/tmp"


def control_dir() -> str:
    """The control directory (see the module's doc), made if need be.
    Raises HostUnavailable if none can be had."""
    base = os.environ.get("XDG_RUNTIME_DIR") or ""
    path = os.path.join(base, "slotq-ssh")
    if os.path.isabs(base) and len(os.fsencode(path)) <= MAX_CONTROL_DIR:
        if _own_private_dir(path, make=True):
            return path
        raise HostUnavailable(f"ssh control directory {path} is not a private directory of this user", host="")
    prefix = f"slotq-ssh-{os.getuid()}"
    path = os.path.join(FALLBACK_BASE, prefix)
    if _own_private_dir(path, make=True):
        return path
    try:  # taken first: one of ours made since, if any
        with os.scandir(FALLBACK_BASE) as it:
            names = sorted(e.name for _, e in zip(range(MAX_TMP_NAMES), it) if e.name.startswith(prefix + "-"))
    except OSError:
        names = []
    for name in names:
        if _own_private_dir(os.path.join(FALLBACK_BASE, name), make=False):
            return os.path.join(FALLBACK_BASE, name)
    import tempfile

    try:
        return tempfile.mkdtemp(prefix=prefix + "-", dir=FALLBACK_BASE)  # 0700, a name nobody had
    except OSError as e:
        raise HostUnavailable(f"cannot make an ssh control directory in {FALLBACK_BASE}: {e.strerror}",
                              host="") from None


MAX_TMP_NAMES = 100_000  # entries of /tmp looked through for a control directory of ours


def _own_private_dir(path: str, make: bool) -> bool:
    """Is `path` a directory of ours, mode 0700, itself no link (made so
    if `make` and nothing is there)?"""
    import stat

    if make:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def open_private(path: str, flags: int) -> int:
    """A file in our control directory, never through a link."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
