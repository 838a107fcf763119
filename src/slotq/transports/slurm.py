"""Slurm: the pieces of the cluster backend (issue 13), built and tested one
by one. Not yet a `Transport`: `slotq run --slurm` does not exist yet.

What is here:

- `submit()`: `sbatch --parsable`, the job id, or a one-line error.
- `Sentinel`: the caller's liveness, for a job the caller does not hold
  open. A SIGKILLed `srun` does not cancel a pending job (Slurm allocates it
  later and kills it only ~11 s after), and a SIGKILLed process group takes
  srun's own shepherd with it. So the client starts a tiny sentinel in a
  session of its own, reading a pipe only the client holds: end-of-file
  without the word `done` means the caller is gone -- by SIGKILL of its pid
  or of its whole group -- and the sentinel runs `scancel` at once.
"""

from __future__ import annotations

import os
import subprocess

from ..errors import HostUnavailable

# The sentinel: one `read` on the pipe, then scancel unless told `done`.
_SENTINEL = 'IFS= read -r word; [ "$word" = done ] || exec scancel --quiet "$1"'


def submit(args: list[str], script: str, env: dict[str, str] | None = None) -> str:
    """Submit a batch job (`sbatch --parsable ARGS --wrap SCRIPT`); its id.
    Raises HostUnavailable with sbatch's own words when it refuses."""
    try:
        proc = subprocess.run(["sbatch", "--parsable", *args, "--wrap", script], capture_output=True, text=True,
                              timeout=60, env=env, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise HostUnavailable("sbatch is not installed here (Slurm's client tools)", host="slurm") from None
    except subprocess.TimeoutExpired:
        raise HostUnavailable("sbatch did not answer within 60 s (slurmctld down?)", host="slurm") from None
    job = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not job.isdigit():
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise HostUnavailable(f"Slurm refused the job: {why}", host="slurm")
    return job


class Sentinel:
    """Cancels job `job_id` the moment this process is gone, unless told
    `done()` first. The sentinel is `sh` in a session of its own (a kill of
    our process group spares it); the pipe's write end is ours alone
    (close-on-exec), so its end-of-file is our death."""

    def __init__(self, job_id: str, env: dict[str, str] | None = None) -> None:
        r, self._w = os.pipe()  # both close-on-exec
        try:
            self.proc = subprocess.Popen(["sh", "-c", _SENTINEL, "slotq-sentinel", job_id], stdin=r,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        finally:
            os.close(r)
        self.job_id = job_id

    def done(self) -> None:
        """The run ended and the job with it: the sentinel leaves it be."""
        if self._w >= 0:
            try:
                os.write(self._w, b"done\n")
            except OSError:
                pass
            os.close(self._w)
            self._w = -1
            self.proc.wait()

    def cancel_now(self) -> None:
        """End the job now (Ctrl-C, a cancel): close without `done`."""
        if self._w >= 0:
            os.close(self._w)
            self._w = -1
            self.proc.wait()


MAX_LINES = 10_000  # squeue output read at most this far (a huge queue is cut, never unbounded)


def _squeue(args: list[str], env: dict[str, str] | None) -> list[list[str]]:
    """Rows of `squeue -h ARGS`, fields split on '|' (the last field, a job
    name, may itself contain '|': it gets the rest of the line)."""
    try:
        proc = subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, timeout=30, env=env,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HostUnavailable(f"squeue failed: {e}", host="slurm") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise HostUnavailable(f"squeue failed: {why}", host="slurm")
    fmt = next(a for a in args if a.startswith("--format=") or a.startswith("-o"))
    n = fmt.count("|") + 1
    return [line.split("|", n - 1) for line in proc.stdout.splitlines()[:MAX_LINES] if line.count("|") >= n - 1]


def pending_view(job_id: str, partition: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """What a waiting caller is told about its pending job: its position
    among the partition's pending jobs in Slurm's priority order, Slurm's
    pending reason, the running jobs that hold the partition's resources
    (user, name, how long), and Slurm's expected start time if it has one."""
    pending = _squeue(["-p", partition, "-t", "PD", "--sort=-p,i", "--format=%i|%r|%S|%u|%j"], env)
    running = _squeue(["-p", partition, "-t", "R", "--format=%i|%u|%M|%j"], env)
    ids = [row[0] for row in pending]
    mine = pending[ids.index(job_id)] if job_id in ids else None
    start = mine[2] if mine else ""
    return {
        "job_id": job_id, "partition": partition, "state": "PENDING" if mine else "not pending",
        "position": ids.index(job_id) + 1 if mine else None, "pending": len(ids),
        "reason": mine[1] if mine else None,
        "expected_start": start if start and start not in ("N/A", "Unknown") else None,
        "holders": [{"job_id": r[0], "user": r[1], "elapsed": r[2], "name": r[3]} for r in running],
    }
