"""`slotq.run`: a run from Python, as `slotq run` makes it from the shell.

    import slotq

    result = slotq.run(["pytest", "-q"], budget="10m")            # this machine
    result = slotq.run(["make", "test"], host="ci1", label="pr-7")  # over OpenSSH
    result = slotq.run(["pytest"], slurm=True, cls="gpu")          # a Slurm cluster
    if result.outcome == "failed": ...                             # result.to_dict(): the run record

For a run that must outlive the call (an agent's tool call), `slotq.submit`
and `slotq.KeptRun` (client/kept.py); for a whole job whose budget the
recorded waits extend, `slotq.run_task` and `slotq.Deadline`."""

from __future__ import annotations

from ..spec import RunSpec
from .result import RunResult

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ..transports.base import Transport


def run(command: list[str] | RunSpec, *, host: str | None = None, slurm: bool = False,
        transport: Transport | None = None, output: tuple[int, int] = (1, 2),
        status: Callable[[str], None] | None = None, **spec: object) -> RunResult:
    """Run `command` (a list of words, or a RunSpec) when a slot is free and
    return its result: on this machine, on `host` over OpenSSH, or through
    Slurm (`slurm=True`), or through a `transport` of your own.

    `spec`: the run's fields as RunSpec takes them -- `budget` (seconds, or
    text as "10m"), `cls` ("shared", "landing"), `label`, `cwd`, `prepare`,
    `max_wait`, `run_id`, ... `output`: where the command's stdout and
    stderr go (descriptors; -1 drops them); `status`: a function for the
    status lines (None: silent). The wait in line is recorded in the wait
    ledger, as for `slotq run`.

    Raises UsageError for a bad request (an unknown class, a budget of
    "abc"); every other ending is a RunResult (`.outcome`, `.exit_code`,
    `.to_dict()`)."""
    from .caller import CallOptions, call

    the_spec = command if isinstance(command, RunSpec) else RunSpec(list(command), **_fields(spec))
    if transport is None:
        transport = _transport(host, slurm)
    return call(the_spec, transport, CallOptions(stdout_fd=output[0], stderr_fd=output[1], status=status))


def _fields(spec: dict[str, object]) -> dict[str, Any]:
    """RunSpec's keyword arguments, durations given as text read."""
    from ..durations import parse_duration

    out: dict[str, Any] = dict(spec)
    for key in ("budget", "prepare_timeout", "max_wait", "kill_grace", "report_every"):
        if isinstance(out.get(key), str):
            out[key] = parse_duration(str(out[key]), what=key)
    return out


def _transport(host: str | None, slurm: bool) -> Transport:
    from ..errors import UsageError

    if host and slurm:
        raise UsageError("host= and slurm=True: give one of them")
    if slurm:
        from ..config import HostConfig
        from ..transports.slurm import SlurmTransport

        return SlurmTransport(HostConfig.load())
    if host:
        from ..transports.ssh import SshTransport

        return SshTransport(host)
    from ..transports.local import LocalTransport

    return LocalTransport()
