"""The caller's side of a run.

    caller.py    `run()`: one run's phases -- transfer, start, the stream,
                 verdict -- and its stop signals
    events.py    what each event of the host's stream means: its order,
                 the result, the watchdogs, the status lines
    result.py    how it ended: `RunResult`, the summary line
    watchdogs.py the client's clocks: the backstop, the no-output watchdog
    ledger.py    the wait ledger: every wait recorded, credited once
    deadline.py  `Deadline`: a budget that grows by the waits credited to it
    task.py      `slotq task`: a job under a `Deadline`
    choose.py    several hosts: the one with the shortest expected wait

The ways to reach a host are in `slotq.transports` (local, ssh, slurm);
what runs there is in `slotq.host`.
"""
