"""Recent runs on a host: one JSON line per finished run, `history.jsonl`.

Appends are single small writes with O_APPEND, so concurrent runners do not
interleave. When the file passes `MAX_BYTES` it is renamed to `.1` (one
generation kept); a runner that still holds the old file finishes its line
there, harmlessly.
"""

from __future__ import annotations

import os

from .records import from_json, to_json

MAX_BYTES = 1 << 20
MAX_LINE = 64 * 1024  # longer lines are skipped as corrupt


def history_path(state_dir: str) -> str:
    return os.path.join(state_dir, "history.jsonl")


def append(state_dir: str, record: dict[str, object]) -> None:
    """Add a record; failures are ignored (history is for display only)."""
    from .statefile import StateFileError, open_state, share_created

    path = history_path(state_dir)
    line = to_json(record).encode() + b"\n"
    try:
        # Never through a link (someone's file), never blocked by a FIFO.
        fd, created = open_state(path, os.O_WRONLY | os.O_APPEND, create=True)
        if created:
            share_created(fd, state_dir)
        try:
            os.write(fd, line)
            if os.fstat(fd).st_size > MAX_BYTES:
                os.replace(path, path + ".1")
        finally:
            os.close(fd)
    except (OSError, StateFileError):
        pass


def recent(state_dir: str, n: int = 10) -> list[dict[str, object]]:
    """The last `n` records, oldest first."""
    from .statefile import StateFileError, open_state

    path = history_path(state_dir)
    try:
        fd, _ = open_state(path, os.O_RDONLY)
    except (OSError, StateFileError):
        return []
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, 64 * 1024, max(0, size - 64 * 1024))
    except OSError:
        return []
    finally:
        os.close(fd)
    out = []
    for line in data.splitlines()[-n:]:
        if len(line) > MAX_LINE:
            continue
        try:
            rec = from_json(line.decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(clean_record(rec))
    return out


_TEXT = ("run_id", "label", "cls", "host", "outcome", "message", "user")
_NUMBERS = ("waited_s", "ran_s")


def clean_record(rec: dict[str, object]) -> dict[str, object]:
    """A history record with the types readers rely on: text fields are
    str or None, durations numbers or None, exit_code int or None, phases a
    dict of numbers or None. Anything else (a corrupt or hand-written
    line) becomes None, never a crash in `slotq status`."""
    out = dict(rec)
    for k in _TEXT:
        v = out.get(k)
        out[k] = v if isinstance(v, str) else None
    for k in _NUMBERS:
        v = out.get(k)
        out[k] = v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    code = out.get("exit_code")
    out["exit_code"] = code if isinstance(code, int) and not isinstance(code, bool) else None
    phases = out.get("phases")
    out["phases"] = ({k: (v if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
                      for k, v in phases.items()} if isinstance(phases, dict) else None)
    return out
