"""Kept runs from Python: `slotq.submit(...)` takes a place in line for a
run that outlives the call (docs/agents.md; the CLI's `run --detach`), and
returns a `KeptRun` to come back to it with -- from another process too,
by its run id. Async variants for harnesses written with asyncio run the
same calls in a worker thread.

    run = slotq.submit(slotq.RunSpec(["pytest", "-q"], budget=600))
    result = run.attach(timeout=100)      # outcome "detached": not yet
    if result.outcome == "detached":
        ...                               # later, maybe in another tool call:
    result = slotq.KeptRun(run_id).attach(timeout=100)
"""

from __future__ import annotations

import os
import time

from ..outcome import Outcome
from ..spec import RunSpec
from .result import RunResult

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class KeptRun:
    """A kept run of ours on this machine, by its run id."""

    def __init__(self, run_id: str) -> None:
        from ..spec import is_run_id

        if not is_run_id(run_id):
            raise ValueError(f"{run_id!r} is not a run id")
        self.run_id = run_id

    def attach(self, timeout: float | None = None, *, from_start: bool = False, stdout_fd: int = 1,
               stderr_fd: int = 2, status: Callable[[str], None] | None = None) -> RunResult:
        """Follow the run for at most `timeout` seconds (None: until it
        ends): its output to `stdout_fd`/`stderr_fd` (-1: dropped) from
        where the last attach left off, its status lines to `status`. The
        run's own result if it ended; else outcome `detached` (the run goes
        on, its lease renewed)."""
        from ..transports.kept import KeptTransport
        from .caller import run

        transport = KeptTransport.attach(self.run_id, attach_for=timeout, from_start=from_start)
        return run(RunSpec(["?"], run_id=self.run_id), transport, stdout_fd=stdout_fd, stderr_fd=stderr_fd,
                   status=status)

    def result(self, **kw: object) -> RunResult:
        """Wait for the run's end (however long it waits in line) and
        return its result: `attach()` without a timeout."""
        return self.attach(None, **kw)  # type: ignore[arg-type]

    def renew(self) -> None:
        """Start the run's lease again from now."""
        slotq_child("attach", self.run_id, "--renew")

    def cancel(self) -> bool:
        """Give the run up (as `slotq cancel RUN_ID`): True if it was
        cancelled, False if it had ended already or is not ours."""
        return cancel(self.run_id)[0]

    async def attach_async(self, timeout: float | None = None, **kw: object) -> RunResult:
        import asyncio

        return await asyncio.to_thread(lambda: self.attach(timeout, **kw))  # type: ignore[arg-type]

    async def result_async(self, **kw: object) -> RunResult:
        return await self.attach_async(None, **kw)

    async def cancel_async(self) -> bool:
        import asyncio

        return await asyncio.to_thread(self.cancel)

    def __repr__(self) -> str:
        return f"KeptRun({self.run_id!r})"


def slotq_child(*args: str) -> tuple[int, str, str]:
    """Another slotq command as a child: (exit code, stdout, stderr), its
    output captured (never on a server's own stdout)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "slotq", *args], stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=120)
    return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")


def cancel(run_id: str, *host_args: str) -> tuple[bool, str]:
    """`slotq cancel RUN_ID`: (cancelled, its last line). False for a run
    that had ended already (exit 0, nothing to do), or is not ours."""
    code, out, err = slotq_child("cancel", run_id, *host_args)
    lines = (err.strip() or out.strip()).splitlines()
    note = lines[-1] if lines else f"slotq cancel exited {code}"
    return code == 0 and f"cancelled run {run_id}" in note, note


def submit(what: RunSpec | list[str], *, idle: float | None = None, lease: float | None = None,
           log_max: int | None = None, credit_dir: str | None = None, slurm: bool = False) -> KeptRun:
    """Take a place in line on this machine for `what` (a RunSpec: its
    class, budget, label, work dir...; or just a command line) -- or, with
    `slurm`, in the Slurm cluster's (a job; its caller kept here) -- kept
    for `lease` seconds without an attacher (default 15 min), and return
    once the place is real. Raises UsageError if the host refuses the
    request (an unknown class), SlotqError if the run could not be kept."""
    from ..errors import SlotqError
    from ..transports.kept import KeptTransport
    from .caller import run

    from ..durations import check_seconds
    from ..errors import UsageError
    from ..host.kept import LEASE_MIN

    if lease is not None:
        try:
            lease = check_seconds(lease, "lease")
        except ValueError as e:
            raise UsageError(str(e)) from None
        if lease < LEASE_MIN:
            raise UsageError(f"lease must be at least {LEASE_MIN:.0f} second (a lease that lapses as the call "
                             f"leaves ends the run with it), got {lease!r}")
    spec = what if isinstance(what, RunSpec) else RunSpec(what)
    spec.cwd = spec.cwd or os.getcwd()
    spec.submitted = time.time()
    transport = KeptTransport.keep(lease=lease, log_max=log_max, idle=idle,
                                   credit_dir=os.path.realpath(credit_dir or spec.cwd), attach_for=None,
                                   detach=True, slurm_options=[] if slurm else None)
    result = run(spec, transport, stdout_fd=-1, stderr_fd=-1)
    if result.outcome is not Outcome.DETACHED and result.phases["slot"] is None:
        raise SlotqError(f"the run could not be kept: {result.message or result.outcome.value}")
    return KeptRun(spec.run_id)


async def submit_async(what: RunSpec | list[str], **kw: object) -> KeptRun:
    import asyncio

    return await asyncio.to_thread(lambda: submit(what, **kw))  # type: ignore[arg-type]
