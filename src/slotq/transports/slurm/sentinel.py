"""The caller's liveness on Slurm: a sentinel that cancels a job the
moment its caller is gone.

A SIGKILLed `srun` does not cancel a pending job (Slurm allocates it later
and kills it only ~11 s after), and a SIGKILLed process group takes srun's
own shepherd with it. So the client starts a tiny sentinel in a session of
its own, reading a pipe only the client holds: end-of-file without the word
`done` means the caller is gone -- by SIGKILL of its pid or of its whole
group -- and the sentinel runs `scancel` at once.

Then it says how the run ended, where nobody else will: a job its caller
left while it was pending never reaches a node, whose runner writes the
history line of a run that started. Only on that path does the sentinel
start a Python (`last_word`); while the caller lives it is one `sh`.
"""

from __future__ import annotations

import os
import subprocess
import sys

# The sentinel: one `read` on the pipe, then scancel unless told `done`;
# once more a second later, for a job whose submission was still on its way;
# then the last word, if it has one: `$1 -S -c $2 $3 $4` (python, code, the
# directory slotq is imported from, the record).
_SENTINEL = ('IFS= read -r word; [ "$word" = done ] && exit 0; py=$1 code=$2 dir=$3 rec=$4; shift 4; '
             'scancel --quiet "$@"; sleep 1; scancel --quiet "$@"; '
             '[ -n "$py" ] && exec "$py" -S -c "$code" "$dir" "$rec"; exit 0')
_LAST_WORD = ("import sys; sys.path.insert(0, sys.argv[1]); "
              "from slotq.transports.slurm.sentinel import last_word; last_word(sys.argv[2])")


class Sentinel:
    """Cancels a job (`scancel ARGS`: a job id, or `--name N --user U` for
    a job not yet submitted) the moment this process is gone, unless told
    `done()` first. The sentinel is `sh` in a session of its own (a kill of
    our process group spares it); the pipe's write end is ours alone
    (close-on-exec), so its end-of-file is our death.

    `gone`: what `last_word` needs to write the run's history line if the
    job never reached a node (run_id, label, cls, submitted, state_dir,
    name, user)."""

    def __init__(self, scancel_args: list[str], env: dict[str, str] | None = None,
                 gone: dict[str, object] | None = None) -> None:
        last: list[str] = ["", "", "", ""]
        if gone is not None:
            from ...records import to_json

            from ... import __file__ as package_init

            here = os.path.dirname(os.path.dirname(os.path.abspath(package_init)))  # where slotq is imported from
            last = [sys.executable, _LAST_WORD, here, to_json(gone)]
        r, self._w = os.pipe()  # both close-on-exec
        try:
            self.proc = subprocess.Popen(["sh", "-c", _SENTINEL, "slotq-sentinel", *last, *scancel_args], stdin=r,
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


def last_word(arg: str) -> None:
    """The sentinel's last word, its caller gone and its job cancelled: the
    run's history line (caller_gone, with its wait), unless the job reached
    a node, whose runner writes that. `arg`: the record Sentinel was given."""
    import time

    from ...errors import HostUnavailable
    from ...records import from_json, is_number
    from ...spec import is_run_id
    from .ctl import jobs_named

    ended = time.time()
    try:
        rec = from_json(arg[:65536], 2)
    except ValueError:
        return
    if not isinstance(rec, dict):
        return
    run_id, state_dir, name, user = (rec.get(k) for k in ("run_id", "state_dir", "name", "user"))
    submitted = rec.get("submitted")
    if not (isinstance(run_id, str) and is_run_id(run_id) and isinstance(state_dir, str) and state_dir.startswith("/")
            and isinstance(name, str) and isinstance(user, str) and is_number(submitted)):
        return
    try:
        jobs = jobs_named(name, user)
        unsure = ""
    except HostUnavailable as e:
        jobs, unsure = [], f" (whether it started, Slurm did not say: {e})"
    if any(nodes for _, nodes in jobs):
        return  # it ran: its node's runner said how it ended
    message = (f"caller gone while pending in Slurm's line; its sentinel cancelled Slurm job {jobs[0][0]}" if jobs
               else "caller gone before Slurm had the job" + unsure)
    from ...history import append, run_record
    from ...host.hostqueue import ensure_state_dir

    try:
        ensure_state_dir(state_dir)
        budget, kept = (v if is_number(v) else None for v in (rec.get("budget"), rec.get("kept")))
        append(state_dir, run_record(
            run_id=run_id, label=str(rec.get("label")), cls=str(rec.get("cls")), host="slurm", pool=str(rec.get("cls")),
            slot=None, ticket=None, budget=budget, kept=kept, outcome="caller_gone", exit_code=None, message=message,
            phases={"submitted": float(submitted), "ended": ended}))  # type: ignore[arg-type]
    except Exception:  # nobody is left to tell
        pass
