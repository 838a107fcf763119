"""Kept runs, the client's side: a run that outlives its caller
(`slotq run --detach / --attach-for`) and the callers that come back to it
(`slotq attach`). docs/agents.md; the host's side is host/kept.py.

The transport starts `slotq host keep` (a new run) or `slotq host attach`
(an existing one) on the host and reads its stream as any runner's. The
command runs in a session of its own: a stop signal reaches only the
client, which says `cancel` and so leaves the run (`detached`); if the
client is killed, its stdin closes and the attacher goes -- the run stays,
under its lease.

Over ssh (`--host`), `kept_over_ssh` and `attach_over_ssh` run the same
host commands through the ssh transport (its master, handshake and work
tree transfer); the run's wait is then recorded here, on the caller's
machine, by whichever attacher sees its slot (once: the ledger keys it by
run id).

In Slurm (`--slurm`) the run's process is kept here, on the machine that
submits: it holds the srun of the job as a caller would (client/standin.py),
so attach, the lease and cancel work as for a run of this machine. So it is
for a run late-bound over several hosts (`--host A,B,C`): its process here
holds a reservation on each (transports/bound.py) as a caller would; the
lease covers them all, and should the process go, every host withdraws its
reservation.
"""

from __future__ import annotations

import os
import sys

from ..durations import exact
from ..signals import start_thread
from ..spec import MAX_BIND
from .base import Transport

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any

    from ..spec import RunSpec
    from .ssh import SshTransport


def keep_args(lease: float | None, log_max: int | None, idle: float | None, credit_dir: str | None,
              attach_for: float | None, detach: bool, slurm_options: list[str] | None = None,
              hosts: Reach | None = None) -> list[str]:
    """`slotq host keep`'s arguments; `slurm_options` (a list, maybe
    empty): the run is a Slurm job, with these srun options; `hosts`:
    the run is late-bound over these hosts."""
    args = ["keep", "--request-stdin"]
    if hosts is not None:
        from ..records import to_json

        args += ["--hosts", to_json(hosts.to_dict())]
    for name, value in (("--lease", lease), ("--log-max", log_max), ("--idle", idle),
                        ("--credit-dir", credit_dir), ("--attach-for", attach_for)):
        if value is not None:
            args += [name, exact(value) if isinstance(value, float) else str(value)]
    if slurm_options is not None:
        args += ["--slurm", *(f"--slurm-option={o}" for o in slurm_options)]
    return args + (["--detach"] if detach else [])


MAX_REACH = 16384  # bytes of `--hosts`: the hosts and how ssh reaches them


class Reach:
    """How a kept run's process reaches the hosts it is late-bound over:
    `--hosts` of `slotq host keep` (as JSON), kept in the run's request."""

    def __init__(self, hosts: list[str], ssh_config: str | None, ssh_options: list[str], remote_slotq: str,
                 sync: str) -> None:
        self.hosts = hosts
        self.ssh_config = ssh_config
        self.ssh_options = ssh_options
        self.remote_slotq = remote_slotq
        self.sync = sync

    def to_dict(self) -> dict[str, object]:
        return {"hosts": self.hosts, "ssh_config": self.ssh_config, "ssh_options": self.ssh_options,
                "remote_slotq": self.remote_slotq, "sync": self.sync}

    @classmethod
    def parse(cls, text: str) -> Reach:
        """From `--hosts`: ValueError, naming what is wrong, for text past
        MAX_REACH or anything from_dict refuses."""
        from ..records import from_json

        if len(text) > MAX_REACH:
            raise ValueError(f"longer than {MAX_REACH} bytes")
        return cls.from_dict(from_json(text, 3))

    @classmethod
    def from_dict(cls, d: object) -> Reach:
        """Read back (from `--hosts`, or a kept run's request): ValueError,
        naming what is wrong, for anything but what to_dict makes (two
        hosts or more, names ssh would not read as options, strings where
        strings go)."""
        if not isinstance(d, dict) or set(d) != {"hosts", "ssh_config", "ssh_options", "remote_slotq", "sync"}:
            raise ValueError("not the hosts of a late-bound run")
        hosts, options, config, remote, sync = (d["hosts"], d["ssh_options"], d["ssh_config"], d["remote_slotq"],
                                                d["sync"])
        if not isinstance(hosts, list) or not 2 <= len(hosts) <= MAX_BIND or \
                not all(isinstance(h, str) and h and not h.startswith("-") for h in hosts):
            raise ValueError(f"'hosts': two to {MAX_BIND} host names")
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise ValueError("'ssh_options': a list of strings")
        if not (config is None or isinstance(config, str)) or not isinstance(remote, str) or not remote.strip():
            raise ValueError("'ssh_config' and 'remote_slotq': strings")
        if sync not in ("rsync", "none"):
            raise ValueError("'sync': rsync or none")
        return cls(hosts, config, options, remote, str(sync))

    def transports(self) -> list[SshTransport]:
        from .ssh import SshTransport

        return [SshTransport(h, config=self.ssh_config, options=self.ssh_options, remote_slotq=self.remote_slotq,
                             sync=self.sync) for h in self.hosts]


