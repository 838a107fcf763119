"""The wait ledger: every wait a caller spent before its work could run.

One SQLite database (WAL: many concurrent writers, readers never block) per
user on the caller's machine: `$SLOTQ_LEDGER`, else
`$XDG_STATE_HOME/slotq/ledger.sqlite`. A record per wait:

    id, run_id, pid, pid_start, workdir (realpath), host, kind (transfer|queue),
    start, end (NULL while open), heartbeat       -- wall-clock epoch seconds

`pid_start` identifies the process beyond its pid (boot id + start time in
clock ticks), so a dead waiter's open record is never revived by a new
process that happens to get the same pid: such a record ends at its last
heartbeat.

Runs do not write SQLite themselves: importing and opening it costs a run
~8 ms of CPU, and hundreds of runs writing at once contend for its lock.
A run appends its wait events as JSON lines to a spool beside the database
(`<ledger>.spool`, O_APPEND, a shared flock around each append); any reader
first moves the spool into SQLite under an exclusive flock, in one
transaction, then empties it. Nothing is lost: an event is either still in
the spool or already in the table (applying one twice changes nothing).
Nor does anything grow for ever: a run that finds the spool past
SPOOL_MOVE_BYTES (where no reader ever comes) moves it in itself while it
waits, and each move drops the waits that ended more than RETAIN_S ago.

`credit(workdir, since, until)` answers an outer task runner: the waits of
that directory (and below it) cut to the window, totalled two ways -- `sum`
(record by record) and `union` (overlaps merged: wall-clock time the
directory was blocked) -- with open waits of live processes listed apart.
"""

from __future__ import annotations

import os

from ..config import ledger_path
from ..records import from_json, is_pid, to_json, valid_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable

KINDS = ("transfer", "queue")
RETAIN_S = 90 * 86400  # waits that ended longer ago are dropped (credit looks back hours, `waits` days)
SPOOL_MOVE_BYTES = 1 << 20  # ~650 ten-minute waits (~0.3 s to move in): a run that finds this much moves it

_SCHEMA = """
CREATE TABLE IF NOT EXISTS waits (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id    TEXT NOT NULL,
    pid       INTEGER NOT NULL,
    pid_start TEXT,
    workdir   TEXT NOT NULL,
    host      TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('transfer', 'queue')),
    start     REAL NOT NULL,
    "end"     REAL,
    heartbeat REAL NOT NULL,
    key       TEXT UNIQUE,             -- set for records that came through the spool
    CHECK ("end" IS NULL OR "end" >= start)
);
CREATE INDEX IF NOT EXISTS waits_by_dir ON waits (workdir, start);
CREATE INDEX IF NOT EXISTS waits_by_heartbeat ON waits (heartbeat);  -- a closed wait's heartbeat is its end
"""


_boot_id: str | None = None


def process_start(pid: int) -> str | None:
    """An identity for process `pid` that a reused pid does not share:
    boot id + start time (clock ticks since boot). None if unknown/gone (a
    zombie waits for nothing). The boot id: records outlive a reboot."""
    global _boot_id
    from ..procinfo import start_ticks

    try:
        if _boot_id is None:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _boot_id = f.read().strip()
    except OSError:
        return None
    ticks = start_ticks(pid)
    return None if ticks is None else f"{_boot_id}:{ticks}"


def process_alive(pid: int, pid_start: str | None) -> bool:
    if not is_pid(pid):
        return False  # no process has it (and 0 or -1 would ask about many)
    if pid_start is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return process_start(pid) == pid_start


class WaitRecord:
    __slots__ = ("id", "run_id", "pid", "pid_start", "workdir", "host", "kind", "start", "end", "heartbeat")

    def __init__(self, id: int, run_id: str, pid: int, pid_start: str | None, workdir: str, host: str,
                 kind: str, start: float, end: float | None, heartbeat: float) -> None:
        self.id = id
        self.run_id = run_id
        self.pid = pid
        self.pid_start = pid_start
        self.workdir = workdir
        self.host = host
        self.kind = kind
        self.start = start
        self.end = end
        self.heartbeat = heartbeat

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__slots__}


