"""How a Slurm job ended, when the node's runner cannot say (or said it
before Slurm's cancel was known): the relay's verdicts (relay.py), and
the run's history line for an ending the relay decided.

Its inputs are what the relay saw: the client's cancel, srun's lines
(a revoked allocation), a pending reason that never passes, the node's
hello; and Slurm's own facts about the job (`job_info`, asked once srun
has ended)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ... import signals as signal
from ...durations import format_duration
from .ctl import job_info

if TYPE_CHECKING:
    from ...spec import RunSpec
    from . import SlurmTransport

# srun's refusals that are the infrastructure's, not the request's.
_INFRA = ("Unable to contact slurm controller", "Socket timed out", "Connection refused", "Zero Bytes",
          "Communication connection failure", "Slurm backup controller in standby", "Unable to establish",
          "Transport endpoint", "Slurmctld not responding")
_NO_CONFIG = ("_establish_config_source", "fetch_config", "Could not establish a configuration source")


class JobEnding:
    """What the relay knows of how its job will end, and the verdicts
    drawn from it. An ending is `(event, fields)`: ("exited", outcome and
    message) or ("error", kind and message)."""

    def __init__(self, transport: SlurmTransport, spec: RunSpec) -> None:
        self.t = transport
        self.spec = spec
        self.cancel_reason: str | None = None  # the client cancelled before the node's runner started
        self.cancelled = "cancelled"  # how its messages say so: "cancelled (SIGTERM)" for a stop signal
        self.refused: str | None = None  # pending for a reason that never passes: why, for the error
        self.revoked_line = ""  # srun's word that Slurm took the allocation back
        self.waited_pending = 0.0  # time in Slurm's line, when --max-wait gave up
        self.allocated_at: float | None = None  # when the node's runner said hello

    @property
    def node_live(self) -> bool:
        return self.allocated_at is not None

    def client_cancel(self, line: bytes) -> None:
        """The client's `cancel <reason>` while nothing runs yet; or a kept
        run's `lapsed <lease seconds>`: nobody came back within its lease."""
        first = line.decode("ascii", "replace").split("\n")[0]
        if first.startswith("lapsed "):
            seconds = first[7:].strip()
            lease = float(seconds) if seconds.replace(".", "", 1).isdigit() else 0.0
            self.cancel_reason = "caller_gone"
            self.cancelled = f"nobody attached within the {format_duration(lease)} lease"
            return
        reason = first.removeprefix("cancel ").strip()
        self.cancel_reason = reason if reason in ("cancelled", "idle_timeout") else "cancelled"
        name = signal.word_name(reason)
        if name is not None:
            self.cancelled = f"cancelled ({name})"

    def as_cancelled(self, ev: dict[str, object]) -> dict[str, object]:
        """The node's result after slotq scancelled the job for the caller's
        cancel. That happens when the cancel comes before the node's hello:
        while the job is pending, and also in the moment after its runner
        started, whose hello srun relays a few ms late. Slurm then signals
        every process of the job, so a command killed by a signal (or a
        shell's exit 128+n for a child Slurm's TERM or KILL ended) or a
        keeper killed is the cancel's doing, not a failure of the run; and
        a runner that says it was cancelled by a SIGTERM got Slurm's."""
        if ended_by_a_kill(ev) or ev.get("outcome") == "cancelled":
            return dict(ev, outcome=self.cancel_reason,
                        message=f"{self.cancelled} while it ran; slotq cancelled Slurm job {self.t.job_id} "
                                f"before its runner could be told ({ev.get('message')})")
        return ev

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

    def without_result(self, code: int | None) -> tuple[str, dict[str, object]]:
        """srun ended (exit `code`) without the runner's result: how did
        the job end?"""
        if self.t.job_id is None:
            return self._never_a_job(code)
        if self.refused is not None and not self.node_live:
            return "error", {"kind": "usage", "message": self.refused}
        return "exited", self._job_ended(code)

    def _never_a_job(self, code: int | None) -> tuple[str, dict[str, object]]:
        """No job: Slurm refused it (or srun could not reach Slurm), or the
        client cancelled before Slurm had it."""
        lines = self.t._lines
        why = next((ln.split("error: ", 1)[-1] for ln in reversed(lines) if "error" in ln),
                   lines[-1] if lines else f"srun exited {code}")
        if self.cancel_reason is not None:
            return "exited", {"outcome": self.cancel_reason, "message": f"{self.cancelled} before Slurm had the job"}
        if any(s in why for s in _NO_CONFIG):
            return "error", {"kind": "unavailable", "message": (
                f"Slurm is not set up here: its tools found no configuration (no slurm.conf, and none from "
                f"$SLURM_CONF or a slurmctld): {why}")}
        if any(s in why for s in _INFRA):
            return "error", {"kind": "unavailable", "message": f"Slurm is not answering: {why}"}
        where = f" (partition {self.t.partition!r})" if self.t.partition else ""
        return "error", {"kind": "usage", "message": f"Slurm refused the job{where}: {why}"}

    def _job_ended(self, code: int | None) -> dict[str, object]:
        """A job that existed and ended without the runner's result: what
        Slurm says of it, and what the relay knows."""
        info = self.t._final = job_info(str(self.t.job_id), self.t.env)
        state, acct, facts = info.get("JobState", ""), info.get("AcctState", ""), self.facts(info)
        when = "while it ran" if self.node_live else "while pending"
        if self.cancel_reason == "not_admitted" and not self.node_live:
            limit = self.spec.max_wait or 0.0
            return {"outcome": "not_admitted", "message": (
                f"not admitted: pending {format_duration(self.waited_pending)} in Slurm's line, the limit set "
                f"by --max-wait {format_duration(limit)}; slotq cancelled {facts}" if limit else
                f"not admitted: Slurm had no free resources for it, and --max-wait 0 means no waiting; "
                f"slotq cancelled {facts}")}
        if self.cancel_reason is not None:
            return {"outcome": self.cancel_reason, "message": f"{self.cancelled} {when}; slotq cancelled {facts}"}
        if state == "CANCELLED" or acct.startswith("CANCELLED"):
            return {"outcome": "cancelled", "message": f"{facts} was cancelled {_cancelled_by(acct)} {when}"
                    + (f": {self.revoked_line}" if self.revoked_line else "")}
        if state == "TIMEOUT":
            return {"outcome": "backstop", "message": f"{facts} reached Slurm's time limit "
                    f"({info.get('TimeLimit', '?')}) before slotq's own budget enforcement could end it"}
        lines = self.t._lines
        return {"outcome": "unavailable", "message": (f"{facts} ended {when} without a result from slotq's runner"
                                                      + (f" (srun exited {code})" if code else "")
                                                      + (f": {lines[-1]}" if lines else ""))}

    def facts(self, info: dict[str, str]) -> str:
        facts = ", ".join(f"{k}={info[k]}" for k in ("JobState", "Reason", "NodeList") if info.get(k))
        return f"Slurm job {self.t.job_id}" + (f" ({facts})" if facts else " (Slurm no longer knows it)")

    def record(self, ev: dict[str, object]) -> None:
        """The run's history line, for an ending the relay decided: the
        node's runner wrote none (the job never reached it, or it was
        killed), or wrote the one it saw before Slurm's cancel was known.
        Into this user's state dir (the node's runner writes into the
        same path: one place when home is shared); `slotq history` shows
        this line, marked `relay`, whichever of the two was written last.
        Never a failure of the run."""
        from ...config import state_dir_from_env
        from ...history import append, run_record
        from ...host.hostqueue import ensure_state_dir

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
                slot=f"slurm job {job}" if job and self.allocated_at is not None else None, ticket=None,
                budget=self.t.config.budget if self.spec.budget is None else self.spec.budget,
                kept=self.spec.kept)
            append(state_dir, dict(line, relay=True))  # never replaced by the node's, written first or last
        except Exception:  # (a state dir that cannot be used: the run's result is what matters)
            pass


def ended_by_a_kill(ev: dict[str, object]) -> bool:
    """The node's result says the command was killed (a signal, or a
    shell's 128+TERM/KILL for a child killed), or its runner lost it."""
    killed = ev.get("signal") is not None or ev.get("exit_code") in (128 + signal.SIGTERM, 128 + signal.SIGKILL)
    return ev.get("outcome") == "unavailable" or (ev.get("outcome") == "failed" and killed)


def _cancelled_by(acct: str) -> str:
    """Who cancelled a job, from sacct's state ("CANCELLED by 1000"), said
    as `by alice (scancel)`; without accounting, who could have."""
    who = acct.split(" by ", 1)[1] if " by " in acct else ""
    if who.isdigit():
        who = user_name(int(who))
    return f"by {who} (scancel)" if who else "by scancel (its owner or an administrator)"


def user_name(uid: int | None = None) -> str:
    import pwd

    uid = os.getuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
