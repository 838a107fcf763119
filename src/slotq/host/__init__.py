"""The host side: the queue on one machine and a run on it.

    runner.py      one run's life on the host, from ticket to exit: its steps in
    inline.py        the wait in line, until a slot (or a standby keeper's start)
    holding.py       the slot: prepare step, command, budget
    hostrun.py       what the steps share, and the run's end (finish)
    callerlink.py  the runner's link to its caller (stream out, channel in, signals, cancel)
    hostqueue.py   one caller's wait in line (tickets, watches, the head's attempts)
    ticket.py      a ticket taken: the sequence, its name, admission; leaving the line
    line.py        the line as its ticket files show it: order, live or dead, a turn waited for
    claim.py       the claim window: passing over a head that leaves a free slot untaken
    admission.py   who may wait: the host's [admission] limits
    slot.py        slot lock files and holder records
    lineview.py    how the line looks to a waiting run's status reports
    proclocks.py   who holds which lock, from /proc/locks
    inotify.py     wake-ups (inotify); lockwait.py when none can be had
    libc.py        libc calls the standard library lacks (prctl, inotify), via _ctypes
    process.py     a keeper's plan, and its fork (spawn)
    keeper.py      the keeper: supervises the command, survives its caller
    child.py       the runner's view of a keeper
    away.py        a quiet run far back in a slow line waits as a shell (flock)
    orphans.py     a run's processes when its keeper is gone
    terminate.py   the stopping policy (TERM, grace, KILL)
    control.py     a run's control socket (`slotq cancel`)
    status.py      what `slotq status` shows

Every way to reach a host ends here: the local transport runs the runner in
a thread of the caller, ssh and Slurm run `slotq host run` on the machine.
"""