class CreditedWait:
    """A wait as credit sees it: cut to the window; `closed_by` says how its
    end was known (`end`, or `heartbeat` for a dead process's open record)."""

    __slots__ = ("record", "start", "end", "closed_by")

    def __init__(self, record: WaitRecord, start: float, end: float, closed_by: str) -> None:
        self.record = record
        self.start = start
        self.end = end
        self.closed_by = closed_by

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict[str, object]:
        r = self.record
        return {"id": r.id, "run_id": r.run_id, "kind": r.kind, "host": r.host, "workdir": r.workdir,
                "pid": r.pid, "start": self.start, "end": self.end, "seconds": round(self.seconds, 3),
                "closed_by": self.closed_by}


class Credit:
    """The answer to `credit(...)`."""

    def __init__(self, workdir: str, since: float, until: float, waits: list[CreditedWait],
                 in_progress: list[CreditedWait]) -> None:
        self.workdir = workdir
        self.since = since
        self.until = until
        self.waits = waits
        self.in_progress = in_progress

    @property
    def sum(self) -> float:
        return sum(w.seconds for w in self.waits)

    @property
    def union(self) -> float:
        return union_seconds([(w.start, w.end) for w in self.waits])

    def to_dict(self) -> dict[str, object]:
        return {"workdir": self.workdir, "since": self.since, "until": self.until,
                "sum_s": round(self.sum, 3), "union_s": round(self.union, 3),
                "waits": [w.to_dict() for w in self.waits],
                "in_progress": [w.to_dict() for w in self.in_progress]}


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


