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
