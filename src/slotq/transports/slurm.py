"""A Slurm cluster: `slotq run --slurm`.

Slurm is the scheduler; slotq adds its clocks, outcomes, liveness and
visibility, and grows no queue of its own:

    client ──srun──► job (pending = queued ticket) ──allocation = slot──►
        slotq host run --slurm-job on the node ──► command (budget starts)

- `SlurmTransport`: `srun --unbuffered` runs `slotq host run --request-stdin
  --slurm-job` in a new job; its stdin/stdout carry the same request and
  framed stream as over ssh. A relay thread in the client owns srun: while
  the job is pending it tells the client what Slurm says (`queued` events
  from `pending_view`), it strips the node's hello, and when srun ends
  without the runner's result it asks Slurm how the job ended (cancelled,
  NODE_FAIL, TIMEOUT, ...) and says so as an `exited` event.
- `Sentinel` (sentinel.py): the caller's liveness; it scancels the job the
  moment the caller is gone.
- What Slurm's tools say (sbatch, squeue, scontrol, sacct) is asked in
  slurmctl.py, which `slotq status --slurm` uses too.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time

from .. import __version__, protocol
from .. import signals as signal
from ..clock import INF
from ..config import HostConfig
from ..durations import format_duration
from ..errors import HostUnavailable, ProtocolError, SlotqError, UsageError
from ..records import load_scanner, to_json
from ..spec import RunSpec
from .base import Transport
from .sentinel import Sentinel
from .slurmctl import as_comment, job_info, pending_view

_SRUN_QUEUED = "srun: job "  # "srun: job 12 queued and waiting for resources"
# srun's refusals that are the infrastructure's, not the request's.
_INFRA = ("Unable to contact slurm controller", "Socket timed out", "Connection refused", "Zero Bytes",
          "Communication connection failure", "Slurm backup controller in standby", "Unable to establish",
          "Transport endpoint", "Slurmctld not responding")
_NO_CONFIG = ("_establish_config_source", "fetch_config", "Could not establish a configuration source")
_LAST_LINES = 50  # srun / node stderr lines kept for diagnostics
TIME_MARGIN = 120.0  # Slurm's --time covers prepare + budget + grace + this


def never_starts(reason: str) -> str | None:
    """What to change, if Slurm's pending reason means the job will never
    start as asked (a limit on one job that it exceeds, not a busy cluster:
    Slurm keeps such a job pending until someone changes a limit); None
    for a reason that passes (Resources, Priority, a partition down...)."""
    if reason == "PartitionTimeLimit" or (reason.startswith(("QOSMax", "AssocMax")) and "WallDuration" in reason):
        return ("its time limit (--budget, plus the grace and a margin) is more than the partition or QoS allows: "
                "ask for a shorter --budget")
    if reason.startswith(("QOSMax", "AssocMax")) and "PerJob" in reason:
        return "it asks for more than one job may have (--slurm-option)"
    if reason in ("BadConstraints", "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied"):
        return "its --slurm-option or the class's partition and QoS cannot be met"
    return None


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
        spec.submitted = time.time()  # the node's runner counts the run's wait in Slurm's line from here
        ctl_r, ctl_w = os.pipe()
        ev_r, ev_w = os.pipe()
        argv = self.srun_argv(spec)
        user = _user_name()
        # Before srun: the job cannot exist without its sentinel. Should the
        # caller die while the job is pending, the sentinel writes the run's
        # history line too (no node's runner will).
        from ..config import state_dir_from_env

        try:
            gone: dict[str, object] | None = {
                "run_id": spec.run_id, "label": spec.label, "cls": spec.cls, "submitted": spec.submitted,
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
        self._thread.start()
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
                subprocess.run(["scancel", "--quiet", "--name", self.name, "--user", _user_name()],
                               env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass

    # ----------------------------------------------------------- the relay
    def _relay(self, spec: RunSpec, ctl_r: int, ev_w: int, failure: str | None) -> None:
        relay = _Relay(self, spec, ctl_r, ev_w)
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


class _Relay:
    """The client's side of one srun: see the module doc."""

    def __init__(self, transport: SlurmTransport, spec: RunSpec, ctl_r: int, ev_w: int) -> None:
        self.t = transport
        self.spec = spec
        self.ctl_r = ctl_r
        self.ev_w = ev_w
        self.hello_sent = False
        self.node_live = False  # the node's runner has said hello
        self.ended = False  # an exited/error event went to the client
        self.cancel_reason: str | None = None  # the client cancelled before the node's runner started
        self.cancelled = "cancelled"  # how its messages say so: "cancelled (SIGTERM)" for a stop signal
        self.pending_since: float | None = None
        self.give_up = INF  # --max-wait: when a pending job is cancelled, not_admitted
        self.revoked_line = ""
        self.waited_pending = 0.0
        self.refused: str | None = None  # pending for a reason that never passes: why, for the error
        self.held: dict[str, object] | None = None  # the node's result, until srun's end says if Slurm cancelled
        self.allocated_at: float | None = None  # when the node's runner said hello

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.ev_w, view):]

    def event(self, name: str, **fields: object) -> None:
        self.hello()
        self.send(protocol.event_frame(name, time.time(), **fields))

    def hello(self) -> None:
        if not self.hello_sent:
            self.hello_sent = True
            self.send(protocol.MAGIC + protocol.event_frame(
                protocol.HELLO, time.time(), protocol=protocol.PROTOCOL_VERSION, version=__version__,
                host="slurm", pid=os.getpid(), run_id=self.spec.run_id))

    def error(self, kind: str, message: str) -> None:
        self.event(protocol.ERROR, kind=kind, message=message)
        self.ended = True

    def run(self) -> None:
        srun = self.t._srun
        assert srun is not None and srun.stdin and srun.stdout and srun.stderr
        to_srun = bytearray(self.spec.to_request())
        out, err, sin = srun.stdout.fileno(), srun.stderr.fileno(), srun.stdin.fileno()
        os.set_blocking(sin, False)
        decoder = protocol.Decoder()
        err_buf = b""
        reads = [out, err, self.ctl_r]
        next_report = INF
        ctl_closed = False
        while out in reads or err in reads:
            writes = [sin] if to_srun and sin >= 0 else []
            wake = min(next_report, self.give_up)
            timeout = None if wake == INF else max(0.0, wake - time.monotonic())
            ready, can_write, _ = select.select(reads, writes, [], timeout)
            if can_write:
                try:
                    del to_srun[:os.write(sin, to_srun)]
                except BlockingIOError:
                    pass
                except OSError:
                    to_srun.clear()  # srun is gone; its end is read below
                if not to_srun and ctl_closed:
                    srun.stdin.close()
                    sin = -1
            next_report = self._pending(next_report)
            for fd in ready:
                data = os.read(fd, 65536)
                if fd == out:
                    if not data:
                        reads.remove(out)
                        continue
                    try:
                        self.forward(decoder.feed(data))
                    except ProtocolError as e:
                        self.error("protocol", f"Slurm job {self.t.job_id}: {e}")
                        self.t.kill()
                        reads = [r for r in reads if r != out]
                elif fd == err:
                    if not data:
                        reads.remove(err)
                        data = b"\n"
                    err_buf += data
                    *lines, err_buf = err_buf.split(b"\n")
                    err_buf = err_buf[-65536:]
                    for line in lines:
                        if self.on_stderr(line.decode("utf-8", "replace")[:2000].rstrip()):
                            next_report = time.monotonic()
                    if self.node_live or self.pending_since is None:
                        next_report = INF
                else:  # the client
                    if not data:
                        reads.remove(self.ctl_r)
                        ctl_closed = True
                        if not self.node_live and not self.ended:
                            self.t._scancel()  # the client gave up before the node's runner started
                        if not to_srun and sin >= 0:
                            srun.stdin.close()
                            sin = -1
                    elif self.node_live or not data.startswith(b"cancel"):
                        to_srun += data  # for the node's runner (`close stdout` comes only once it runs)
                    else:
                        self._cancel_pending(data)
        srun.wait()
        if sin >= 0:
            try:
                srun.stdin.close()
            except OSError:
                pass
        if self.held is not None:
            self.release()
        if not self.ended:
            self.conclude(srun.returncode)

    def _pending(self, next_report: float) -> float:
        """While the job waits in Slurm's line: report when due, and give up
        at --max-wait (the pending job is the place). The next report's time."""
        if self.pending_since is None or self.node_live:
            return next_report
        if time.monotonic() >= next_report:
            self.report()
            next_report = time.monotonic() + self.spec.report_every
        if self.cancel_reason is None and not self.node_live and time.monotonic() >= self.give_up:
            self.waited_pending = time.monotonic() - self.pending_since
            self.cancel_reason = "not_admitted"
            self.give_up = INF
            self.t._scancel()
        return next_report

    def _cancel_pending(self, data: bytes) -> None:
        """The client's cancel while nothing runs yet: Slurm's to do."""
        reason = data.decode("ascii", "replace").split("\n")[0].removeprefix("cancel ").strip()
        self.cancel_reason = reason if reason in ("cancelled", "idle_timeout") else "cancelled"
        name = signal.word_name(reason)
        if name is not None:
            self.cancelled = f"cancelled ({name})"
        self.t._scancel()

    def forward(self, frames: list[tuple[bytes, bytes | dict[str, object]]]) -> None:
        out = bytearray()
        for kind, payload in frames:
            if kind != protocol.EVENT:
                out += protocol.frame(kind, payload)  # type: ignore[arg-type]
                continue
            ev: dict[str, object] = payload  # type: ignore[assignment]
            name = ev.get("event")
            if name == protocol.HELLO:
                self.node_live = True
                self.allocated_at = time.time()
                self.t.node = str(ev.get("host"))
                if self.hello_sent:
                    continue  # ours went first (the job waited); the node's host is in the result
                self.hello_sent = True
                out += protocol.MAGIC
            elif name == protocol.SLOT and self.t.job_id is None:
                slot = str(ev.get("slot"))  # "slurm job N" (the job never waited: srun did not say)
                if slot.startswith("slurm job ") and slot[10:].isdigit():
                    self.t.job_id = slot[10:]
            elif name in (protocol.EXITED, protocol.ERROR):
                self.ended = True
                if name == protocol.EXITED and self.cancel_reason is not None:
                    changed = self.as_cancelled(ev)
                    if changed is not ev:
                        self.record(changed)
                    ev = changed
                elif name == protocol.EXITED and _ended_by_a_kill(ev):
                    # A scancel (yours, slotq cancel's, an admin's) signals the
                    # command and the node's runner at once: the command may
                    # die first, and its runner report `failed (exit 143)`.
                    # Whether Slurm cancelled the job is known once srun ends.
                    self.held = ev
                    continue
            out += protocol.frame(protocol.EVENT, to_json(ev).encode())
        if out:
            self.send(bytes(out))

    def as_cancelled(self, ev: dict[str, object]) -> dict[str, object]:
        """The node's result after slotq scancelled the job for the caller's
        cancel. That happens when the cancel comes before the node's hello:
        while the job is pending, and also in the moment after its runner
        started, whose hello srun relays a few ms late. Slurm then signals
        every process of the job, so a command killed by a signal (or a
        shell's exit 128+n for a child Slurm's TERM or KILL ended) or a
        keeper killed is the cancel's doing, not a failure of the run; and
        a runner that says it was cancelled by a SIGTERM got Slurm's."""
        if _ended_by_a_kill(ev) or ev.get("outcome") == "cancelled":
            return dict(ev, outcome=self.cancel_reason,
                        message=f"{self.cancelled} while it ran; slotq cancelled Slurm job {self.t.job_id} "
                                f"before its runner could be told ({ev.get('message')})")
        return ev

    def release(self) -> None:
        """Send the held result, settled."""
        assert self.held is not None
        ev, self.held = self.held, None
        settled = self.settle(ev)
        if settled is not ev:
            self.record(settled)
        self.send(protocol.frame(protocol.EVENT, to_json(settled).encode()))

    def settle(self, ev: dict[str, object]) -> dict[str, object]:
        """The node's result of a command ended by a signal, once srun has
        ended: `cancelled`, naming who, if Slurm cancelled the job (the
        signal was the cancel's); else as the node said."""
        info = self.t._final = job_info(str(self.t.job_id), self.t.env)
        acct = info.get("AcctState", "")
        if info.get("JobState") != "CANCELLED" and not acct.startswith("CANCELLED") and not self.revoked_line:
            return ev
        return dict(ev, outcome="cancelled",
                    message=f"{self.facts(info)} was cancelled {_cancelled_by(acct)} while it ran "
                            f"({ev.get('message')})")

    def facts(self, info: dict[str, str]) -> str:
        facts = ", ".join(f"{k}={info[k]}" for k in ("JobState", "Reason", "NodeList") if info.get(k))
        return f"Slurm job {self.t.job_id}" + (f" ({facts})" if facts else " (Slurm no longer knows it)")

    def on_stderr(self, line: str) -> bool:
        """One line from srun (or the node's stderr); True when it says the
        job is pending (report now)."""
        lines = self.t._lines
        lines.append(line)
        del lines[:-_LAST_LINES]
        if line.startswith(_SRUN_QUEUED):
            words = line.split()
            if len(words) > 3 and words[2].isdigit():
                self.t.job_id = words[2]
                if "queued and waiting" in line:
                    self.pending_since = time.monotonic()
                    if self.spec.max_wait is not None:
                        self.give_up = self.pending_since + self.spec.max_wait
                    return True
                if "allocated resources" in line:
                    self.pending_since = None
                    self.give_up = INF
        elif "has been revoked" in line or "CANCELLED AT" in line:
            self.revoked_line = line
        return False

    def report(self) -> None:
        job = self.t.job_id
        assert job is not None and self.pending_since is not None
        waited = round(time.monotonic() - self.pending_since, 3)
        try:
            view = pending_view(job, self.t.partition, self.t.env)
        except HostUnavailable as e:
            view = {"job_id": job, "partition": self.t.partition, "state": "unknown", "error": str(e)}
        if view.get("state") != "PENDING":
            return  # allocated just now: the runner's slot event follows
        reason = view.get("reason")
        change = never_starts(reason) if isinstance(reason, str) else None
        if change and self.cancel_reason is None:
            # Slurm would keep it pending until someone changes a limit: a
            # refusal, as if Slurm had refused it when it was submitted.
            part = view.get("partition")
            where = f" (partition {part!r})" if isinstance(part, str) and part != "?" else ""
            self.refused = (f"Slurm refused the job{where}: Slurm job {job} would never start as asked, pending "
                            f"for reason {reason}: {change}; slotq cancelled it")
            self.cancel_reason = "cancelled"  # should it start after all, in the moment before the scancel
            self.give_up = INF
            self.t._scancel()
            return
        position = view.get("position")
        self.event(protocol.QUEUED, waited_s=waited, position=position if isinstance(position, int) else 1,
                   ahead=position - 1 if isinstance(position, int) else 0,
                   waiting=view.get("pending") if isinstance(view.get("pending"), int) else 1,
                   pool=str(view.get("partition")), holders=[], slurm=view)

    def conclude(self, code: int | None) -> None:
        """srun ended without the runner's result: how did the job end?"""
        job = self.t.job_id
        if job is None:
            # No job: Slurm refused it (or srun could not reach Slurm).
            why = next((ln.split("error: ", 1)[-1] for ln in reversed(self.t._lines) if "error" in ln),
                       self.t._lines[-1] if self.t._lines else f"srun exited {code}")
            if self.cancel_reason is not None:
                message = f"{self.cancelled} before Slurm had the job"
                self.event(protocol.EXITED, outcome=self.cancel_reason, exit_code=None, message=message,
                           phases={"ended": time.time()})
                self.record({"outcome": self.cancel_reason, "message": message})
                self.ended = True
            elif any(s in why for s in _NO_CONFIG):
                self.error("unavailable", f"Slurm is not set up here: its tools found no configuration "
                                          f"(no slurm.conf, and none from $SLURM_CONF or a slurmctld): {why}")
            elif any(s in why for s in _INFRA):
                self.error("unavailable", f"Slurm is not answering: {why}")
            else:
                where = f" (partition {self.t.partition!r})" if self.t.partition else ""
                self.error("usage", f"Slurm refused the job{where}: {why}")
            return
        if self.refused is not None and not self.node_live:
            self.error("usage", self.refused)
            return
        info = self.t._final = job_info(job, self.t.env)
        state = info.get("JobState", "")
        acct = info.get("AcctState", "")
        facts = self.facts(info)
        when = "while it ran" if self.node_live else "while pending"
        if self.cancel_reason == "not_admitted" and not self.node_live:
            limit = self.spec.max_wait or 0.0
            outcome, message = "not_admitted", (
                f"not admitted: pending {format_duration(self.waited_pending)} in Slurm's line, the limit set "
                f"by --max-wait {format_duration(limit)}; slotq cancelled {facts}" if limit else
                f"not admitted: Slurm had no free resources for it, and --max-wait 0 means no waiting; "
                f"slotq cancelled {facts}")
        elif self.cancel_reason is not None:
            outcome, message = self.cancel_reason, f"{self.cancelled} {when}; slotq cancelled {facts}"
        elif state == "CANCELLED" or acct.startswith("CANCELLED"):
            outcome, message = "cancelled", f"{facts} was cancelled {_cancelled_by(acct)} {when}" + (
                f": {self.revoked_line}" if self.revoked_line else "")
        elif state == "TIMEOUT":
            outcome, message = "backstop", (f"{facts} reached Slurm's time limit ({info.get('TimeLimit', '?')}) "
                                            "before slotq's own budget enforcement could end it")
        else:
            outcome = "unavailable"
            message = (f"{facts} ended {when} without a result from slotq's runner"
                       + (f" (srun exited {code})" if code else "")
                       + (f": {self.t._lines[-1]}" if self.t._lines else ""))
        self.event(protocol.EXITED, outcome=outcome, exit_code=None, signal=None, message=message,
                   phases={"ended": time.time()})
        self.record({"outcome": outcome, "message": message})
        self.ended = True

    def record(self, ev: dict[str, object]) -> None:
        """The run's history line, for an ending the relay decided: the
        node's runner wrote none (the job never reached it, or it was
        killed), or wrote the one it saw before Slurm's cancel was known.
        Into this user's state dir (the node's runner writes into the
        same path: one place when home is shared); `slotq history` shows
        this line, marked `relay`, whichever of the two was written last.
        Never a failure of the run."""
        from ..config import state_dir_from_env
        from ..history import append, run_record
        from ..host.hostqueue import ensure_state_dir

        theirs = ev.get("phases")
        phases: dict[str, float | None] = {k: v for k, v in (theirs if isinstance(theirs, dict) else {}).items()
                                           if isinstance(v, (int, float))}
        phases.update(submitted=self.spec.submitted, ended=phases.get("ended") or time.time())
        if self.allocated_at is not None:
            phases.setdefault("slot", self.allocated_at)
        job = self.t.job_id
        code = ev.get("exit_code")
        try:
            state_dir = state_dir_from_env()
            ensure_state_dir(state_dir)
            line = run_record(
                run_id=self.spec.run_id, label=self.spec.label, cls=self.spec.cls, host=self.t.node or "slurm",
                outcome=str(ev.get("outcome")), exit_code=code if isinstance(code, int) else None,
                message=str(ev.get("message") or ""), phases=phases, pool=self.spec.cls,
                slot=f"slurm job {job}" if job and self.allocated_at is not None else None)
            append(state_dir, dict(line, relay=True))  # never replaced by the node's, written first or last
        except Exception:  # (a state dir that cannot be used: the run's result is what matters)
            pass


def _ended_by_a_kill(ev: dict[str, object]) -> bool:
    """The node's result says the command was killed (a signal, or a
    shell's 128+TERM/KILL for a child killed), or its runner lost it."""
    killed = ev.get("signal") is not None or ev.get("exit_code") in (128 + signal.SIGTERM, 128 + signal.SIGKILL)
    return ev.get("outcome") == "unavailable" or (ev.get("outcome") == "failed" and killed)


def _cancelled_by(acct: str) -> str:
    """Who cancelled a job, from sacct's state ("CANCELLED by 1000"), said
    as `by alice (scancel)`; without accounting, who could have."""
    who = acct.split(" by ", 1)[1] if " by " in acct else ""
    if who.isdigit():
        who = _user_name(int(who))
    return f"by {who} (scancel)" if who else "by scancel (its owner or an administrator)"


def _user_name(uid: int | None = None) -> str:
    import pwd

    uid = os.getuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
