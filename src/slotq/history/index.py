"""The run history, indexed: `slotq history` and `slotq report`.

The history itself is JSON lines in the state dir (history.py: each
user's spool and segments, and older versions' shared ones). This is a per-user SQLite index of them, kept
beside the user's wait ledger (`<ledger dir>/history-index/<hash>.sqlite`,
one per state dir), never in the state dir itself: no other user can
plant a link or a journal file for SQLite to follow, and nobody pays for
SQLite on a run. Each query first catches up: it reads only what was
appended to each file since last time (by inode, offset and the file's
first bytes, so a spool emptied and refilled is read again from its
start), and keys rows by run id (a line that moved from the spool to a
segment is the same run). Rows older than the retention are dropped, and
so are the rows read from a file that was emptied or is gone: a cache of
the files must not outlive them (a state dir removed, a reboot's /tmp).

Every line is read with limits: at most 64 KiB, JSON with Python's own
nesting limit; a bad line is skipped and counted (`skipped`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time

from .. import history
from ..config import ledger_path
from ..records import valid_text
from ..statefile import StateFileError, make_private_dirs, open_state

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    key       TEXT PRIMARY KEY,      -- the run id @ the uid owning its file (or file:offset without a run id)
    run_id    TEXT, uid INTEGER, user TEXT, label TEXT, class TEXT, pool TEXT, slot TEXT, host TEXT,
    outcome   TEXT, blame TEXT, exit_code INTEGER, message TEXT,
    submitted REAL, slot_at REAL, prepared REAL, started REAL, ended REAL NOT NULL,
    waited_s  REAL, ran_s REAL,
    recorded_by TEXT,                -- who wrote the line, where not the run's own user (its file's owner)
    relay     INTEGER,               -- 1: a Slurm relay's line, which a node's line never replaces
    kept      REAL,                  -- a kept run's lease, seconds
    ticket    INTEGER, budget REAL,      -- its place's number in line, its budget (history lines since 2026-12)
    first     REAL NOT NULL,         -- its earliest phase: the run spans [first, ended]
    src       TEXT NOT NULL          -- the file its line was read from (files.name)
);
CREATE INDEX IF NOT EXISTS runs_by_src ON runs (src);
CREATE INDEX IF NOT EXISTS runs_by_end ON runs (ended);
CREATE INDEX IF NOT EXISTS runs_by_user ON runs (user, ended);
CREATE TABLE IF NOT EXISTS files (
    name TEXT PRIMARY KEY, ino INTEGER, off INTEGER, head BLOB
);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT);
"""

COLUMNS = ("run_id", "uid", "user", "label", "class", "pool", "slot", "host", "outcome", "blame", "exit_code", "message",
           "submitted", "slot_at", "prepared", "started", "ended", "waited_s", "ran_s", "recorded_by", "relay", "kept", "ticket", "budget")
SCHEMA_VERSION = "7"  # the index is a cache: another version is dropped and rebuilt
HEAD = 256  # a file's first bytes: a spool emptied and refilled has other ones
CHUNK = 8 << 20  # read at most this much of a file per step
# At most this much of one file is read in one catch-up; a file with more
# unread (grown by hand: a month of runs is tens of MiB) is read from its
# last CHUNK, and named: a query never hangs on one file.
MAX_CATCH_UP = 256 << 20
# ... and at most this much of another user's files in all (ours, and the
# shared ones of older versions: MAX_CATCH_UP in all):
# eight sparse files of 256 MiB, made in a moment and re-read whenever a
# byte in them changes, cost a reader 5 s (issue 65).
OWNER_CATCH_UP = 32 << 20
# A catch-up lists the files again while it finds one moved since its last
# listing (a spool renamed to its segment), at most this often: a spool
# moves once a SPOOL_BYTES of runs, and nobody's renames keep a query waiting.
MAX_PASSES = 8


