"""A caller that submits a Slurm job and guards it with a Sentinel, then
waits (for the test to kill it, or to say `done` on stdin).

    python slurm_caller.py PARTITION   ->  prints the job id
"""

import sys

from slotq.transports.slurm.sentinel import Sentinel
from slotq.transports.slurm.ctl import submit

job = submit(["-p", sys.argv[1], "-c2", "-o", "/dev/null", "-J", "slotq-sentinel-test"], "sleep 2")
sentinel = Sentinel([job])
print(job, flush=True)
if sys.stdin.readline().strip() == "done":
    sentinel.done()
