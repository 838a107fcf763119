"""Transports: how a client reaches a host runner.

The local transport runs the host side in a forked child -- no second Python
interpreter to start -- and talks to it over two pipes, exactly as a remote
runner is talked to over ssh: the same framed stream, and the same liveness
rule (the runner's stdin closing means the caller is gone).
"""

from __future__ import annotations

import os
import sys

from . import signals as signal
from .client import Transport
from .config import HostConfig
from .spec import RunSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import IO, Any


_unreaped: set[int] = set()


def _reap_done() -> None:
    for pid in list(_unreaped):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _unreaped.discard(pid)


class LocalTransport(Transport):
    """This machine is the host.

    The host side runs in a thread of the caller's process (`in_process`,
    the default): no second process to fork, COW-fault and reap on every run
    -- on two cores that is a good part of a hand-over's CPU. The caller's
    liveness is then its own: if the process dies, the thread dies with it,
    the kernel drops its ticket, and its keeper (whose parent thread is
    gone: PDEATHSIG) ends the command's group. `in_process=False` forks the
    host side into a child instead, as `slotq host run` is a process of its
    own on a remote host.
    """

    def __init__(self, state_dir: str | None = None, config: HostConfig | None = None, *,
                 in_process: bool = True) -> None:
        from .config import state_dir_from_env

        self.state_dir = state_dir or state_dir_from_env()
        self.config = config or HostConfig.load(state_dir=self.state_dir)
        self.host = os.uname().nodename
        self.in_process = in_process
        self.pid = 0
        self._done: Any = None  # the thread's lock, released when it has finished
        self._killed = False

    def start(self, spec: RunSpec) -> tuple[int, int]:
        _reap_done()
        ctl_r, ctl_w = os.pipe()
        ev_r, ev_w = os.pipe()
        if self.in_process:
            import _thread

            done = self._done = _thread.allocate_lock()
            done.acquire()
            _thread.start_new_thread(self._host_side, (spec, ctl_r, ev_w, done))
            return ctl_w, ev_r
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(ctl_w)
                os.close(ev_r)
                # Do not hold the caller's stdin/stdout: a reader of the
                # caller's output must see EOF when the caller is gone.
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                os.close(devnull)
                self._host_side(spec, ctl_r, ev_w, None)
                code = 0
            finally:
                os._exit(code)  # never return into the caller's code
        os.close(ctl_r)
        os.close(ev_w)
        self.pid = pid
        return ctl_w, ev_r

    def _host_side(self, spec: RunSpec, ctl_r: int, ev_w: int, done: Any) -> None:
        runner = None
        try:
            from .runner import HostRunner

            runner = HostRunner(spec, state_dir=self.state_dir, config=self.config, in_fd=ctl_r, out_fd=ev_w)
            runner.run()
        except BaseException as e:
            try:
                sys.stderr.write(f"slotq: host runner failed: {e!r}\n")
                sys.stderr.flush()
            except BaseException:
                pass
        finally:
            if runner is not None:
                runner.close_stream()
            else:
                os.close(ev_w)
            os.close(ctl_r)
            if done is not None:
                done.release()

    def kill(self) -> None:
        # The runner went silent. A child: SIGKILL it; its keeper then ends
        # the command's group (PDEATHSIG) and the slot is released. A
        # thread: the caller's channel closes when run() returns, and the
        # runner ends the command when it sees that.
        self._killed = True
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self) -> str:
        if self._done is not None:
            # The thread has sent its result and closed the stream; it is
            # writing the history line. Wait for that (bounded), not for a
            # runner that went silent.
            done, self._done = self._done, None
            if not self._killed and not done.acquire(timeout=10):
                return "the host runner did not finish its bookkeeping within 10 s"
            return ""
        # A child may still be tidying up: reap it now if it is done, else
        # at the next start (a CLI process simply exits; init reaps).
        if self.pid:
            _unreaped.add(self.pid)
            self.pid = 0
        _reap_done()
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
        from .ssh import SshHost

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

        from .ssh import work_id

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
        import subprocess
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
        import subprocess

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