def index_path(state_dir: str) -> str:
    key = hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()[:16]
    return os.path.join(os.path.dirname(ledger_path()), "history-index", f"{key}.sqlite")


class Index:
    def __init__(self, state_dir: str, retention_s: float, path: str | None = None) -> None:
        self.state_dir = state_dir
        self.retention_s = retention_s
        self.path = path or index_path(state_dir)
        # The index is a cache: where it cannot be kept (a service account's
        # HOME that does not exist, a read-only one), one in memory, built
        # afresh, reads the same history. `unkept` says why, for a note.
        self.unkept: str | None = None
        try:
            make_private_dirs(os.path.dirname(self.path))
            self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
        except (OSError, sqlite3.OperationalError) as e:
            self.unkept = f"{self.path}: {getattr(e, 'strerror', None) or e}"
            self.db = sqlite3.connect(":memory:", isolation_level=None)
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.create_function("label_matches", 2, _label_matches, deterministic=True)
        self.db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        row = self.db.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()
        if row is None or row[0] != SCHEMA_VERSION:  # (an older one's tables may lack today's columns)
            self.db.executescript("DROP TABLE IF EXISTS runs; DROP TABLE IF EXISTS files; DELETE FROM meta;")
            self.db.execute("INSERT INTO meta (k, v) VALUES ('schema', ?)", (SCHEMA_VERSION,))
        self.db.executescript(_SCHEMA)
        self.skipped = 0
        self.skipped_files: list[str] = []  # files (partly) passed over, one line each, for a warning

    def close(self) -> None:
        self.db.close()

    def catch_up(self, now: float | None = None) -> int:
        """Index what was appended since last time; drop rows past the
        retention. The number of lines read."""
        now = time.time() if now is None else now
        history.prune(self.state_dir, self.retention_s, now)
        cutoff = now - self.retention_s
        n = 0
        self.db.execute("BEGIN IMMEDIATE")
        try:
            for _ in range(MAX_PASSES):
                read, moved = self._pass(cutoff)
                n += read
                if not moved:
                    break
            self.db.execute("DELETE FROM runs WHERE ended < ?", (cutoff,))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return n

    def _pass(self, cutoff: float) -> tuple[int, bool]:
        """List the files and read what is new in each: (lines read,
        whether a file read before was gone or replaced). A spool that
        moved to its segment between the listing and its read (or while
        the directory was being listed, which may then show neither name)
        has its rows dropped with its segment not yet listed: the caller
        lists again, in the same transaction, so that no reader ever sees
        those runs missing."""
        notes: list[str] = []
        files = history.history_files(self.state_dir, notes)
        self.skipped_files += [n for n in notes if n not in self.skipped_files]
        moved = self._forget_files_gone([f.path for f in files])
        n = 0
        budget: dict[int | None, int] = {}
        for f in files:
            read, replaced = self._read_file(f, cutoff, budget)
            n += read
            moved = moved or replaced
        return n, moved

    def _forget_files_gone(self, files: list[str]) -> bool:
        """Drop the runs read from a history file that is no longer there
        (a segment past the retention, a spool moved on, or the whole state
        dir: removed, a reboot's /tmp). The index is a cache of the files:
        it must not go on showing runs whose lines are gone. Whether any
        was."""
        names = {os.path.relpath(p, self.state_dir) for p in files}
        gone = [name for (name,) in self.db.execute("SELECT name FROM files").fetchall() if name not in names]
        for name in gone:
            self.db.execute("DELETE FROM runs WHERE src = ?", (name,))
            self.db.execute("DELETE FROM files WHERE name = ?", (name,))
        return bool(gone)

    def _read_file(self, f: history.HistoryFile, cutoff: float, budget: dict[int | None, int]) -> tuple[int, bool]:
        """Read what is new in one file: (lines read, whether the file read
        before under its name was replaced, its rows dropped). `budget`:
        bytes read so far of each owner's files in this catch-up."""
        path = f.path
        name = os.path.relpath(path, self.state_dir)
        try:
            fd, _ = open_state(path, os.O_RDONLY)
        except (OSError, StateFileError):
            return 0, False
        try:
            if f.spool and f.owner is None:  # the shared spool of older versions
                # The spool is emptied when its lines move to a segment: read
                # it under the writers' shared lock, so that its size, first
                # bytes and lines are of one file (a move waits, or is left to
                # the next writer), never a resume offset of the old one
                # applied to the new.
                import fcntl

                if not history.lock_within(fd, fcntl.LOCK_SH, history.LOCK_WAIT):
                    self.skipped_files.append(f"{path}: locked by someone else (for more than "
                                              f"{history.LOCK_WAIT:g} s); its newest runs are not shown")
                    return 0, False
            st = os.fstat(fd)
            head = os.pread(fd, HEAD, 0)
            row = self.db.execute("SELECT ino, off, head FROM files WHERE name = ?", (name,)).fetchone()
            off, replaced = 0, False
            if row is not None and row[0] == st.st_ino and row[1] <= st.st_size and \
                    bytes(row[2] or b"")[:len(head)] == head[:len(row[2] or b"")]:
                off = row[1]
            elif row is not None:  # emptied (moved to a segment) or replaced: its lines are not these
                self.db.execute("DELETE FROM runs WHERE src = ?", (name,))
                replaced = True
            start = self._start(f, fd, st.st_size, off, budget)
            if start is None:
                return 0, replaced
            off = start
            n = 0
            rows = []
            while off < st.st_size:
                data = os.pread(fd, min(CHUNK, st.st_size - off), off)
                end = data.rfind(b"\n")
                if end < 0:
                    if len(data) >= history.MAX_LINE + 1:  # one huge line: skip it whole
                        nl = self._next_newline(fd, off + len(data), st.st_size)
                        self.skipped += 1
                        off = nl
                        continue
                    break  # a line still being written
                base = off
                for line in data[:end].split(b"\n"):
                    rec = self._parse(line, f.owner)
                    if rec is not None and rec[COLUMNS.index("ended")] is not None and \
                            rec[COLUMNS.index("ended")] >= cutoff:  # type: ignore[operator]
                        # Keyed by who wrote it (its file's owner): a line of
                        # someone else's never replaces the run's own.
                        key = f"{rec[0]}@{'shared' if f.owner is None else f.owner}" \
                            if isinstance(rec[0], str) and rec[0] else f"{name}:{base}"
                        ph = [v for v in rec[COLUMNS.index("submitted"):COLUMNS.index("ended") + 1]
                              if isinstance(v, (int, float))]
                        rows.append((key, *rec, min(ph), name))
                    base += len(line) + 1
                    n += 1
                off += end + 1
                if len(rows) >= 10_000:
                    self._insert(rows)
                    rows = []
            self._insert(rows)
            self.db.execute("INSERT OR REPLACE INTO files (name, ino, off, head) VALUES (?, ?, ?, ?)",
                            (name, st.st_ino, off, head))
            return n, replaced
        finally:
            os.close(fd)

    def _start(self, f: history.HistoryFile, fd: int, size: int, off: int,
               budget: dict[int | None, int]) -> int | None:
        """Where to read the file `f` (open on `fd`, `size` bytes, read up
        to `off` before) from in this catch-up; None: not at all. Ours, and
        the pool's shared files of older versions (a month of a busy pool is
        tens of MiB): a file's bound, MAX_CATCH_UP, in all; each other
        member's files: OWNER_CATCH_UP in all. What is left out is said."""
        mine = f.owner is None or f.owner == os.getuid()
        left = (MAX_CATCH_UP if mine else OWNER_CATCH_UP) - budget.get(f.owner, 0)
        if left <= 0 and size > off:
            self.skipped_files.append(f"{f.path}: not read (its owner's history files read in this catch-up "
                                      f"passed {OWNER_CATCH_UP >> 20} MiB)")
            return None
        if size - off > min(MAX_CATCH_UP, left):
            tail = min(CHUNK, left)
            self.skipped_files.append(f"{f.path}: {size - off} bytes unread, more than a history file "
                                      f"grows to; only its last {max(1, tail >> 20)} MiB were read")
            off = self._next_newline(fd, size - tail, size)
        budget[f.owner] = budget.get(f.owner, 0) + (size - off)
        return off

    @staticmethod
    def _next_newline(fd: int, pos: int, size: int) -> int:
        while pos < size:
            data = os.pread(fd, 1 << 20, pos)
            i = data.find(b"\n")
            if i >= 0:
                return pos + i + 1
            pos += len(data)
        return size

    def _insert(self, rows: list[tuple[object, ...]]) -> None:
        """Rows of (key, *COLUMNS, first, src). The longest span indexed so
        far is kept, so a window query scans only the runs that can reach it."""
        if rows:
            marks = ", ".join("?" * (len(COLUMNS) + 3))
            cols = [*map(_q, COLUMNS), "first", "src"]
            # The later line of a run replaces the earlier, except that a
            # Slurm relay's (it knows how Slurm ended the job) is never
            # replaced by its node's, whichever was written last.
            self.db.executemany(f"INSERT INTO runs (key, {', '.join(cols)}) VALUES ({marks}) ON CONFLICT(key) DO "
                                f"UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in cols)} "
                                "WHERE runs.relay IS NULL OR excluded.relay IS NOT NULL", rows)
            end = COLUMNS.index("ended") + 1
            longest = max(float(r[end]) - float(r[-2]) for r in rows)  # type: ignore[arg-type]
            if longest > self._longest():
                self.db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES ('longest', ?)", (repr(longest),))

    def _longest(self) -> float:
        row = self.db.execute("SELECT v FROM meta WHERE k = 'longest'").fetchone()
        return float(row[0]) if row else 0.0

    def _parse(self, line: bytes, writer: int | None) -> tuple[object, ...] | None:
        if not line.strip():
            return None
        if len(line) > history.MAX_LINE:
            self.skipped += 1
            return None
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError):
            self.skipped += 1
            return None
        if not isinstance(raw, dict):
            self.skipped += 1
            return None
        rec = history.attributed(history.clean_record(raw), writer)
        ph: dict[str, object] = rec["phases"] or {}  # type: ignore[assignment]
        ended = ph.get("ended")
        if ended is None:
            self.skipped += 1
            return None
        fields = {**rec, "submitted": ph.get("submitted"), "slot_at": ph.get("slot"),
                  "prepared": ph.get("prepared"), "started": ph.get("started"), "ended": ended}
        return tuple(fields.get(c) for c in COLUMNS)

    def query(self, since: float | None = None, until: float | None = None, user: list[str] | None = None,
              label: str | None = None, outcome: list[str] | None = None, cls: list[str] | None = None,
              limit: int | None = None) -> list[dict[str, object]]:
        """Runs that overlap [since, until] (ended at or after `since`,
        submitted at or before `until`), oldest first, filtered: `user`,
        `outcome` and `cls` each any of the values listed, `label` a
        substring. The newest `limit` if given."""
        where: list[str] = ["1"]
        args: list[object] = []
        if since is not None:
            where.append("ended >= ?")
            args.append(since)
        if until is not None:
            # A run overlapping the window ends at most `longest` after it.
            where += ["ended <= ?", "first <= ?"]
            args += [until + self._longest(), until]
        # Text as the index keeps it (history.clean_record): a filter that is
        # not UTF-8 matches the label it names, and never fails in SQLite.
        for col, values in (("user", user), ("outcome", outcome), ("class", cls)):
            if values is not None:
                where.append(f"{_q(col)} IN ({', '.join('?' * len(values))})")
                args += [valid_text(v) for v in values]
        if label is not None:
            # A shell-style pattern (as `slotq cancel --label` takes) is matched
            # against the whole label; plain text anywhere in it.
            where.append("label_matches(label, ?)" if is_pattern(label) else "instr(label, ?) > 0")
            args.append(valid_text(label))
        sql = f"SELECT {', '.join(_q(c) for c in COLUMNS)} FROM runs WHERE {' AND '.join(where)} ORDER BY ended DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = self.db.execute(sql, args).fetchall()
        return [_run(dict(zip(COLUMNS, r))) for r in reversed(rows)]

    def counts(self) -> list[tuple[str, str, str, int]]:
        """(pool, outcome, blame, runs) over the history kept."""
        rows = self.db.execute("SELECT COALESCE(pool, ''), COALESCE(outcome, ''), COALESCE(blame, ''), COUNT(*) "
                               "FROM runs GROUP BY 1, 2, 3 ORDER BY 1, 2, 3").fetchall()
        return [(str(p), str(o), str(b), int(n)) for p, o, b, n in rows]

    def histogram(self, column: str, bounds: tuple[float, ...]) -> dict[str, tuple[list[int], float, int]]:
        """pool -> (runs with `column` at most each bound, the column's sum,
        runs with it), over the history kept: `waited_s` or `ran_s`."""
        if column not in ("waited_s", "ran_s"):
            raise ValueError(column)
        le = ", ".join(f"SUM({column} <= {float(b)!r})" for b in bounds)
        rows = self.db.execute(f"SELECT COALESCE(pool, ''), {le}, SUM({column}), COUNT({column}) FROM runs "
                               f"WHERE {column} IS NOT NULL GROUP BY 1 ORDER BY 1").fetchall()
        return {str(r[0]): ([int(x or 0) for x in r[1:-2]], float(r[-2] or 0.0), int(r[-1])) for r in rows}

    def find(self, run_id: str, uid: int | None = None) -> dict[str, object] | None:
        """Our run `run_id` (or `uid`'s) as its own line says: one in a file
        of ours, saying it is ours (history.own); None if the history has
        none. Another member's line naming it is never it: `claims`."""
        me = os.getuid() if uid is None else uid
        row = self.db.execute(f"SELECT {', '.join(_q(c) for c in COLUMNS)} FROM runs WHERE key = ? AND uid = ? "
                              "AND recorded_by IS NULL ORDER BY ended DESC LIMIT 1",
                              (f"{valid_text(run_id)}@{me}", me)).fetchone()
        return None if row is None else _run(dict(zip(COLUMNS, row)))

    def claims(self, run_id: str) -> list[dict[str, object]]:
        """Every line naming `run_id`, whoever wrote it (`recorded_by`)."""
        rows = self.db.execute(f"SELECT {', '.join(_q(c) for c in COLUMNS)} FROM runs WHERE run_id = ? "
                               "ORDER BY ended", (valid_text(run_id),)).fetchall()
        return [_run(dict(zip(COLUMNS, r))) for r in rows]


def is_pattern(label: str) -> bool:
    """Whether --label is a shell-style pattern (* ? [...]) rather than text."""
    return any(c in label for c in "*?[")


def _label_matches(label: object, pattern: str) -> bool:
    from fnmatch import fnmatchcase

    return isinstance(label, str) and fnmatchcase(label, pattern)


def _q(col: str) -> str:
    return f'"{col}"'


def _run(row: dict[str, object]) -> dict[str, object]:
    """A row in the vocabulary of `run --json`: phases nested."""
    phases = {"submitted": row.pop("submitted"), "slot": row.pop("slot_at"), "prepared": row.pop("prepared"),
              "started": row.pop("started"), "ended": row.pop("ended")}
    row.pop("relay", None)
    row.pop("uid", None)
    if row.get("recorded_by") is None:
        row.pop("recorded_by", None)
    return {**row, "phases": phases}
