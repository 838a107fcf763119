import sys

from slotq.cli import main

sys.exit(main())
