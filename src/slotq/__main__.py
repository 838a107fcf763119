"""`python -m slotq`: the same as the `slotq` command (bin/slotq)."""

import os
import sys

try:
    from slotq.cli import main

    code = main()
except KeyboardInterrupt:  # Ctrl-C while slotq starts (bin/slotq)
    code = 130
# Like bin/slotq: skip interpreter teardown. A run's host runner is a daemon
# thread of this process (the local transport); finalizing the interpreter
# under it can crash (seen: SIGSEGV in Debian's python3.11 when the result
# came while the thread was still writing its history line).
try:
    sys.stdout.flush()
    sys.stderr.flush()
except OSError:
    pass
os._exit(code)
