"""The command of one chaos run (test_chaos.py, benchmarks/chaos.py).

    python chaos_cmd.py LOG POOL SLOTS ID quick|hung [SECONDS]

At its start it appends `S <pool> <id> <pgid> <monotonic ns>` to LOG and
counts the live process groups of the commands of its pool that started
before it: more than SLOTS - 1 of them means two commands share a slot
(`OVERLAP ...`). A quick command then works for SECONDS and appends
`E <pool> <id>`; a hung one ignores SIGTERM and sleeps (with a child) until
it is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pgroup import members  # noqa: E402


def main() -> None:
    log, pool, slots, ident, mode = sys.argv[1:6]
    seconds = float(sys.argv[6]) if len(sys.argv) > 6 else 0.1
    if mode == "hung":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pgid = os.getpgid(0)
    with open(log, "a") as f:
        f.write(f"S {pool} {ident} {pgid} {time.monotonic_ns()}\n")
    with open(log) as f:
        others = {int(p[3]) for p in (line.split() for line in f) if p[0] == "S" and p[1] == pool
                  and int(p[3]) != pgid}
    busy = [g for g in others if members(g)]
    if len(busy) > int(slots) - 1:
        with open(log, "a") as f:
            f.write(f"OVERLAP {pool} {ident} with groups {busy}\n")
    if mode == "hung":
        subprocess.Popen(["sleep", "300"])
        time.sleep(300)  # sleep-ok: the hung command under test; it is killed
    time.sleep(seconds)  # sleep-ok: the command's own work
    with open(log, "a") as f:
        f.write(f"E {pool} {ident}\n")


if __name__ == "__main__":
    main()
