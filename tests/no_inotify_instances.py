"""`python no_inotify_instances.py run ...`: the slotq CLI as if the per-user
cap on inotify instances were reached (every inotify_init1 fails EMFILE),
so waiting runs use the blocked-flock threads of lockwait.py."""

import errno
import sys

from slotq import inotify
from slotq.cli import main


def refuse(*args: object) -> None:
    raise OSError(errno.EMFILE, "Too many open files")


inotify.Watcher.__init__ = refuse  # type: ignore[method-assign]
sys.exit(main(sys.argv[1:]))
