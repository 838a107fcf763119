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

import os
import time

from .. import protocol
from ..errors import HostUnavailable, UsageError
from ..records import from_json, load_scanner, to_json
from ..spec import RunSpec
from .base import Transport
from .controldir import control_dir, open_private
from .proc import Proc, run

# A remote run's start-up counts (benchmarks/: a run against raw ssh +
# rsync): no `json`, `shlex` (both import `re`), `socket`, `tempfile` or
# OpenSSL's hashlib here; their small parts below.
def _sha256_hex(data: bytes) -> str:
    try:
        import _sha256  # type: ignore[import-not-found]  # CPython's own, without OpenSSL
    except ImportError:  # a Python built without it
        import hashlib

        return hashlib.sha256(data).hexdigest()
    return str(_sha256.sha256(data).hexdigest())


def _quote(arg: str) -> str:
    """A word for a POSIX shell (shlex.quote's rule)."""
    if arg and all(c.isalnum() or c in "@%+=:,./-_" for c in arg) and arg.isascii():
        return arg
    return "'" + arg.replace("'", "'\"'\"'") + "'"

CONTROL_PERSIST = 600
DEFAULT_OPTIONS = ("BatchMode=yes", "ServerAliveInterval=5", "ServerAliveCountMax=3", "ConnectTimeout=10")


def check_host(host: str) -> str:
    """`host` if it can name a host for ssh; a usage error if not (one that
    starts with '-' would be read by ssh as an option)."""
    if not host or host.startswith("-"):
        raise UsageError(f"--host: not a host name: {host!r}")
    return host


STATUS_TIMEOUT = 60.0  # seconds a host's `slotq status` may take
STATUS_LIMIT = 16 << 20  # bytes of it
HISTORY_TIMEOUT = 300.0  # a host's `slotq history` (a first look builds its index: a large history takes minutes)
HISTORY_LIMIT = 64 << 20  # bytes of it (~100,000 runs)


