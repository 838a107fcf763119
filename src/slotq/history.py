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


def history_path(state_dir: str) -> str:
    return os.path.join(state_dir, "history.jsonl")


def append(state_dir: str, record: dict[str, object]) -> None:
    """Add a record; failures are ignored (history is for display only)."""
    path = history_path(state_dir)
    line = to_json(record).encode() + b"\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            os.write(fd, line)
            if os.fstat(fd).st_size > MAX_BYTES:
                os.replace(path, path + ".1")
        finally:
            os.close(fd)
    except OSError:
        pass


def recent(state_dir: str, n: int = 10) -> list[dict[str, object]]:
    """The last `n` records, oldest first."""
    path = history_path(state_dir)
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines[-n:]:
        try:
            rec = from_json(line.decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out
