"""How a run ended, as its caller tells it: `RunResult` (what `run --json`
prints) and the one summary line."""

from __future__ import annotations

from .. import record
from ..durations import format_duration, seconds_in
from ..outcome import Outcome, exit_code_for
from ..spec import RunSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

from ..record import PHASES


class RunResult:
    """How one run ended. `phases` holds wall-clock epoch seconds (host
    clock, `submitted` from the client), None when never reached."""

    def __init__(self, spec: RunSpec, host: str) -> None:
        self.outcome = Outcome.UNAVAILABLE
        self.command_code: int | None = None
        self.run_id = spec.run_id
        self.label = spec.label
        self.cls = spec.cls
        self.host = host
        self.message = ""
        self.phases: dict[str, float | None] = dict.fromkeys(PHASES)
        self.slot: str | None = None
        self.ticket: int | None = None  # the host's sequence number: the order its queue keeps
        self.budget = spec.budget
        self.transport: dict[str, object] = {}
        self.details: Callable[[], dict[str, object]] = dict  # the transport's extra fields (Slurm's job)
        # Measured on the client's monotonic clock: host clocks may differ.
        self.transfer_s: float | None = None
        self.queue_s: float | None = None
        self.open_line = False  # the command's stdout ended without a newline
        self.not_started = False  # the command could not be started (not found, not executable)
        self.announced = False  # a status line has named the run id

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.outcome, self.command_code)

    @property
    def said_when_quiet(self) -> bool:
        """-q silences progress, not an ending slotq decided, nor a command
        that could not be started (no output of its own says why)."""
        return self.outcome.decided_by_slotq or self.not_started

    @property
    def blame(self) -> str:
        return self.outcome.blame

    @property
    def waited_s(self) -> float | None:
        """As the phases say (record.waited_s: the one definition the history
        line, attach and the MCP server share); a run the host never
        answered: the caller's own measure."""
        waited = record.waited_s(self.phases)
        return waited if waited is not None or self.queue_s is None else round(self.queue_s, 3)

    @property
    def ran_s(self) -> float | None:
        return record.ran_s(self.phases)

    def to_dict(self) -> dict[str, object]:
        """The run record (record.py; docs/schema/run-record.json)."""
        return {
            "schema_version": record.SCHEMA_VERSION, "outcome": self.outcome.value, "blame": self.blame, "exit_code": self.exit_code,
            "command_exit_code": self.command_code, "run_id": self.run_id, "label": self.label,
            "class": self.cls, "host": self.host, "slot": self.slot, "ticket": self.ticket, "budget": self.budget,
            "message": self.message, "phases": dict(self.phases),
            "waited_s": self.waited_s, "ran_s": self.ran_s,
            "transfer_s": None if self.transfer_s is None else round(self.transfer_s, 3),
            "transport": self.transport, **self.details(),
        }

    def to_json(self, one_line: bool = False) -> str:
        import json

        return json.dumps(self.to_dict(), indent=None if one_line else 2, separators=(",", ":") if one_line else None)


def summary_line(result: RunResult) -> str:
    waited = result.waited_s
    ran = result.ran_s
    bits = [f"slotq: {result.outcome.value}"]
    if result.outcome in (Outcome.PASSED, Outcome.FAILED) and result.command_code is not None:
        bits[0] += f" (exit {result.command_code})"
    bits.append(f"waited {format_duration(waited) if waited is not None else '-'}")
    bits.append(f"ran {format_duration(ran) if ran is not None else '-'}")
    line = ", ".join(bits)
    if result.outcome not in (Outcome.PASSED,) and result.message:
        from ..records import printable

        line += f" — {printable(result.message, 4000)}"
    return line


def detached_message(ev: dict[str, object], attach_options: list[str] | None = None) -> str:
    """Where the kept run is, and how to come back to it (`slotq attach
    RUN_ID`, with the transport's `attach_options`: a remote host's)."""
    run_id, phase = ev.get("run_id"), ev.get("phase")
    if phase == "running":
        where = f"running for {format_duration(seconds_in(ev.get('ran_s')))}"
    elif phase == "starting":
        where = "its slot acquired, starting"
    else:
        pos = ev.get("position")
        where = f"waiting at position {pos}" if isinstance(pos, int) else "waiting for a slot"
    lease = format_duration(seconds_in(ev.get("lease_s")))
    more = ""
    if attach_options:
        import shlex

        more = " " + shlex.join(attach_options)
    return (f"run {run_id} goes on, {where}: come back with `slotq attach {run_id}{more}` within {lease} "
            f"(its lease), or give it up with `slotq cancel {run_id}{more}`")


def kept_wait(result: RunResult, now: float) -> float | None:
    """A kept run's time in line, from the host's phases (this caller may
    have come later than the slot)."""
    start = result.phases["submitted"]
    end = result.phases["slot"] or result.phases["ended"] or now
    return None if start is None else max(0.0, end - start)


def adopt_request(result: RunResult, ev: dict[str, object]) -> None:
    """An attacher learns the kept run's request from its hello: the result
    record names the run as `slotq run` would have."""
    request = ev.get("request")
    if not isinstance(request, dict):
        return
    for key, attr in (("label", "label"), ("cls", "cls"), ("budget", "budget"), ("run_id", "run_id")):
        if isinstance(request.get(key), (str, int, float)) and not isinstance(request.get(key), bool):
            setattr(result, attr, request[key])
    submitted = request.get("submitted")
    if isinstance(submitted, (int, float)) and not isinstance(submitted, bool):
        result.phases["submitted"] = float(submitted)
