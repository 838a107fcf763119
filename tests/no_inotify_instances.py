"""`python no_inotify_instances.py run ...`: the slotq CLI as if the per-user
cap on inotify instances were reached (every inotify_init1 fails EMFILE),
so waiting runs use the blocked-flock threads of lockwait.py."""

import errno
import os
import sys

from slotq.host import inotify
from slotq.cli import main


def refuse(*args: object) -> None:
    log = os.environ.get("SLOTQ_TEST_INOTIFY_LOG")
    if log:  # the test learns that an instance was asked for
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
    raise OSError(errno.EMFILE, "Too many open files")


inotify.Watcher.__init__ = refuse  # type: ignore[method-assign,assignment]
sys.exit(main(sys.argv[1:]))
