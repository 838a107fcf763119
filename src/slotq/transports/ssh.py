"""Remote hosts through the system OpenSSH client.

- The user's own ssh config is honoured (keys, ports, jump hosts); `-F` and
  extra `-o` options can be given. Batch mode: never a prompt.
- One master connection per host (ControlMaster), started once and reused
  by every later run for `ControlPersist` seconds, so a run does not pay a
  new handshake. Its socket lives in a private directory
  (`$XDG_RUNTIME_DIR/slotq-ssh`, else `/tmp/slotq-ssh-<uid>`).
- Keep-alives (ServerAliveInterval) so a silent network is noticed.
- No argument of the caller's command is ever put on the ssh command line:
  the remote command is fixed (`<remote slotq> host run --request-stdin`) and
  the request travels as the first line of its stdin, so no remote shell can
  reinterpret spaces, quotes, `$(...)`, `;` or newlines.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import socket
import subprocess
import time

from .. import protocol
from ..errors import HostUnavailable
from ..spec import RunSpec
from .base import Transport

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO

CONTROL_PERSIST = 600
DEFAULT_OPTIONS = ("BatchMode=yes", "ServerAliveInterval=5", "ServerAliveCountMax=3", "ConnectTimeout=10")


def control_dir() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = os.path.join(base, "slotq-ssh") if base else f"/tmp/slotq-ssh-{os.getuid()}"
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise HostUnavailable(f"ssh control directory {path} is not private to this user", host="")
    return path


class SshHost:
    """How to reach one host: ssh arguments, master connection, handshake."""

    def __init__(self, host: str, *, config: str | None = None, options: list[str] | None = None,
                 remote_slotq: str = "slotq") -> None:
        if not host or host.startswith("-"):
            raise HostUnavailable(f"not a host name: {host!r}", host=host)
        self.host = host
        self.config = config
        self.options = list(options or [])
        self.remote_slotq = remote_slotq
        key = "\0".join([host, config or "", *self.options]).encode()
        self.control_path = os.path.join(control_dir(), hashlib.sha256(key).hexdigest()[:20])
        self.reused = False
        self.connect_s = 0.0

    def _base(self) -> list[str]:
        args = ["ssh"]
        if self.config:
            args += ["-F", self.config]
        # ssh keeps the first value it sees for an option: the caller's
        # --ssh-option first, then our defaults, then the config file.
        for opt in [*self.options, *DEFAULT_OPTIONS]:
            args += ["-o", opt]
        return args + ["-o", f"ControlPath={self.control_path}"]

    def command(self, remote: str) -> list[str]:
        """ssh argv running the shell string `remote` over the master."""
        return self._base() + ["-o", "ControlMaster=no", "-T", self.host, remote]

    def ssh_command_for_rsync(self) -> str:
        return shlex.join(self._base() + ["-o", "ControlMaster=no"])

    def _master_alive(self) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.control_path)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def ensure_master(self) -> None:
        """Reuse this host's master connection, or start one. Raises
        HostUnavailable with ssh's own reason (unreachable, auth failure)."""
        import fcntl

        t0 = time.monotonic()
        with open(self.control_path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per host at a time
            if self._master_alive():
                self.reused = True
                self.connect_s = time.monotonic() - t0
                return
            try:
                os.unlink(self.control_path)  # a stale socket blocks a new master
            except FileNotFoundError:
                pass
            log_path = self.control_path + ".log"
            with open(log_path, "wb") as log:
                # -f: background after authentication. The background master
                # keeps the stderr it was given: a file, never our pipe.
                rc = subprocess.call(
                    self._base() + ["-o", "ControlMaster=yes", "-o", f"ControlPersist={CONTROL_PERSIST}",
                                    "-f", "-N", self.host],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
            if rc != 0 or not self._master_alive():
                raise HostUnavailable(f"cannot connect to host {self.host}: {_last_line(log_path) or f'ssh exited {rc}'}",
                                      host=self.host)
        self.reused = False
        self.connect_s = time.monotonic() - t0

    def hello(self) -> dict[str, object]:
        """The handshake: the host's slotq version, protocol and work root.
        Raises HostUnavailable naming the host and what to install."""
        proc = subprocess.run(self.command(f"{self.remote_slotq} host hello"), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=60)
        err = proc.stderr.decode(errors="replace").strip()
        if proc.returncode == 255:
            raise HostUnavailable(f"connection to host {self.host} failed: {_last(err)}", host=self.host)
        if proc.returncode in (126, 127):
            raise HostUnavailable(
                f"slotq is not installed on host {self.host} (`{self.remote_slotq}` not found there): "
                f"install it there (pip install slotq) or name it with --remote-slotq", host=self.host)
        info = None
        for line in reversed(proc.stdout.decode(errors="replace").splitlines()):
            if line.startswith('{"slotq"'):
                try:
                    info = json.loads(line[:65536])
                except (ValueError, RecursionError):
                    pass
                break
        if proc.returncode != 0 or not isinstance(info, dict):
            raise HostUnavailable(
                f"host {self.host} did not answer the slotq handshake (exit {proc.returncode}: {_last(err)}); "
                f"it needs slotq with `slotq host hello` (this client: protocol {protocol.PROTOCOL_VERSION})",
                host=self.host)
        if info.get("protocol") != protocol.PROTOCOL_VERSION:
            from ..records import printable

            raise HostUnavailable(
                f"host {self.host} runs slotq {printable(info.get('slotq'), 40)} (stream protocol "
                f"{printable(info.get('protocol'), 20)}); "
                f"this client speaks protocol {protocol.PROTOCOL_VERSION}: install a matching slotq there",
                host=self.host)
        root = info.get("work_root")
        if not isinstance(root, str) or not root.startswith("/") or not root.isprintable() or len(root) > 4096:
            raise HostUnavailable(f"host {self.host} answered the handshake with a malformed work root", host=self.host)
        return info

    def status(self, as_json: bool = True) -> str:
        """The host's `slotq status` output. Raises HostUnavailable."""
        proc = subprocess.run(self.command(f"{self.remote_slotq} status" + (" --json" if as_json else "")),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        if proc.returncode != 0:
            err = _last(proc.stderr.decode(errors="replace"))
            if proc.returncode in (126, 127):
                err = f"slotq is not installed on host {self.host} (`{self.remote_slotq}` not found there)"
            raise HostUnavailable(f"host {self.host}: status failed (exit {proc.returncode}): {err}",
                                  host=self.host)
        return proc.stdout.decode(errors="replace")

    def status_snapshot(self) -> dict[str, object]:
        self.ensure_master()
        text = self.status(as_json=True)
        start = text.find("{")
        try:
            data = json.loads(text[start:]) if start >= 0 else None
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            raise HostUnavailable(f"host {self.host}: unreadable status", host=self.host)
        return data

    def rsync(self, src: str, dest: str) -> None:
        """Mirror the work tree `src` to `dest` on the host: .gitignore'd
        files stay home, deletions propagate."""
        args = ["rsync", "-a", "--delete", "--protect-args", "--filter=:- .gitignore",
                "-e", self.ssh_command_for_rsync(), src.rstrip("/") + "/", f"{self.host}:{dest.rstrip('/')}/"]
        try:
            proc = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, timeout=3600)
        except FileNotFoundError:
            raise HostUnavailable("rsync is not installed here: install it (apt-get install rsync) "
                                  "or use --sync none", host=self.host) from None
        if proc.returncode != 0:
            raise HostUnavailable(f"work tree transfer to host {self.host} failed (rsync exit {proc.returncode}): "
                                  f"{_last(proc.stderr.decode(errors='replace'))}", host=self.host)


def work_id(workdir: str) -> str:
    """The caller's work dir on a host: a name derived from where it comes
    from, never a path the caller chooses."""
    key = f"{os.uname().nodename}\0{os.getuid()}\0{os.path.realpath(workdir)}".encode()
    return hashlib.sha256(key).hexdigest()[:24]


def _last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return _last(f.read())
    except OSError:
        return ""


class SshTransport(Transport):
    """A remote host through OpenSSH: `ssh HOST <remote slotq> host run
    --request-stdin`, over the host's reused master connection.

    sync: "rsync" mirrors the caller's work dir into a per-caller work dir
    under the host's state dir; "none" runs in the same path (a shared
    filesystem).
    """

    remote = True

    def __init__(self, host: str, *, config: str | None = None, options: list[str] | None = None,
                 remote_slotq: str = "slotq", sync: str = "rsync") -> None:
        if sync not in ("rsync", "none"):
            raise ValueError(f"sync must be rsync or none, got {sync!r}")
        self.ssh = SshHost(host, config=config, options=options, remote_slotq=remote_slotq)
        self.host = host
        self.sync = sync
        self.info: dict[str, object] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._err: IO[bytes] | None = None
        self.transfer_s = 0.0

    def prepare(self, spec: RunSpec) -> None:
        import time

        self.ssh.ensure_master()
        self.info = self.ssh.hello()
        if self.sync == "rsync":
            t0 = time.monotonic()
            spec.work_id = work_id(spec.cwd or os.getcwd())
            self.ssh.rsync(spec.cwd or os.getcwd(), os.path.join(str(self.info["work_root"]), spec.work_id))
            self.transfer_s = time.monotonic() - t0
            spec.cwd = None
        else:
            spec.cwd = os.path.realpath(spec.cwd or os.getcwd())

    def describe(self) -> dict[str, object]:
        return {"kind": "ssh", "host": self.host, "master_reused": self.ssh.reused,
                "connect_s": round(self.ssh.connect_s, 4), "sync": self.sync,
                "rsync_s": round(self.transfer_s, 4), "remote_slotq": self.info.get("slotq"),
                "remote_host": self.info.get("host")}

    def start(self, spec: RunSpec) -> tuple[int, int]:
        import tempfile

        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        err = tempfile.TemporaryFile()
        cmd = self.ssh.command(f"{self.ssh.remote_slotq} host run --request-stdin")
        try:
            self.proc = subprocess.Popen(cmd, stdin=to_r, stdout=from_w, stderr=err)
        finally:
            os.close(to_r)
            os.close(from_w)
        self._err = err
        os.write(to_w, spec.to_request())
        return to_w, from_r

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # the mux master then closes the session: the runner sees EOF

    def after_loss(self, run_id: str) -> str:
        try:
            proc = subprocess.run(self.ssh.command(f"{self.ssh.remote_slotq} host reap {run_id}"),
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return proc.stdout.decode(errors="replace").strip() if proc.returncode == 0 else ""

    def wait(self) -> str:
        if self.proc is None or self._err is None:
            return ""
        rc = self.proc.wait()
        self._err.seek(0)
        text = self._err.read().decode(errors="replace").strip()
        self._err.close()
        if rc == 255:
            return f"connection to {self.host} lost: {text or 'ssh exited 255'}"
        return text
