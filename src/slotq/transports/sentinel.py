"""The caller's liveness on Slurm: a sentinel that cancels a job the
moment its caller is gone.

A SIGKILLed `srun` does not cancel a pending job (Slurm allocates it later
and kills it only ~11 s after), and a SIGKILLed process group takes srun's
own shepherd with it. So the client starts a tiny sentinel in a session of
its own, reading a pipe only the client holds: end-of-file without the word
`done` means the caller is gone -- by SIGKILL of its pid or of its whole
group -- and the sentinel runs `scancel` at once.
"""

from __future__ import annotations

import os
import subprocess

# The sentinel: one `read` on the pipe, then scancel unless told `done`;
# once more a second later, for a job whose submission was still on its way.
_SENTINEL = ('IFS= read -r word; [ "$word" = done ] && exit 0; scancel --quiet "$@"; sleep 1; '
             'exec scancel --quiet "$@"')


class Sentinel:
    """Cancels a job (`scancel ARGS`: a job id, or `--name N --user U` for
    a job not yet submitted) the moment this process is gone, unless told
    `done()` first. The sentinel is `sh` in a session of its own (a kill of
    our process group spares it); the pipe's write end is ours alone
    (close-on-exec), so its end-of-file is our death."""

    def __init__(self, scancel_args: list[str], env: dict[str, str] | None = None) -> None:
        r, self._w = os.pipe()  # both close-on-exec
        try:
            self.proc = subprocess.Popen(["sh", "-c", _SENTINEL, "slotq-sentinel", *scancel_args], stdin=r,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        finally:
            os.close(r)

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