def attach_args(run_id: str, attach_for: float | None, from_start: bool) -> list[str]:
    """`slotq host attach`'s arguments."""
    args = ["attach", run_id]
    if attach_for is not None:
        args += ["--for", exact(attach_for)]
    return args + (["--from-start"] if from_start else [])


def over_ssh(transport: SshTransport, host_args: list[str]) -> SshTransport:
    """The ssh transport, running `slotq host <host_args>` on the host in
    place of `host run` (keep: `--waits-by-caller`, our ledger is here)."""
    from .ssh import _quote

    if host_args[0] == "keep":
        host_args = [*host_args, "--waits-by-caller"]
    transport.host_command = "host " + " ".join(_quote(a) for a in host_args)
    transport.waits_by_caller = True
    transport.kept = True
    transport.attaching = host_args[0] == "attach"
    return transport


class KeptTransport(Transport):
    kept = True

    def __init__(self, host_args: list[str], send_request: bool) -> None:
        """`host_args`: after `slotq host` (keep ... or attach ID ...);
        `send_request`: write the run's request on its stdin first (keep)."""
        self.host = os.uname().nodename
        self.host_args = host_args
        self.send_request = send_request
        self.proc: subprocess.Popen[bytes] | None = None
        self.here: tuple[str, float | None, bool] | None = None  # attach in a thread of ours: (id, for, from start)
        self._done: Any = None  # that thread's lock, released when it is done
        self._failure = ""

    @classmethod
    def keep(cls, *, lease: float | None, log_max: int | None, idle: float | None, credit_dir: str | None,
             attach_for: float | None, detach: bool, slurm_options: list[str] | None = None) -> KeptTransport:
        """A new kept run here; `slurm_options` (a list): a Slurm job."""
        return cls(keep_args(lease, log_max, idle, credit_dir, attach_for, detach, slurm_options), send_request=True)

    @classmethod
    def attach(cls, run_id: str, *, attach_for: float | None, from_start: bool) -> KeptTransport:
        """Here, the attacher is a thread of ours (host/follow.py): a
        second interpreter would be most of an attach's time."""
        transport = cls(attach_args(run_id, attach_for, from_start), send_request=False)
        transport.here = (run_id, attach_for, from_start)
        transport.attaching = True
        return transport

    def start(self, spec: RunSpec) -> tuple[int, int]:
        if self.here is not None:
            return self._attach_here(*self.here)
        import subprocess

        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "slotq", "host", *self.host_args], stdin=to_r,
                                         stdout=from_w, stderr=subprocess.PIPE, start_new_session=True)
        finally:
            os.close(to_r)
            os.close(from_w)
        if self.send_request:
            try:
                os.write(to_w, spec.to_request())
            except OSError:
                pass
        return to_w, from_r

    def _attach_here(self, run_id: str, attach_for: float | None, from_start: bool) -> tuple[int, int]:
        import _thread

        from ..host import follow

        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        done = self._done = _thread.allocate_lock()
        done.acquire()

        def attacher() -> None:
            try:
                follow.attach(run_id, from_w, to_r, attach_for, from_start)
            except BrokenPipeError:
                pass  # our reader is gone: so are we (the run is not)
            except Exception as e:
                self._failure = f"{type(e).__name__}: {e}"
            finally:
                os.close(from_w)
                os.close(to_r)
                done.release()

        start_thread(_thread.start_new_thread, attacher, ())
        return to_w, from_r

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def wait(self) -> str:
        if self._done is not None:
            done, self._done = self._done, None
            if not done.acquire(timeout=10):
                return "the attacher did not finish within 10 s"
            return self._failure
        if self.proc is None:
            return ""
        assert self.proc.stderr is not None
        err = self.proc.stderr.read(64 * 1024)
        self.proc.stderr.close()
        self.proc.wait()
        return err.decode(errors="replace")
