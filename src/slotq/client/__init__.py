"""The caller's side of a run.

    caller.py    `run()`: a transport, the stream, the watchdogs, status
                 lines, the result (`RunResult`)
    ledger.py    the wait ledger: every wait recorded, credited once
    deadline.py  `Deadline`: a budget that grows by the waits credited to it
    task.py      `slotq task`: a job under a `Deadline`
    choose.py    several hosts: the one with the shortest expected wait

The ways to reach a host are in `slotq.transports` (local, ssh, slurm);
what runs there is in `slotq.host`.
"""
