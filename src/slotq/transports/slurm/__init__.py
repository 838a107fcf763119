"""A Slurm cluster: `slotq run --slurm`.

Slurm is the scheduler; slotq adds its clocks, outcomes, liveness and
visibility, and grows no queue of its own:

    client ──srun──► job (pending = queued ticket) ──allocation = slot──►
        slotq host run --slurm-job on the node ──► command (budget starts)

- `SlurmTransport` (here): `srun --unbuffered` runs `slotq host run
  --request-stdin --slurm-job` in a new job; its stdin/stdout carry the
  same request and framed stream as over ssh.
- `Relay` (relay.py): a thread in the client that owns srun: while the job
  is pending it tells the client what Slurm says (`queued` events from
  `pending_view`), it strips the node's hello, and it gives up at
  --max-wait.
- `JobEnding` (ending.py): when srun ends without the runner's result, how
  the job ended (cancelled, NODE_FAIL, TIMEOUT, ...), said as an `exited`
  event and written to the run's history.
- `Sentinel` (sentinel.py): the caller's liveness; it scancels the job the
  moment the caller is gone.
- What Slurm's tools say (sbatch, squeue, scontrol, sacct) is asked in
  ctl.py, which `slotq status --slurm` and `slotq cancel --slurm` use too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from ... import signals as signal
from ...config import HostConfig
from ...errors import SlotqError, UsageError
from ...records import load_scanner
from ...spec import RunSpec
from ..base import Transport
from .ctl import as_comment, job_info
from .ending import user_name
from .relay import Relay
from .sentinel import Sentinel

TIME_MARGIN = 120.0  # Slurm's --time covers prepare + budget + grace + this


class SlurmTransport(Transport):
    """Runs on a Slurm cluster: see the module doc. `options` are given to
    srun as they are (the config's `[slurm] options`, then --slurm-option)."""

    host = "slurm"

    def __init__(self, config: HostConfig, options: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        load_scanner()  # the node's stream: the C JSON scanner reads it
        self.config = config
        self.options = list(config.slurm.options) + list(options or [])
        self.env = env
        self.job_id: str | None = None
        self.partition: str | None = None
        self.qos: str | None = None
        self.node: str | None = None
        self.name = ""
        self._srun: subprocess.Popen[bytes] | None = None
        self._sentinel: Sentinel | None = None
        self._thread: threading.Thread | None = None
        self._lines: list[str] = []
        self._final: dict[str, str] | None = None

    # ----------------------------------------------------------- the job
    def job_for(self, cls: str) -> dict[str, str]:
        """The partition/QoS for run class `cls`; UsageError naming the
        classes the config maps when it maps no such one."""
        try:
            return self.config.slurm.job_for(cls)
        except KeyError:
            known = ", ".join(sorted(self.config.slurm.classes)) or "none"
            where = f" in {self.config.path}" if self.config.path else ""
            raise UsageError(f"class {cls!r} has no Slurm partition: add it to [slurm.classes]{where} "
                             f"(mapped: {known})") from None

    def srun_argv(self, spec: RunSpec) -> list[str]:
        job = self.job_for(spec.cls)
        self.partition, self.qos = job.get("partition"), job.get("qos")
        self.name = f"slotq-{spec.run_id}"
        argv = ["srun", "--unbuffered", "--ntasks=1", f"--job-name={self.name}"]
        if self.partition:
            argv.append(f"--partition={self.partition}")
        if self.qos:
            argv.append(f"--qos={self.qos}")
        # The label, for `slotq cancel --slurm --label` and the waiting lines
        # of others (Slurm keeps no other text of ours).
        argv.append(f"--comment={as_comment(spec.label)}")
        if not any(o == "-t" or o.startswith(("--time", "-t")) for o in self.options):
            # Slurm's limit is the backstop, never the budget: it covers the
            # prepare step, the budget, the grace and a margin.
            c = self.config
            seconds = ((spec.prepare_timeout or c.prepare_timeout) if spec.prepare else 0.0) \
                + (spec.budget if spec.budget is not None else c.budget) \
                + (spec.kill_grace if spec.kill_grace is not None else c.kill_grace) + TIME_MARGIN
            argv.append(f"--time={-(-int(seconds) // 60)}")
        argv += self.options
        slotq = self.config.slurm.slotq or [sys.executable, "-m", "slotq"]
        return argv + [*slotq, "host", "run", "--request-stdin", "--slurm-job"]

    def describe(self) -> dict[str, object]:
        return {"kind": "slurm", "job_id": self.job_id, "partition": self.partition, "qos": self.qos}

    def details(self) -> dict[str, object]:
        """For the result JSON: job id, partition, node list, final state."""
        info = self._final
        if info is None and self.job_id is not None:
            info = self._final = job_info(self.job_id, self.env)
        info = info or {}
        return {"slurm": {"job_id": self.job_id, "partition": info.get("Partition") or self.partition,
                          "qos": self.qos, "nodes": info.get("NodeList") or self.node,
                          "state": info.get("AcctState") or info.get("JobState"),
                          "reason": info.get("Reason"), "options": self.options}}

    # ----------------------------------------------------------- the run
    def start(self, spec: RunSpec) -> tuple[int, int]:
        if spec.submitted is None:  # (the caller's: the node's runner counts the run's wait from there)
            spec.submitted = time.time()
        ctl_r, ctl_w = os.pipe()
        ev_r, ev_w = os.pipe()
        argv = self.srun_argv(spec)
        user = user_name()
        # Before srun: the job cannot exist without its sentinel. Should the
        # caller die while the job is pending, the sentinel writes the run's
        # history line too (no node's runner will).
        from ...config import state_dir_from_env

        try:
            gone: dict[str, object] | None = {
                "run_id": spec.run_id, "label": spec.label, "cls": spec.cls, "submitted": spec.submitted,
                "budget": spec.budget if spec.budget is not None else self.config.budget, "kept": spec.kept,
                "state_dir": state_dir_from_env(), "name": self.name, "user": user}
        except SlotqError:  # no state dir to write to (the run's own line is lost the same way)
            gone = None
        self._sentinel = Sentinel(["--name", self.name, "--user", user], self.env, gone)
        try:
            self._srun = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=self.env, process_group=0)
        except OSError as e:
            self._srun = None
            failure: str | None = (f"cannot start srun: {e.strerror}"
                                   + (" (Slurm's client tools are not installed here)"
                                      if isinstance(e, FileNotFoundError) else ""))
        else:
            failure = None
        self._thread = threading.Thread(target=self._relay, args=(spec, ctl_r, ev_w, failure),
                                        name="slotq-slurm-relay", daemon=True)
        signal.start_thread(self._thread.start)
        return ctl_w, ev_r

    def kill(self) -> None:
        self._scancel()
        if self._srun is not None and self._srun.poll() is None:
            try:
                os.killpg(self._srun.pid, signal.SIGKILL)
            except OSError:
                pass

    def wait(self) -> str:
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self._sentinel is not None:
            self._sentinel.done()  # the job has ended (srun is gone): nothing left to cancel
        return "\n".join(self._lines[-5:])

    def _scancel(self) -> None:
        if self.name:
            try:
                subprocess.run(["scancel", "--quiet", "--name", self.name, "--user", user_name()],
                               env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass

    # ----------------------------------------------------------- the relay
    def _relay(self, spec: RunSpec, ctl_r: int, ev_w: int, failure: str | None) -> None:
        relay = Relay(self, spec, ctl_r, ev_w)
        try:
            if failure is not None:
                relay.error("unavailable", failure)
            else:
                relay.run()
        except BaseException as e:  # never silent: the client gets an ending
            try:
                relay.error("unavailable", f"the Slurm relay failed: {e!r}")
            except OSError:
                pass
        finally:
            os.close(ev_w)
            os.close(ctl_r)
