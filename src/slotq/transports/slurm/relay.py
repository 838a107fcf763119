"""The client's side of one srun, in a thread of its own (see the package
doc): the request to srun's stdin; the node's framed stream back to the
client, its hello stripped when ours went first; what Slurm says while
the job is pending, as `queued` events; --max-wait; and, when srun ends
without the runner's result, the ending `JobEnding` (ending.py) decides."""

from __future__ import annotations

import os
import select
import time
from typing import TYPE_CHECKING

from ... import __version__, protocol
from ...clock import INF
from ...errors import HostUnavailable, ProtocolError
from ...records import to_json
from .ctl import pending_view
from .ending import JobEnding, ended_by_a_kill

if TYPE_CHECKING:
    from ...spec import RunSpec
    from . import SlurmTransport

_SRUN_QUEUED = "srun: job "  # "srun: job 12 queued and waiting for resources"
_LAST_LINES = 50  # srun / node stderr lines kept for diagnostics


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


class Relay:
    """One srun's streams, between the client (ctl_r in, ev_w out) and
    srun (stdin, stdout, stderr)."""

    def __init__(self, transport: SlurmTransport, spec: RunSpec, ctl_r: int, ev_w: int) -> None:
        self.t = transport
        self.spec = spec
        self.ctl_r = ctl_r
        self.ev_w = ev_w
        self.end = JobEnding(transport, spec)
        self.hello_sent = False
        self.ended = False  # an exited/error event went to the client
        self.pending_since: float | None = None
        self.give_up = INF  # --max-wait: when a pending job is cancelled, not_admitted
        self.held: dict[str, object] | None = None  # the node's result, until srun's end says if Slurm cancelled

    # ----------------------------------------------------------- to the client
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

    # ----------------------------------------------------------- the pump
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
                    if self.end.node_live or self.pending_since is None:
                        next_report = INF
                else:  # the client
                    if not data:
                        reads.remove(self.ctl_r)
                        ctl_closed = True
                        if not self.end.node_live and not self.ended:
                            self.t._scancel()  # the client gave up before the node's runner started
                        if not to_srun and sin >= 0:
                            srun.stdin.close()
                            sin = -1
                    elif self.end.node_live or not data.startswith((b"cancel", b"lapsed")):
                        to_srun += data  # for the node's runner (`close stdout` comes only once it runs)
                    else:  # a cancel, or a kept run's lease lapsed (client/standin.py)
                        self.end.client_cancel(data)  # nothing runs yet: Slurm's to do
                        self.t._scancel()
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

    def forward(self, frames: list[tuple[bytes, bytes | dict[str, object]]]) -> None:
        """The node's frames, on to the client."""
        out = bytearray()
        for kind, payload in frames:
            if kind != protocol.EVENT:
                out += protocol.frame(kind, payload)  # type: ignore[arg-type]
                continue
            ev: dict[str, object] = payload  # type: ignore[assignment]
            name = ev.get("event")
            if name == protocol.HELLO:
                self.end.allocated_at = time.time()
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
                if name == protocol.EXITED and self.end.cancel_reason is not None:
                    changed = self.end.as_cancelled(ev)
                    if changed is not ev:
                        self.end.record(changed)
                    ev = changed
                elif name == protocol.EXITED and ended_by_a_kill(ev):
                    # A scancel (yours, slotq cancel's, an admin's) signals the
                    # command and the node's runner at once: the command may
                    # die first, and its runner report `failed (exit 143)`.
                    # Whether Slurm cancelled the job is known once srun ends.
                    self.held = ev
                    continue
            out += protocol.frame(protocol.EVENT, to_json(ev).encode())
        if out:
            self.send(bytes(out))

    def release(self) -> None:
        """Send the held result, settled."""
        assert self.held is not None
        ev, self.held = self.held, None
        settled = self.end.settle(ev)
        if settled is not ev:
            self.end.record(settled)
        self.send(protocol.frame(protocol.EVENT, to_json(settled).encode()))

    def conclude(self, code: int | None) -> None:
        """srun ended without the runner's result: the ending, told and
        written."""
        name, fields = self.end.without_result(code)
        if name == protocol.ERROR:
            self.error(str(fields["kind"]), str(fields["message"]))
            return
        self.event(protocol.EXITED, exit_code=None, signal=None, phases={"ended": time.time()}, **fields)
        self.end.record(fields)
        self.ended = True

    # ----------------------------------------------------------- Slurm's line
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
            self.end.revoked_line = line
        return False

    def _pending(self, next_report: float) -> float:
        """While the job waits in Slurm's line: report when due, and give up
        at --max-wait (the pending job is the place). The next report's time."""
        if self.pending_since is None or self.end.node_live:
            return next_report
        if time.monotonic() >= next_report:
            self.report()
            next_report = time.monotonic() + self.spec.report_every
        if self.end.cancel_reason is None and time.monotonic() >= self.give_up:
            self.end.waited_pending = time.monotonic() - self.pending_since
            self.end.cancel_reason = "not_admitted"
            self.give_up = INF
            self.t._scancel()
        return next_report

    def report(self) -> None:
        """A `queued` event from what Slurm says of the pending job; or,
        for a reason that never passes, the job cancelled as refused."""
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
        if change and self.end.cancel_reason is None:
            # Slurm would keep it pending until someone changes a limit: a
            # refusal, as if Slurm had refused it when it was submitted.
            part = view.get("partition")
            where = f" (partition {part!r})" if isinstance(part, str) and part != "?" else ""
            self.end.refused = (f"Slurm refused the job{where}: Slurm job {job} would never start as asked, "
                                f"pending for reason {reason}: {change}; slotq cancelled it")
            self.end.cancel_reason = "cancelled"  # should it start after all, in the moment before the scancel
            self.give_up = INF
            self.t._scancel()
            return
        position = view.get("position")
        self.event(protocol.QUEUED, waited_s=waited, position=position if isinstance(position, int) else 1,
                   ahead=position - 1 if isinstance(position, int) else 0,
                   waiting=view.get("pending") if isinstance(view.get("pending"), int) else 1,
                   pool=str(view.get("partition")), holders=[], slurm=view)