class SshHost:
    """How to reach one host: ssh arguments, master connection, handshake."""

    def __init__(self, host: str, *, config: str | None = None, options: list[str] | None = None,
                 remote_slotq: str = "slotq") -> None:
        check_host(host)
        load_scanner()  # the host's handshake and stream: the C JSON scanner reads them
        self.host = host
        self.config = config
        self.options = list(options or [])
        self.remote_slotq = remote_slotq
        key = "\0".join([host, config or "", *self.options]).encode()
        self.control_path = os.path.join(control_dir(), _sha256_hex(key)[:20])
        self.reused = False
        self.connect_s = 0.0
        self.hello_kept = False  # handshake(): the answer kept for this master, not a new one

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

    def call(self, sub: str, timeout: float, unanswered: str, limit: int = 1 << 20) -> tuple[int, bytes, bytes]:
        """`<remote slotq> SUB` on the host, over the master: its exit code,
        stdout and stderr (each cut to `limit` bytes); HostUnavailable with
        `unanswered` if it has not ended within `timeout` seconds."""
        try:
            return run(self.command(f"{self.remote_slotq} {sub}"), timeout=timeout, limit=limit)
        except TimeoutError:
            raise HostUnavailable(unanswered, host=self.host) from None

    def ssh_command_for_rsync(self) -> str:
        return " ".join(_quote(a) for a in self._base() + ["-o", "ControlMaster=no"])

    def _master_alive(self) -> bool:
        import _socket

        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
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
        with open(open_private(self.control_path + ".lock", os.O_WRONLY | os.O_CREAT), "w") as lock:
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
            with open(open_private(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as log:
                starting = None
                try:
                    # -f: background after authentication. The background master
                    # keeps the stderr it was given: a file, never our pipe.
                    starting = Proc(self._base() + ["-o", "ControlMaster=yes", "-o",
                                                    f"ControlPersist={CONTROL_PERSIST}", "-f", "-N", self.host],
                                    stderr=log.fileno())
                    rc = starting.wait()
                except BaseException:  # a stop signal's exception (client/caller.py): no master half made
                    if starting is not None:
                        starting.kill()
                        starting.wait()
                    raise
            if rc != 0 or not self._master_alive():
                raise HostUnavailable(f"cannot connect to host {self.host}: {_last_line(log_path) or f'ssh exited {rc}'}",
                                      host=self.host)
        self.reused = False
        self.connect_s = time.monotonic() - t0

    def handshake(self) -> dict[str, object]:
        """`hello()`, once per master connection: its answer is kept beside
        the master's socket and reused while that very socket (inode and
        time) lives, for the same remote slotq. A later change of the remote
        slotq's protocol still shows: each run's stream starts with it."""
        st = os.stat(self.control_path)
        key = [st.st_ino, st.st_mtime_ns, self.remote_slotq]
        path = self.control_path + ".hello"
        try:
            with open(open_private(path, os.O_RDONLY), "rb") as f:
                cached = from_json(f.read(65536).decode())
            if isinstance(cached, dict) and cached.get("key") == key and isinstance(cached.get("info"), dict):
                info: dict[str, object] = cached["info"]
                self.hello_kept = True
                return info
        except (OSError, ValueError, RecursionError):
            pass
        self.hello_kept = False
        info = self.hello()
        try:
            tmp = f"{path}.{os.getpid()}"
            with open(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
                f.write(to_json({"key": key, "info": info}))
            os.replace(tmp, path)
        except OSError:
            pass
        return info

    def forget_handshake(self) -> None:
        try:
            os.unlink(self.control_path + ".hello")
        except OSError:
            pass

    def hello(self) -> dict[str, object]:
        """The handshake: the host's slotq version, protocol and work root.
        Raises HostUnavailable naming the host and what to install."""
        rc, out, err_bytes = self.call("host hello", 60, f"host {self.host} did not answer the slotq handshake "
                                                         f"within 60 s")
        err = err_bytes.decode(errors="replace").strip()
        if rc == 255:
            raise HostUnavailable(f"connection to host {self.host} failed: {_last(err)}", host=self.host)
        if rc in (126, 127):
            raise HostUnavailable(
                f"slotq is not installed on host {self.host} (`{self.remote_slotq}` not found there): "
                f"install it there (pip install slotq) or name it with --remote-slotq", host=self.host)
        info = None
        for line in reversed(out.decode(errors="replace").splitlines()):
            if line.startswith('{"slotq"'):
                try:
                    info = from_json(line[:65536])
                except ValueError:
                    pass
                break
        if rc != 0 or not isinstance(info, dict):
            raise HostUnavailable(
                f"host {self.host} did not answer the slotq handshake (exit {rc}: {_last(err)}); "
                f"it needs slotq with `slotq host hello` (this client: {protocol.spoken()})",
                host=self.host)
        if protocol.choose(info) is None:  # before any queueing: one line, both versions, the fix
            from .. import __version__
            from ..records import printable

            low, high = protocol.spoken_by(info)
            raise HostUnavailable(
                f"host {self.host} runs slotq {printable(info.get('slotq'), 40)} (stream protocols "
                f"{printable(low, 10)}-{printable(high, 10)}); this slotq {__version__} speaks "
                f"{protocol.spoken()}: {protocol.UPGRADE}, on host {self.host} or here", host=self.host)
        root = info.get("work_root")
        if not isinstance(root, str) or not root.startswith("/") or not root.isprintable() or len(root) > 4096:
            raise HostUnavailable(f"host {self.host} answered the handshake with a malformed work root", host=self.host)
        return info

    def status(self, history: int | None = None) -> str:
        """The host's `slotq status --json` output (with `--history N` if
        given). Raises HostUnavailable, also for a host that does not answer
        within STATUS_TIMEOUT or answers more than STATUS_LIMIT bytes."""
        args = " --json" + ("" if history is None else f" --history {int(history)}")
        return self._answer("status", args, STATUS_TIMEOUT, STATUS_LIMIT,
                            " (ask for fewer runs: --history N)" if history and history > 10 else "")

    def _answer(self, sub: str, args: str, timeout: float, limit: int, smaller: str) -> str:
        """The output of `<remote slotq> SUB ARGS` on the host; HostUnavailable
        if it failed, gave no answer within `timeout` seconds or more than
        `limit` bytes (`smaller` says how to ask for less)."""
        rc, out, err_bytes = self.call(sub + args, timeout, f"host {self.host}: no {sub} within {timeout:g}s", limit + 1)
        if rc != 0:
            err = _last(err_bytes.decode(errors="replace"))
            if rc in (126, 127):
                err = f"slotq is not installed on host {self.host} (`{self.remote_slotq}` not found there)"
            raise HostUnavailable(f"host {self.host}: {sub} failed (exit {rc}): {err}", host=self.host)
        if len(out) > limit:
            raise HostUnavailable(f"host {self.host}: its {sub} is larger than {limit >> 20} MiB{smaller}",
                                  host=self.host)
        return out.decode(errors="replace")

    def history(self, args: list[str]) -> list[dict[str, object]]:
        """The host's finished runs, as its `slotq history --json ARGS`
        gives them, each checked as a history line is (`clean_record`:
        the types readers rely on, whatever the host sent), each run's
        `host` the name it was reached by (one machine may be reached under
        several names, to several state dirs). Raises HostUnavailable, also
        for an answer that is not a list of runs."""
        from ..history import clean_record

        self.ensure_master()
        text = self._answer("history", "".join(" " + _quote(a) for a in ["--json", *args]), HISTORY_TIMEOUT,
                            HISTORY_LIMIT, " (ask for a shorter window, or --limit N)")
        try:
            data = from_json(text)
        except ValueError as e:
            raise HostUnavailable(f"host {self.host}: unreadable history ({e})", host=self.host) from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise HostUnavailable(f"host {self.host}: unreadable history (not a list of runs)", host=self.host)
        return [dict(clean_record(r), host=self.host) for r in data]

    def status_snapshot(self, history: int | None = None) -> dict[str, object]:
        """The host's status as `status --json` gives it, and `reached_as`:
        the name it was reached by (the host's own name is `host`)."""
        self.ensure_master()
        text = self.status(history=history)
        start = text.find("{")
        try:
            import json  # status: not a run's path

            data = json.loads(text[start:]) if start >= 0 else None
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            raise HostUnavailable(f"host {self.host}: unreadable status", host=self.host)
        data["reached_as"] = self.host
        return data

    def rsync(self, src: str, dest: str, pinned: int | None = None) -> str | None:
        """Mirror the work tree `src` to `dest` on the host: .gitignore'd
        files stay home, deletions propagate. Returns a warning when files
        vanished from the tree while it was sent (rsync's code 24: a
        build or an editor removed them): the rest was sent, and the run
        goes on, as it would have had they gone a moment earlier.
        `pinned`: a descriptor of the directory `src` named when the run was
        asked for; the tree sent is that directory's, whatever `src` names
        by now (a link swapped in while the run waited points elsewhere)."""
        # --modify-window=-1: compare modification times to the nanosecond.
        # rsync's default is whole seconds, so a file changed twice within a
        # second, its size unchanged (here, or by a command on the host),
        # would not be sent again.
        source = src.rstrip("/") + "/" if pinned is None else f"{PINNED_SOURCE}/"
        args = ["rsync", "-a", "--delete", "--protect-args", "--modify-window=-1", "--filter=:- .gitignore",
                "-e", self.ssh_command_for_rsync(), source, f"{self.host}:{dest.rstrip('/')}/"]
        try:
            rc, _, err = run(args, timeout=3600, keep=None if pinned is None else {PINNED_FD: pinned})
            if pinned is not None:  # its messages name the tree as the caller knows it
                err = err.replace(PINNED_SOURCE.encode(), src.rstrip("/").encode())
        except FileNotFoundError:
            raise HostUnavailable("rsync is not installed here: install it (apt-get install rsync) "
                                  "or use --sync none", host=self.host) from None
        except TimeoutError:
            raise HostUnavailable(f"work tree transfer to host {self.host} took over an hour: stopped",
                                  host=self.host) from None
        text = err.decode(errors="replace")
        if rc == RSYNC_VANISHED:
            gone = [line.split("file has vanished: ", 1)[1] for line in text.splitlines()
                    if "file has vanished: " in line]
            return (f"{len(gone) or 'some'} file(s) vanished from the work tree while it was sent to host "
                    f"{self.host}{' (' + gone[0] + (', ...' if len(gone) > 1 else '') + ')' if gone else ''}: "
                    "the run goes on without them")
        unreadable = _unreadable(rc, text)
        if unreadable:
            from ..errors import WorkTreeError

            raise WorkTreeError(f"cannot read {len(unreadable)} path(s) of the work tree {src} to send it to host "
                                f"{self.host}: {unreadable[0]}{', ...' if len(unreadable) > 1 else ''}; make "
                                "them readable, add them to .gitignore, or use --sync none; nothing ran")
        if rc != 0:
            raise HostUnavailable(f"work tree transfer to host {self.host} failed (rsync exit {rc}): "
                                  f"{_rsync_cause(text)}", host=self.host)
        return None


PINNED_FD = 3  # rsync's descriptor of a pinned work tree
PINNED_SOURCE = f"/proc/self/fd/{PINNED_FD}"


def pin(path: str) -> int:
    """A descriptor of the directory `path` names now, to send later
    (rsync's `pinned`). Raises OSError."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def check_work_tree(path: str) -> None:
    """A UsageError if rsync would copy `path` whole to a host: the root
    directory, your home directory or one above it. A run started there by
    mistake copied all of it, ssh keys and all, to a shared machine."""
    real = os.path.realpath(path)
    home = os.path.realpath(os.path.expanduser("~"))
    if real == "/":
        what = "the root directory"
    elif real == home:
        what = "your home directory"
    elif home.startswith(real.rstrip("/") + "/"):
        what = f"a directory above your home ({home})"
    else:
        return
    raise UsageError(f"--host would copy {real}, {what}, to the host: run from your project's directory, "
                     f"or add --sync none (a shared filesystem)")


def work_id(workdir: str) -> str:
    """The caller's work dir on a host: a name derived from where it comes
    from, never a path the caller chooses."""
    key = f"{os.uname().nodename}\0{os.getuid()}\0{os.path.realpath(workdir)}".encode()
    return _sha256_hex(key)[:24]


def _last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


RSYNC_PARTIAL = 23  # "Partial transfer due to error"
RSYNC_VANISHED = 24  # "Partial transfer due to vanished source files"


def _rsync_cause(text: str) -> str:
    """What rsync says went wrong: its last `rsync: ...` line, which names
    the cause ('write failed on "...": No space left on device (28)'), else
    its last line (`rsync error: error in file IO (code 11) at ...`, which
    does not)."""
    causes = [line.strip() for line in text.splitlines() if line.startswith("rsync: ")]
    return causes[-1] if causes else _last(text)


def _unreadable(rc: int, text: str) -> list[str]:
    """What rsync could not read on our side (`rsync: [sender] send_files
    failed to open "/w/build/x": Permission denied (13)`), when that is
    its only failure (exit 23, a partial transfer): the work tree's
    fault, not the host's. [] when anything failed on the host's side."""
    if rc != RSYNC_PARTIAL:
        return []
    causes = [line.strip()[len("rsync: "):] for line in text.splitlines() if line.startswith("rsync: ")]
    if not causes or not all(c.startswith("[sender] ") for c in causes):
        return []
    return [c[len("[sender] "):] for c in causes]


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
    host_command = "host run --request-stdin"  # what runs the run on the host (a kept run: transports/kept.py)

    def __init__(self, host: str, *, config: str | None = None, options: list[str] | None = None,
                 remote_slotq: str = "slotq", sync: str = "rsync") -> None:
        if sync not in ("rsync", "none"):
            raise ValueError(f"sync must be rsync or none, got {sync!r}")
        self.ssh = SshHost(host, config=config, options=options, remote_slotq=remote_slotq)
        self.host = host
        self.sync = sync
        self.info: dict[str, object] = {}
        self.proc: Proc | None = None
        self._err = -1  # ssh's stderr: an unnamed temporary file
        self._fds: tuple[int, int] = (-1, -1)  # to the runner, from it
        self.transfer_s = 0.0
        self.sync_note: str | None = None  # files vanished while the tree was sent

    def notes(self) -> list[str]:
        return [self.sync_note] if self.sync_note else []

    def attach_options(self) -> list[str]:
        return ["--host", self.host, *(["--ssh-config", self.ssh.config] if self.ssh.config else []),
                *(o for opt in self.ssh.options for o in ("--ssh-option", opt)),
                *(["--remote-slotq", self.ssh.remote_slotq] if self.ssh.remote_slotq != "slotq" else [])]

    def prepare(self, spec: RunSpec) -> None:
        """Master, handshake (once per master), work tree. The host runner
        is started before the rsync and starts up while it runs; it joins
        the line only once told `synced` (start())."""
        import time

        self.ssh.ensure_master()
        self.info = self.ssh.handshake()
        if self.sync == "rsync":
            t0 = time.monotonic()
            src = spec.cwd or os.getcwd()
            spec.work_id = work_id(src)
            spec.cwd = None
            self._launch(spec, await_sync=True)
            try:
                self.send_tree(src, spec.work_id)
            except BaseException:  # HostUnavailable, WorkTreeError, or a stop signal's (caller.py)
                self.abandon()
                raise
            self.transfer_s = time.monotonic() - t0
        else:
            spec.cwd = os.path.realpath(spec.cwd or os.getcwd())

    def send_tree(self, src: str, work_id: str, pinned: int | None = None) -> None:
        """Mirror the work tree `src` (`pinned`: ssh.rsync's) into the host's
        work dir `work_id` (rsync). Raises HostUnavailable or WorkTreeError."""
        try:
            self.sync_note = self.ssh.rsync(src, os.path.join(str(self.info["work_root"]), work_id), pinned)
        except HostUnavailable:
            if not self.ssh.hello_kept:
                raise
            # The work root the kept handshake made may be gone since (a
            # state dir cleaned up): a new handshake makes it again. Once;
            # any other failure stays one.
            self.ssh.forget_handshake()
            self.info = self.ssh.handshake()
            self.sync_note = self.ssh.rsync(src, os.path.join(str(self.info["work_root"]), work_id), pinned)

    def describe(self) -> dict[str, object]:
        return {"kind": "ssh", "host": self.host, "master_reused": self.ssh.reused,
                "connect_s": round(self.ssh.connect_s, 4), "sync": self.sync,
                "rsync_s": round(self.transfer_s, 4), "remote_slotq": self.info.get("slotq"),
                "remote_host": self.info.get("host"), **({"sync_warning": self.sync_note} if self.sync_note else {})}

    def start(self, spec: RunSpec) -> tuple[int, int]:
        if self.proc is None:
            self._launch(spec, await_sync=False)
        else:
            os.write(self._fds[0], b"synced\n")  # started during the transfer: go
        return self._fds

    def _launch(self, spec: RunSpec, await_sync: bool) -> None:
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        err = os.open(os.environ.get("TMPDIR") or "/tmp", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        cmd = self.ssh.command(f"{self.ssh.remote_slotq} {self.host_command}"
                               + (" --await-sync" if await_sync else ""))
        try:
            self.proc = Proc(cmd, stdin=to_r, stdout=from_w, stderr=err)
        except BaseException:
            os.close(err)
            raise
        finally:
            os.close(to_r)
            os.close(from_w)
        self._err = err
        self._fds = (to_w, from_r)
        os.write(to_w, spec.to_request(protocol.choose(self.info)))

    def abandon(self) -> None:
        """The transfer failed: the waiting runner is told nothing (its stdin
        closes: it ends without joining the line)."""
        to_w, from_r = self._fds
        for fd in (to_w, from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = (-1, -1)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except TimeoutError:
                self.proc.kill()
                self.proc.wait()
        if self._err >= 0:
            os.close(self._err)
        self.proc, self._err = None, -1

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # the mux master then closes the session: the runner sees EOF

    def after_loss(self, run_id: str) -> str:
        import subprocess  # only after a lost stream

        try:
            proc = subprocess.run(self.ssh.command(f"{self.ssh.remote_slotq} host reap {run_id}"),
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return proc.stdout.decode(errors="replace").strip() if proc.returncode == 0 else ""

    def wait(self) -> str:
        if self.proc is None or self._err < 0:
            return ""
        rc = self.proc.wait()
        text = os.pread(self._err, 1 << 20, 0).decode(errors="replace").strip()
        os.close(self._err)
        self._err = -1
        if rc == 255:
            return f"connection to {self.host} lost: {text or 'ssh exited 255'}"
        return text