class Ledger:
    """The wait ledger. Every method raises `sqlite3.Error` or `OSError` on
    failure; callers that must not fail (a run) catch them."""

    def __init__(self, path: str | None = None, *, busy_timeout: float = 10.0) -> None:
        import sqlite3

        from ..statefile import make_private_dirs

        self.path = path or ledger_path()
        make_private_dirs(os.path.dirname(self.path) or ".")
        # Autocommit (isolation_level=None): each statement is its own short
        # transaction, so concurrent writers hold the write lock for
        # microseconds; the busy timeout makes them queue instead of failing.
        self._db: sqlite3.Connection = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def ingest(self) -> int:
        """Move the events runs appended to the spool into the table;
        returns how many were applied."""
        import fcntl

        spool = spool_path(self.path)
        try:
            lock_fd = os.open(spool + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError:
            return 0  # no spool can exist where we cannot create its lock
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)  # no appends while we read and empty it
            try:
                with open(spool, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                return 0
            events: list[dict[str, object]] = []
            bad: list[bytes] = []
            for line in data.splitlines():
                if not line.strip():
                    continue
                try:
                    ev = from_json(line.decode("utf-8", "replace")) if len(line) <= MAX_SPOOL_LINE else None
                except ValueError:
                    ev = None
                if isinstance(ev, dict) and _valid_event(ev):
                    events.append(ev)
                else:
                    bad.append(line[:MAX_SPOOL_LINE])  # torn, corrupt or hostile: set aside, never a jam
            import sqlite3

            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                for ev in events:
                    try:
                        try:
                            self._apply(ev)
                        except UnicodeEncodeError:  # a path that is not UTF-8, from an older slotq's spool
                            self._apply({k: _text(v) for k, v in ev.items()})
                    except sqlite3.IntegrityError:
                        bad.append(to_json(ev).encode()[:MAX_SPOOL_LINE])
                self._drop_old()
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            if bad:
                _set_aside(spool, bad)
            os.truncate(spool, 0)
            return len(events)
        finally:
            os.close(lock_fd)

    def _drop_old(self) -> None:
        """Drop the waits that ended (or last beat) more than RETAIN_S
        before now -- or before the newest record, if that is older: a
        clock set back, or a test's clock, never empties the ledger."""
        import time

        newest = self._db.execute("SELECT max(heartbeat) FROM waits").fetchone()[0]
        if isinstance(newest, (int, float)):
            self._db.execute("DELETE FROM waits WHERE heartbeat < ?", (min(time.time(), newest) - RETAIN_S,))

    def set_aside(self) -> int:
        """How many spool lines were set aside as unreadable (in
        `<ledger>.spool.bad`, for a person to look at)."""
        try:
            with open(spool_path(self.path) + ".bad", "rb") as f:
                return f.read(64 * 1024 * 1024).count(b"\n")
        except OSError:
            return 0

    def _apply(self, ev: dict[str, object]) -> None:
        op, key = ev.get("op"), ev.get("key")
        if op == "open" and ev.get("kind") in KINDS:
            self._db.execute(
                'INSERT OR IGNORE INTO waits (run_id, pid, pid_start, workdir, host, kind, start, "end", '
                "heartbeat, key) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)",
                (ev.get("run_id"), ev.get("pid"), ev.get("pid_start"), ev.get("workdir"), ev.get("host"),
                 ev.get("kind"), ev.get("start"), ev.get("start"), key))
        elif op == "beat":
            self._db.execute('UPDATE waits SET heartbeat = max(heartbeat, ?) WHERE key = ? AND "end" IS NULL',
                             (ev.get("at"), key))
        elif op == "close":
            self._db.execute('UPDATE waits SET "end" = max(?, start), heartbeat = max(?, start) '
                             'WHERE key = ? AND "end" IS NULL', (ev.get("end"), ev.get("end"), key))

    def open_wait(self, *, run_id: str, workdir: str, host: str, kind: str, start: float,
                  pid: int | None = None, pid_start: str | None = None) -> int:
        """Start a wait record; returns its id."""
        if kind not in KINDS:
            raise ValueError(f"unknown wait kind {kind!r}")
        pid = os.getpid() if pid is None else pid
        if pid_start is None:
            pid_start = process_start(pid)
        cur = self._db.execute(
            'INSERT INTO waits (run_id, pid, pid_start, workdir, host, kind, start, "end", heartbeat) '
            "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?)",
            (run_id, pid, pid_start, dir_key(workdir), valid_text(host), kind, start, start))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def heartbeat(self, wait_id: int, at: float) -> None:
        self._db.execute('UPDATE waits SET heartbeat = ? WHERE id = ? AND "end" IS NULL', (at, wait_id))

    def close_wait(self, wait_id: int, end: float) -> None:
        self._db.execute('UPDATE waits SET "end" = max(?, start), heartbeat = max(?, start) '
                         'WHERE id = ? AND "end" IS NULL', (end, end, wait_id))

    def records(self, workdir: str, since: float = 0.0, until: float = float("inf")) -> list[WaitRecord]:
        """Records of `workdir` and the directories below it that may touch
        [since, until] (the spool moved in first)."""
        self.ingest()
        root = dir_key(workdir)
        prefix = root.rstrip("/") + "/"
        rows = self._db.execute(
            'SELECT id, run_id, pid, pid_start, workdir, host, kind, start, "end", heartbeat FROM waits '
            "WHERE (workdir = ? OR substr(workdir, 1, ?) = ?) AND start < ? "
            'AND ("end" IS NULL OR "end" > ?) ORDER BY start, id',
            (root, len(prefix), prefix, until if until != float("inf") else 1e300, since)).fetchall()
        return [WaitRecord(*row) for row in rows]

    def credit(self, workdir: str, since: float, until: float) -> Credit:
        """The waits of `workdir` cut to [since, until]; see the module doc."""
        waits: list[CreditedWait] = []
        in_progress: list[CreditedWait] = []
        for r in self.records(workdir, since, until):
            if r.end is not None:
                end, closed_by = r.end, "end"
            elif process_alive(r.pid, r.pid_start):
                s = max(r.start, since)
                in_progress.append(CreditedWait(r, s, max(s, until), "open"))
                continue
            else:
                end, closed_by = r.heartbeat, "heartbeat"  # the waiter died
            s, e = max(r.start, since), min(end, until)
            if e > s:
                waits.append(CreditedWait(r, s, e, closed_by))
        return Credit(dir_key(workdir), since, until, waits, in_progress)


def dir_key(workdir: str) -> str:
    """How the ledger names a work dir: its real path, as valid text (a
    path that is not UTF-8 shows its bytes as \\xNN: SQLite stores text
    only). Writers and readers name a dir the same way, and a dir below
    another keeps its parent's name as a prefix."""
    return valid_text(os.path.realpath(workdir))


def _text(value: object) -> object:
    return valid_text(value) if isinstance(value, str) else value


MAX_SPOOL_LINE = 64 * 1024
_EVENT_TYPES: dict[str, dict[str, tuple[type, ...]]] = {
    "open": {"key": (str,), "run_id": (str,), "pid": (int,), "workdir": (str,), "host": (str,),
             "kind": (str,), "start": (int, float)},
    "beat": {"key": (str,), "at": (int, float)},
    "close": {"key": (str,), "end": (int, float)},
}


def _valid_event(ev: dict[str, object]) -> bool:
    types = _EVENT_TYPES.get(str(ev.get("op")))
    if types is None:
        return False
    for k, t in types.items():
        v = ev.get(k)
        if not isinstance(v, t) or isinstance(v, bool):
            return False
        if isinstance(v, float) and not (v == v and abs(v) < 1e12):
            return False
    if ev.get("op") != "open":
        return True
    ps = ev.get("pid_start")
    return is_pid(ev.get("pid")) and (ps is None or isinstance(ps, str))


def _set_aside(spool: str, lines: list[bytes]) -> None:
    try:
        fd = os.open(spool + ".bad", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"".join(line.replace(b"\n", b" ") + b"\n" for line in lines))
        finally:
            os.close(fd)
    except OSError:
        pass  # could not keep them: they are dropped, never a jam


def spool_path(ledger_path: str) -> str:
    return ledger_path + ".spool"


class WaitRecorder:
    """A run's use of the ledger: one open wait at a time, appended to the
    spool (see the module doc), and never a failure -- a ledger that cannot
    be written costs one warning, and the run goes on (that wait may go
    uncredited)."""

    def __init__(self, *, run_id: str, workdir: str, host: str, warn: Callable[[str], None],
                 path: str | None = None) -> None:
        self.run_id = run_id
        self.workdir = workdir
        self.host = host
        self.warn = warn
        self.path = path or ledger_path()
        self._broken = False
        self._made_dir = False  # the spool's directory exists (made once, not every 30 s)
        self._spool_size = 0  # after our last append
        self._open: str | None = None  # key of the open wait

    def _append(self, what: str, event: dict[str, object]) -> bool:
        if self._broken:
            return False
        import fcntl

        spool = spool_path(self.path)
        try:
            if not self._made_dir:
                from ..statefile import make_private_dirs

                make_private_dirs(os.path.dirname(spool) or ".")
                self._made_dir = True
            lock_fd = os.open(spool + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_SH)  # appenders share; an ingest excludes us
                fd = os.open(spool, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
                try:
                    os.write(fd, to_json(event).encode() + b"\n")  # one write: lines never interleave
                    self._spool_size = os.fstat(fd).st_size
                finally:
                    os.close(fd)
            finally:
                os.close(lock_fd)
            return True
        except OSError as e:
            self._broken = True
            self.warn(f"slotq: warning: cannot {what} in the wait ledger ({self.path}): "
                      f"{e.strerror or e}; this wait may go uncredited")
            return False

    @property
    def opened(self) -> bool:
        return self._open is not None

    def open(self, kind: str, start: float) -> None:
        key = f"{self.run_id}:{kind}"
        pid = os.getpid()
        if self._append("record a wait", {
                "op": "open", "key": key, "run_id": self.run_id, "pid": pid, "pid_start": process_start(pid),
                "workdir": dir_key(self.workdir), "host": valid_text(self.host), "kind": kind, "start": start}):
            self._open = key
            if kind == "queue" and self._spool_size > SPOOL_MOVE_BYTES:
                self._move_in()  # in line (a transfer's time is the run's own)

    def adopt(self, kind: str) -> None:
        """The run's `kind` wait is open already: this process took the run
        over from itself (a run that waited away, transports/away.py)."""
        self._open = f"{self.run_id}:{kind}"

    def _move_in(self) -> None:
        """Move the spool into SQLite ourselves: no reader may ever come
        (a user who never runs `slotq task` or `slotq waits`). We are
        waiting in line, so it costs nobody's time; a failure here loses
        nothing (the events stay in the spool)."""
        try:
            ledger = Ledger(self.path)
            try:
                ledger.ingest()
            finally:
                ledger.close()
        except Exception:  # sqlite3.Error, OSError: the next run, or a reader, moves it
            pass

    def closer(self, kind: str) -> Callable[[float], None]:
        """How a process that outlives this one closes this run's `kind`
        wait: a local run's standby keeper, a fork of the run, ends it at
        the moment the run died (or got its slot) if the run could not.
        The key is the run's own, whether or not the run has opened the
        wait yet; a close of a wait that is not open changes nothing."""
        key = f"{self.run_id}:{kind}"

        def close(end: float) -> None:
            self._append("close a wait", {"op": "close", "key": key, "end": end})

        return close

    def heartbeat(self, at: float) -> None:
        if self._open is not None:
            self._append("refresh a wait", {"op": "beat", "key": self._open, "at": at})

    def close(self, end: float) -> None:
        if self._open is not None:
            key, self._open = self._open, None
            self._append("close a wait", {"op": "close", "key": key, "end": end})

    def finish(self, end: float) -> None:
        self.close(end)
