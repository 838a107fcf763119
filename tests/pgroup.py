"""Which live (non-zombie) processes are in a process group.

Used by tests, also as a script: `python pgroup.py PGID` prints `overlap`
if any live process of that group exists, else `clean`. Zombies are ignored:
they run nothing and hold nothing (their descriptors, slot locks included,
are already closed)."""

from __future__ import annotations

import os
import sys


def members(pgid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            out.append(int(d))
    return out


if __name__ == "__main__":
    print("overlap" if members(int(sys.argv[1])) else "clean")
