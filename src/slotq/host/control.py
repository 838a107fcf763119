"""A run's control socket: how `slotq cancel` reaches a runner from another
shell, and how each side knows who the other is.

Every runner listens on an abstract Unix socket named after its run id
and a random token (`\\0slotq-run/<run id>/<token>`: no file to create,
plant or clean up; it goes with the runner). `slotq cancel` finds it in
the kernel's list of sockets (/proc/net/unix), connects and sends
`cancel`; the runner answers `ok` or `refused: ...`. Both sides learn the
other's pid and uid from the kernel (SO_PEERCRED), never from what is said:
a runner obeys only its own user (or root), and the canceller talks only
to a socket of the run's user.

The runner binds when it must wait, or once its command has run 0.1 s (a
run that ends sooner never pays for this module); `slotq cancel` gives a
run the queue shows live a moment to bind. Its run id is visible before
that, but not its token: nobody can take the runner's name first. Another
user's socket under the run's id (anyone can bind any abstract name) is
passed over; if it is the only one, the canceller names it and sends
nothing.
Built on `_socket`, not `socket`, which imports `enum` (start-up cost:
benchmarks/).
"""

from __future__ import annotations

import os
import sys
import time

import _socket

PREFIX = b"\0slotq-run/"
_CRED_SIZE = 12  # struct ucred: pid, uid, gid (32-bit each)


MAX_SOCKET_LIST = 64 << 20  # /proc/net/unix read at most


def address(run_id: str) -> bytes:
    """A new address for run `run_id`'s runner: nobody can guess it."""
    return PREFIX + run_id.encode() + b"/" + os.urandom(8).hex().encode()


def listening(run_id: str) -> list[bytes]:
    """The abstract addresses bound under run `run_id`, from the kernel's
    list: the runner's (`<run id>/<token>`) first, then any other name
    that starts with the run id (an old runner's, or someone's squat)."""
    try:
        with open("/proc/net/unix", "rb") as f:
            table = f.read(MAX_SOCKET_LIST)
    except OSError:
        return []
    want = b"@" + PREFIX[1:] + run_id.encode()
    tokened: list[bytes] = []
    other: list[bytes] = []
    for line in table.splitlines()[1:]:
        parts = line.split(None, 7)
        if len(parts) < 8 or not parts[7].startswith(want):
            continue
        rest = parts[7][len(want):]
        name = b"\0" + parts[7][1:]
        if len(rest) == 17 and rest[:1] == b"/" and all(c in b"0123456789abcdef" for c in rest[1:]):
            if name not in tokened:
                tokened.append(name)
        elif rest == b"" and name not in other:
            other.append(name)
    return tokened + other


def listening_as(run_id: str, uid: int, timeout: float = 0.5) -> bool:
    """Does a socket of user `uid` listen under run `run_id`? (Anyone can
    bind any abstract name: another user's under our run's id is not
    ours.) Each is asked who it is (SO_PEERCRED) and told nothing it acts on."""
    for name in listening(run_id):
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        try:
            s.settimeout(timeout)
            s.connect(name)
            if peer(s)[1] == uid:
                try:
                    s.sendall(b"who\n")  # not `cancel`: a runner of ours answers `refused` and goes on
                except OSError:
                    pass
                return True
        except OSError:
            continue
        finally:
            s.close()
    return False


def own_runs(timeout: float = 1.0) -> dict[str, str | None]:
    """run id -> label of every run of ours that listens here, as each
    runner tells it over its control socket: sockets our own processes
    hold (their descriptors, in /proc of our uid), never one another user
    bound under a run's name, nor what a shared file says. (Root's: every
    user's.)"""
    inodes = _own_socket_inodes()
    try:
        with open("/proc/net/unix", "rb") as f:
            table = f.read(MAX_SOCKET_LIST)
    except OSError:
        return {}
    want = b"@" + PREFIX[1:]
    out: dict[str, str | None] = {}
    for line in table.splitlines()[1:]:
        parts = line.split(None, 7)
        if len(parts) < 8 or not parts[7].startswith(want) or not parts[6].isdigit() \
                or int(parts[6]) not in inodes:
            continue
        reply = _ask(b"\0" + parts[7][1:], b"label", timeout)
        if reply is None or not reply.startswith(b"label "):
            continue
        from ..records import from_json

        try:
            said = from_json(reply[6:].decode("utf-8", "replace"), 2)
        except ValueError:
            continue
        run_id, label = (said.get("run_id"), said.get("label")) if isinstance(said, dict) else (None, None)
        if isinstance(run_id, str) and run_id not in out:
            out[run_id] = label if isinstance(label, str) else None
    return out


def _own_socket_inodes() -> set[int]:
    """Inodes of the sockets our own processes hold open."""
    uid, out = os.getuid(), set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if uid != 0 and os.stat(f"/proc/{name}").st_uid != uid:
                continue
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{name}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    return out


