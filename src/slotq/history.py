"""The host's run history: one JSON line per finished run, kept for months.

Writers never pay for a database. A run appends its line to the spool,
`history.jsonl` (one small O_APPEND write under a shared flock, so lines
never interleave). When the spool passes `SPOOL_BYTES`, the writer that
noticed moves it, under an exclusive flock, to the month's archive segment
`history/YYYY-MM.jsonl` (append, fsync) and empties it. Segments only grow;
a segment whose month lies wholly before the retention window is deleted.
Nothing is lost: a line is in the spool or in a segment.

Readers:
- `recent(state_dir, n)`: the last `n` runs, read backwards from the spool
  and then the newest segments (no index; `slotq status`).
- `historydb.Index` (`slotq history`, `slotq report`): a per-user SQLite
  index of the spool and segments, caught up incrementally, queried by
  window.

One vocabulary everywhere (`run --json`, `status --json`, history):
`class`, and `phases.submitted` for the time the host took the request.
Older lines (`cls`, `phases.queued`) are read as that.
"""

from __future__ import annotations

import os

from .records import from_json, is_number, to_json, valid_text

SPOOL_BYTES = 1 << 20  # the spool moves to its segment past this
MAX_LINE = 64 * 1024  # longer lines are skipped as corrupt
TAIL_WINDOW = 1 << 20  # `recent` reads at most this much of each file's end
RECENT_BUDGET = 4 << 20  # and this much in all
LOCK_WAIT = 2.0  # seconds a history lock is waited for (anyone may hold one by hand)
# A spool past this was grown by hand (ours moves at SPOOL_BYTES): it is not
# read into memory to be moved, only appended to and read from its end.
SPOOL_LIMIT = 64 << 20
PHASES = ("submitted", "slot", "prepared", "started", "ended")


def history_path(state_dir: str) -> str:
    """The spool."""
    return os.path.join(state_dir, "history.jsonl")


def segments_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "history")


def append(state_dir: str, record: dict[str, object]) -> None:
    """Add a finished run's record; failures are ignored (a run's result
    never depends on its history line)."""
    import fcntl

    from .statefile import StateFileError, open_state, share_created

    path = history_path(state_dir)
    line = to_json(record).encode() + b"\n"
    try:
        # Never through a link (someone's file), never blocked by a FIFO.
        fd, created = open_state(path, os.O_WRONLY | os.O_APPEND, create=True)
        if created:
            share_created(fd, state_dir)
        try:
            if not lock_within(fd, fcntl.LOCK_SH, LOCK_WAIT):  # a move to the segment waits for us (and we for it)
                return  # held by hand: the line is lost, the run is not held up
            os.write(fd, line)
            full = os.fstat(fd).st_size > SPOOL_BYTES
            fcntl.flock(fd, fcntl.LOCK_UN)
            if full:
                archive(state_dir)
        finally:
            os.close(fd)
    except (OSError, StateFileError):
        pass


