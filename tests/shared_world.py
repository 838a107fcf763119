"""The two ordinary users of the shared-machine tests and their world: a
temp root (removed at the end) with a home per user and a state dir, and
the one copy of slotq's code they run (`users_code`). scripts/test-users
makes the users."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import slotq_cmd

USERS = [u for u in os.environ.get("SLOTQ_TEST_USERS", "").split(",") if u]
GROUP = os.environ.get("SLOTQ_TEST_GROUP", "")
SRC = Path(__file__).resolve().parent.parent / "src"
PY = "/usr/bin/python3"  # Debian's: the test users cannot reach root's interpreter
SKIP_WHY = "needs root and the test users (scripts/test-users)"
_users_code: list[Path] = []  # made at the first call, removed at the session's end (conftest)


def users_code() -> Path:
    """A directory holding a copy of slotq's package that the test users
    can read: the PYTHONPATH of everything a test runs as one of them. The
    checkout itself may sit where they cannot reach it (a clone under
    /root, or in any 0700 dir), so they never get its path. One copy a
    session, under /tmp (world-traversable), removed at the session's end."""
    if not _users_code:
        top = Path(tempfile.mkdtemp(prefix="slotq-code-", dir="/tmp"))
        shutil.copytree(SRC / "slotq", top / "slotq", ignore=shutil.ignore_patterns("__pycache__"))
        for dirpath, _, filenames in os.walk(top):
            os.chmod(dirpath, 0o755)
            for f in filenames:
                os.chmod(os.path.join(dirpath, f), 0o644)
        _users_code.append(top)
    return _users_code[0]


def remove_users_code() -> None:
    while _users_code:
        shutil.rmtree(_users_code.pop(), ignore_errors=True)

# Python run by hand (not through slotq): take an exclusive flock on argv[1]
# and hold it until stdin closes.
FLOCK_BY_HAND = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
                 "print('ready', flush=True)\nsys.stdin.read()\n")


def ticket_by_hand(path: Path, record: dict[str, object], *more: Path) -> str:
    """Python that makes a ticket file at `path` (and at each of `more`)
    with `record` in it and holds its lock, as slotq's own tickets are
    held, until stdin closes."""
    code = "import fcntl, json, os, sys\nfds = []\n"
    for p in (path, *more):
        code += (f"fds.append(os.open({str(p)!r}, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644))\n"
                 "fcntl.flock(fds[-1], fcntl.LOCK_EX)\n"
                 f"os.write(fds[-1], json.dumps({record!r}).encode())\n")
    return code + "print('ready', flush=True)\nsys.stdin.read()\n"


class World:
    """A temp root (removed at the end) with a home and a victim dir per
    user, and a state dir; the users run slotq from `users_code()`."""

    def __init__(self, root: Path, state: Path) -> None:
        self.root = root
        self.state = state
        self.gid = grp.getgrnam(GROUP).gr_gid
        self.a, self.b = USERS[0], USERS[1]

    def uid(self, user: str) -> int:
        return pwd.getpwnam(user).pw_uid

    def home(self, user: str) -> Path:
        return self.root / f"home-{user}"

    def env(self, user: str, **extra: str) -> dict[str, str]:
        home = self.home(user)
        return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(users_code()), "HOME": str(home),
                "XDG_STATE_HOME": str(home / "state"), "SLOTQ_STATE_DIR": str(self.state),
                "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8", **extra}

    def cmd(self, *args: str) -> list[str]:
        return [PY, "-m", "slotq", *args]

    def run(self, user: str, *args: str, timeout: float = 30, umask: int = 0o002,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        pw = pwd.getpwnam(user)
        return subprocess.run(self.cmd(*args), capture_output=True, timeout=timeout, cwd=cwd or self.home(user),
                              env=self.env(user), text=True, user=pw.pw_uid, group=pw.pw_gid,
                              extra_groups=[self.gid], umask=umask)

    def run_bytes(self, user: str, *args: str, input: bytes, timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
        pw = pwd.getpwnam(user)
        return subprocess.run(self.cmd(*args), capture_output=True, timeout=timeout, cwd=self.home(user),
                              env=self.env(user), input=input, user=pw.pw_uid, group=pw.pw_gid,
                              extra_groups=[self.gid], umask=0o002)

    def popen(self, user: str, *args: str, stderr: int = subprocess.DEVNULL,
              umask: int = 0o002, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """`env`: more environment for the run."""
        pw = pwd.getpwnam(user)
        return subprocess.Popen(self.cmd(*args), cwd=self.home(user), env=self.env(user, **(env or {})),
                                start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                user=pw.pw_uid, group=pw.pw_gid, extra_groups=[self.gid], umask=umask)

    def py(self, user: str, code: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        """Run a bit of Python as `user` (B's attacks)."""
        pw = pwd.getpwnam(user)
        return subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=timeout,
                              cwd=self.home(user), env=self.env(user), user=pw.pw_uid, group=pw.pw_gid,
                              extra_groups=[self.gid], umask=0o002)

    @contextmanager
    def by_hand(self, user: str, code: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
        """Python `code` run as `user` outside slotq, from its first line
        `ready` until the block ends (then killed, by pid)."""
        pw = pwd.getpwnam(user)
        p = subprocess.Popen([PY, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=self.env(user), user=pw.pw_uid, group=pw.pw_gid, extra_groups=[self.gid],
                             umask=0o002)
        try:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            yield p
        finally:
            p.kill()
            p.wait()

    def victim(self) -> tuple[Path, dict[str, tuple[bytes, int, int]]]:
        """A's private files (what B would love to overwrite), and their
        bytes, mode and mtime now."""
        d = self.home(self.a) / "precious"
        d.mkdir(exist_ok=True)
        (d / "bashrc").write_text("echo hello\n")
        (d / "notes.txt").write_text("do not lose\n")
        for p in [d, *d.iterdir()]:
            os.chown(p, self.uid(self.a), -1)
        return d, snapshot_files(d)


def snapshot_files(d: Path) -> dict[str, tuple[bytes, int, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mode, p.stat().st_mtime_ns) for p in sorted(d.iterdir())}


def make_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="slotq-share-", dir="/tmp"))
    os.chmod(root, 0o755)
    for user in USERS:
        home = root / f"home-{user}"
        home.mkdir()
        pw = pwd.getpwnam(user)
        os.chown(home, pw.pw_uid, pw.pw_gid)
        os.chmod(home, 0o700)
    return root


def stop_users_processes(root: Path) -> None:
    """Kill what a test left running as the test users (by pid)."""
    uids = {pwd.getpwnam(u).pw_uid for u in USERS}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{name}")
            if st.st_uid in uids:
                os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture
def world() -> Iterator[World]:
    """The shared state dir made by `slotq host init` (as root)."""
    root = make_root()
    try:
        state = root / "state"
        proc = subprocess.run(slotq_cmd() + ["host", "init", "--shared", str(state), "--group", GROUP],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        yield World(root, state)
    finally:
        stop_users_processes(root)
        shutil.rmtree(root, ignore_errors=True)