def _ask(name: bytes, what: bytes, timeout: float) -> bytes | None:
    """One line of a runner of ours in answer to `what`; None if none."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        s.settimeout(timeout)
        s.connect(name)
        if peer(s)[1] != os.getuid() and os.getuid() != 0:
            return None
        s.sendall(what + b"\n")
        reply = b""
        while b"\n" not in reply and len(reply) < 8192:
            chunk = s.recv(8192)
            if not chunk:
                break
            reply += chunk
        return reply.split(b"\n")[0]
    except OSError:
        return None
    finally:
        s.close()


def peer(sock: _socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, from the kernel."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _CRED_SIZE)
    return int.from_bytes(raw[0:4], sys.byteorder), int.from_bytes(raw[4:8], sys.byteorder)


class ControlSocket:
    """The runner's end. `fileno()` is readable when someone connects."""

    def __init__(self, run_id: str, label: str | None = None) -> None:
        self.run_id = run_id
        self.label = label
        self.sock: _socket.socket | None = _socket.socket(
            _socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC | _socket.SOCK_NONBLOCK)
        try:
            self.sock.bind(address(run_id))
            self.sock.listen(8)
        except OSError:
            self.close()  # taken (a clash of random ids) or no sockets: no remote cancel for this run
            raise

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def accept_cancel(self) -> str | None:
        """Serve one connection. Returns a description of who cancelled
        ("pid N, user U") if it was a cancel we obey, else None."""
        if self.sock is None:
            return None
        try:
            conn, _ = self.sock._accept()  # type: ignore[attr-defined]
        except OSError:
            return None
        c = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, conn)
        try:
            c.settimeout(1.0)  # our own user's silent client cannot hold the runner up for long
            pid, uid = peer(c)
            from ..procinfo import user_name

            if uid not in (os.getuid(), 0):
                # Refused before reading: anyone on the machine can connect
                # to an abstract socket, and a wait for what they say would
                # stall this run's runner a second per connection.
                c.sendall(f"refused: run {self.run_id} belongs to user {user_name(os.getuid())}\n".encode())
                return None
            said = c.recv(64).strip()
            if said == b"label":  # our own user's `cancel --label`: the label, from us (not a shared file)
                from ..records import to_json

                c.sendall(b"label " + to_json({"run_id": self.run_id, "label": self.label}).encode() + b"\n")
                return None
            if said != b"cancel":
                c.sendall(b"refused: unknown request\n")
                return None
            c.sendall(b"ok\n")
            return f"pid {pid}, user {user_name(uid)}"
        except OSError:
            return None
        finally:
            c.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class CancelReply:
    __slots__ = ("ok", "text", "runner_pid", "runner_uid")

    def __init__(self, ok: bool, text: str, runner_pid: int | None, runner_uid: int | None) -> None:
        self.ok = ok
        self.text = text
        self.runner_pid = runner_pid
        self.runner_uid = runner_uid


def send_cancel(run_id: str, timeout: float = 5.0, expect_uid: int | None = None) -> CancelReply:
    """Ask run `run_id`'s runner to cancel it. Raises OSError when no
    runner listens (ConnectionRefusedError: the run has ended).

    `expect_uid`: the run's user, as the kernel says (its ticket's or slot
    lock's owner). A socket under the run's id held by another user is an
    impostor: passed over, and if no socket of the run's user listens,
    nothing is sent and the reply says so (`impostor`)."""
    names = listening(run_id)
    if not names:
        raise ConnectionRefusedError(f"no socket listens for run {run_id}")
    impostor = None
    deadline = time.monotonic() + timeout
    for name in names:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            reply = _send_to(name, left, expect_uid)
        except OSError:
            continue  # gone since the listing
        if reply.text != "impostor":
            return reply
        impostor = impostor or reply
    if impostor is not None:
        return impostor
    raise ConnectionRefusedError(f"no socket listens for run {run_id}")


def _send_to(name: bytes, timeout: float, expect_uid: int | None) -> CancelReply:
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        s.settimeout(timeout)
        s.connect(name)
        pid, uid = peer(s)
        if expect_uid is not None and uid != expect_uid:
            return CancelReply(False, "impostor", pid, uid)
        try:
            s.sendall(b"cancel\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # a runner refuses another user before reading, and may have closed: its reply is queued
        reply = b""
        while b"\n" not in reply and len(reply) < 4096:  # one line: `ok` or `refused: ...`
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                if reply:
                    break  # the runner closed with our request unread (a refusal): we have its line
                raise
            if not chunk:
                break
            reply += chunk
        text = reply.split(b"\n")[0].decode(errors="replace").strip()
        return CancelReply(text == "ok", text, pid, uid)
    finally:
        s.close()
