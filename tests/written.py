"""A state dir's history as written, for the tests and for the tools
beside them that run without pytest (tests/chaos.py, the benchmarks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def history_written(state_dir: Path | str) -> list[dict[str, Any]]:
    """Every line of a state dir's history files as written (JSON), the
    files read oldest written first."""
    from slotq import history

    out = []
    for f in sorted(history.history_files(str(state_dir)), key=lambda f: f.mtime):
        with open(f.path, "rb") as fh:
            out += [json.loads(line) for line in fh.read().splitlines() if line.strip()]
    return out