def archive(state_dir: str, now: float | None = None) -> bool:
    """Move the spool's lines to this month's segment and empty the spool,
    under an exclusive flock (skipped if another process holds it: it is
    doing the same). True if lines were moved."""
    import fcntl
    import time

    from .statefile import StateFileError, make_dirs, open_state, share_created

    now = time.time() if now is None else now
    try:
        spool_fd, _ = open_state(history_path(state_dir), os.O_RDWR)
    except (OSError, StateFileError):
        return False
    try:
        try:
            fcntl.flock(spool_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        size = os.fstat(spool_fd).st_size
        if size == 0 or size > SPOOL_LIMIT:
            return False
        data = os.pread(spool_fd, size, 0)
        data = data[:data.rfind(b"\n") + 1]  # whole lines only
        if not data:
            return False
        seg_dir = segments_dir(state_dir)
        make_dirs(seg_dir, state_dir)
        seg = os.path.join(seg_dir, time.strftime("%Y-%m", time.gmtime(now)) + ".jsonl")
        fd, created = open_state(seg, os.O_WRONLY | os.O_APPEND, create=True)
        try:
            if created:
                share_created(fd, state_dir)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        rest = os.pread(spool_fd, 1 << 30, len(data))  # (nothing: writers wait for our lock)
        os.ftruncate(spool_fd, 0)
        if rest:
            os.pwrite(spool_fd, rest, 0)
        return True
    except (OSError, StateFileError):
        return False
    finally:
        os.close(spool_fd)


def segment_files(state_dir: str) -> list[str]:
    """The archive segments, oldest first (names YYYY-MM.jsonl)."""
    try:
        names = os.listdir(segments_dir(state_dir))
    except OSError:
        return []
    return [os.path.join(segments_dir(state_dir), n) for n in sorted(names)
            if len(n) == 13 and n.endswith(".jsonl") and n[:4].isdigit() and n[5:7].isdigit() and n[4] == "-"]


def prune(state_dir: str, retention_s: float, now: float) -> list[str]:
    """Delete segments whose month ended before the retention window (where
    we may: in a shared dir, only their owner can). The ones deleted."""
    import calendar

    cutoff = now - retention_s
    gone = []
    for path in segment_files(state_dir):
        name = os.path.basename(path)
        year, month = int(name[:4]), int(name[5:7])
        month_end = calendar.timegm((year + month // 12, month % 12 + 1, 1, 0, 0, 0))
        if month_end < cutoff:
            try:
                os.unlink(path)
                gone.append(path)
            except OSError:
                pass
    return gone


def recent(state_dir: str, n: int = 10) -> list[dict[str, object]]:
    """The last `n` records, oldest first: the spool, then the newest
    segments, read backwards."""
    from .statefile import StateFileError, open_state

    if n <= 0:
        return []
    lines: list[bytes] = []
    files = [history_path(state_dir), *reversed(segment_files(state_dir)), history_path(state_dir) + ".1"]
    budget = RECENT_BUDGET  # bytes, over every file: a hundred planted segments cost no more than one
    for path in files:
        if len(lines) >= n or budget <= 0:
            break
        try:
            fd, _ = open_state(path, os.O_RDONLY)
        except (OSError, StateFileError):
            continue
        try:
            budget -= min(os.fstat(fd).st_size, TAIL_WINDOW)
            lines = _tail_lines(fd, n - len(lines)) + lines
        except OSError:
            pass
        finally:
            os.close(fd)
    out = []
    for line in lines[-n:]:
        rec = parse_line(line)
        if rec is not None:
            out.append(rec)
    return out


def once_each(records: list[dict[str, object]]) -> list[dict[str, object]]:
    """Each run once, as its later line says (a Slurm relay's word after its
    node's): what `slotq history` shows. Lines without a run id are kept."""
    later = {r.get("run_id"): i for i, r in enumerate(records) if r.get("run_id") is not None}
    return [r for i, r in enumerate(records) if r.get("run_id") is None or later[r.get("run_id")] == i]


def lock_within(fd: int, how: int, seconds: float) -> bool:
    """flock(fd, how), waiting at most `seconds`: a history file is shared
    state, and a lock held on it by hand must not stop a run (or status)."""
    import fcntl
    import time

    end = time.monotonic() + seconds
    delay = 0.001
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= end:
                return False
        time.sleep(delay)  # product code: a bounded back-off for a lock held a moment (a move to the segment)
        delay = min(delay * 2, 0.05)


def _tail_lines(fd: int, n: int, chunk: int = 64 * 1024, window: int = TAIL_WINDOW) -> list[bytes]:
    """The last `n` lines of a file, reading backwards at most `window`
    bytes from its end: linear in what it reads, whatever the file's size
    (a file someone grew to a gigabyte costs one window, not a hang)."""
    end = os.fstat(fd).st_size
    stop = max(0, end - window)
    chunks: list[bytes] = []
    newlines = 0
    while end > stop and newlines <= n:
        start = max(stop, end - chunk)
        data = os.pread(fd, end - start, start)
        if not data:
            break
        chunks.append(data)
        newlines += data.count(b"\n")
        end = start
    lines = b"".join(reversed(chunks)).split(b"\n")
    if end > 0:
        lines = lines[1:]  # the first is cut
    return [ln for ln in lines if ln][-n:]


def parse_line(line: bytes) -> dict[str, object] | None:
    """One history line, cleaned; None if it is too long or not a JSON
    object (a corrupt or hand-written line)."""
    if len(line) > MAX_LINE:
        return None
    try:
        rec = from_json(line.decode("utf-8", "replace"))
    except ValueError:
        return None
    return clean_record(rec) if isinstance(rec, dict) else None


_TEXT = ("run_id", "label", "class", "pool", "slot", "host", "outcome", "message", "user")
_NUMBERS = ("waited_s", "ran_s")


def clean_record(rec: dict[str, object]) -> dict[str, object]:
    """A history record with the types readers rely on: text fields are
    str or None, durations numbers or None, exit_code int or None, phases a
    dict of numbers or None, and `blame` from the outcome. Anything else
    (a corrupt or hand-written line) becomes None, never a crash. Older
    lines' names (`cls`, `phases.queued`) are read as today's."""
    from .outcome import Outcome

    out = dict(rec)
    uid = out.get("uid")
    if not isinstance(out.get("user"), str) and isinstance(uid, int) and not isinstance(uid, bool) and uid >= 0:
        out["user"] = _user_name(uid)
    if "class" not in out and "cls" in out:
        out["class"] = out.pop("cls")
    for k in _TEXT:
        v = out.get(k)
        out[k] = valid_text(v) if isinstance(v, str) else None  # a non-UTF-8 label must not stop the index
    for k in _NUMBERS:
        v = out.get(k)
        out[k] = v if is_number(v) else None
    code = out.get("exit_code")
    # An exit status or a negative signal number: 32 bits at most (a longer
    # one would not fit the index's SQLite INTEGER).
    out["exit_code"] = code if isinstance(code, int) and not isinstance(code, bool) and -(1 << 31) <= code < 1 << 31 \
        else None
    raw = out.get("phases")
    if isinstance(raw, dict):
        if "submitted" not in raw and "queued" in raw:
            raw = dict(raw, submitted=raw["queued"])
        out["phases"] = {k: (raw.get(k) if is_number(raw.get(k)) else None) for k in PHASES}
    else:
        out["phases"] = None
    try:
        out["blame"] = Outcome(str(out["outcome"])).blame if out["outcome"] else None
    except ValueError:
        out["blame"] = None
    return out


_names: dict[int, str] = {}


def _user_name(uid: int) -> str:
    if uid not in _names:
        from .host.orphans import user_name

        _names[uid] = user_name(uid)
    return _names[uid]


def run_record(*, run_id: object, label: object, cls: object, host: object, outcome: str,
               exit_code: int | None, message: str, phases: dict[str, float | None], pool: object = None,
               slot: object = None, uid: int | None = None) -> dict[str, object]:
    """A history line, in the one vocabulary; `waited_s` from the phases
    (submitted -> slot, or -> the end for a run that never got one: a wait
    cancelled in line keeps its wait), `ran_s` started -> ended."""
    uid = os.getuid() if uid is None else uid  # the name is looked up by readers (clean_record): not a run's cost
    sub, got, started, ended = (phases.get(k) for k in ("submitted", "slot", "started", "ended"))
    until = got if got is not None else ended
    return {
        "run_id": run_id, "uid": uid, "label": label, "class": cls, "pool": pool,
        "slot": slot, "host": host, "outcome": outcome, "exit_code": exit_code, "message": message,
        "phases": {k: phases.get(k) for k in PHASES},
        "waited_s": round(max(0.0, until - sub), 3) if sub is not None and until is not None else None,
        "ran_s": round(max(0.0, ended - started), 3) if started is not None and ended is not None else None,
    }
