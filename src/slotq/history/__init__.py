"""The host's run history: one JSON line per finished run, kept for months.

Writers never pay for a database, and each writes only files of its own:
a run appends its line to its user's spool, `history/u<uid>.jsonl` (one
small O_APPEND write; readable by all, writable by its owner alone, and in
a shared state dir's sticky `history/` nobody else can delete or replace
it). When the spool passes `SPOOL_BYTES`, the writer that noticed renames
it to a segment `history/u<uid>-<time>-<random>.jsonl`: a line written
meanwhile through an older descriptor lands in the segment, so no lock is
needed (and none can be held against us by hand). A segment whose last
write lies before the retention window is deleted by its owner. If
someone took the spool's name first, the user's spool is
`history/u<uid>.<random>.jsonl` instead, found again by its owner.

Who wrote a line is the file's owner, from the kernel: a line in another
user's file about your run is shown as `recorded_by` them (a dead waiter's
line is written by whoever is next in line, which may be another user).
Files of older versions -- one shared spool, `history.jsonl`, moved to
`history/YYYY-MM.jsonl` under a flock -- are still read (and an older
slotq on the host may still write them); anyone in the group could write
those, so their lines carry no writer.

Readers:
- `recent(state_dir, n)`: the last `n` runs, read backwards from the files
  written last (no index; `slotq status`).
- `history.index.Index` (`slotq history`, `slotq report`): a per-user SQLite
  index of every file, caught up incrementally, queried by window.

One vocabulary everywhere (`run --json`, `status --json`, history):
`class`, and `phases.submitted` for the time the host took the request.
Older lines (`cls`, `phases.queued`) are read as that.
"""


from __future__ import annotations

import os

from .. import record
from ..records import from_json, is_number, to_json, valid_text

SPOOL_BYTES = 1 << 20  # the spool moves to its segment past this
MAX_LINE = 64 * 1024  # longer lines are skipped as corrupt
TAIL_WINDOW = 1 << 20  # `recent` reads at most this much of each user's files' ends
RECENT_BUDGET = 16 << 20  # and this much in all
LOCK_WAIT = 2.0  # seconds a history lock is waited for (anyone may hold one by hand)
# A spool past this was grown by hand (ours moves at SPOOL_BYTES): it is not
# read into memory to be moved, only appended to and read from its end.
SPOOL_LIMIT = 64 << 20
PHASES = record.HOST_PHASES


MAX_ENTRIES = 200_000  # names in history/ looked at, at most (a directory past it: said)
MAX_PER_OWNER = 1_000  # files of one user read, at most: their spools and newest segments (more: said)


def history_path(state_dir: str) -> str:
    """The shared spool of older versions (still read)."""
    return os.path.join(state_dir, "history.jsonl")


def segments_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "history")


def spool_path(state_dir: str, uid: int | None = None) -> str:
    """A user's spool, by its usual name (ours by default)."""
    return os.path.join(segments_dir(state_dir), f"u{os.getuid() if uid is None else uid}.jsonl")


class HistoryFile:
    """One file of the history, as a reader meets it."""

    __slots__ = ("path", "owner", "spool", "mtime")

    def __init__(self, path: str, owner: int | None, spool: bool, mtime: float) -> None:
        self.path = path
        self.owner = owner  # a user's own file: its owner's uid (the kernel's); None: a shared one
        self.spool = spool  # emptied or renamed away when its lines move on
        self.mtime = mtime


def history_files(state_dir: str, notes: list[str] | None = None) -> list[HistoryFile]:
    """Every history file: the spools first (the shared one of older
    versions, then each user's), then the segments; within each, the one
    written last first. Links and odd files are left out, and so are shared
    files of older versions that are not the pool's (owned by neither root
    nor the state dir's owner: planted by a member), and files whose name
    says they are another user's than their owner's. Bounded: names that
    are no history file's are skipped before anything is counted, and each
    owner's files are capped (MAX_PER_OWNER): a flood of one member's junk
    costs that member, not the others. `notes`: what was left out, a line
    each."""
    import stat

    try:
        pool_owners = {0, os.stat(state_dir).st_uid}
    except OSError:
        return []
    out: list[HistoryFile] = []
    for path in (history_path(state_dir), history_path(state_dir) + ".1"):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid in pool_owners:
            out.append(HistoryFile(path, None, path.endswith(".jsonl"), st.st_mtime))
    hdir = segments_dir(state_dir)
    by_owner: dict[int, list[HistoryFile]] = {}
    looked = 0
    try:
        with os.scandir(hdir) as it:
            for e in it:
                looked += 1
                if looked > MAX_ENTRIES:
                    if notes is not None:
                        notes.append(f"{hdir} holds more than {MAX_ENTRIES} names: only the first were looked at")
                    break
                name = e.name
                if not name.endswith(".jsonl"):
                    continue
                kind = _file_kind(name)
                if kind is None:
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if kind == "month":
                    if st.st_uid in pool_owners:
                        out.append(HistoryFile(e.path, None, False, st.st_mtime))
                elif st.st_uid == _named_uid(name):  # (one that says it is another's is junk)
                    by_owner.setdefault(st.st_uid, []).append(HistoryFile(e.path, st.st_uid, kind == "spool",
                                                                          st.st_mtime))
    except OSError:
        pass
    for owner, files in by_owner.items():
        files.sort(key=lambda f: (not f.spool, -f.mtime))
        if len(files) > MAX_PER_OWNER and notes is not None:
            notes.append(f"{len(files) - MAX_PER_OWNER} older history file(s) of user {_user_name(owner)} were "
                         f"not read (at most {MAX_PER_OWNER} a user)")
        out += files[:MAX_PER_OWNER]
    out.sort(key=lambda f: (not f.spool, -f.mtime))
    return out


def _named_uid(name: str) -> int:
    """The uid a user's history file name gives (u<uid>...)."""
    digits = name[1:]
    end = 0
    while end < len(digits) and digits[end].isdigit():
        end += 1
    return int(digits[:end]) if end else -1


def _file_kind(name: str) -> str | None:
    """"spool" (u<uid>.jsonl, u<uid>.<hex>.jsonl), "segment"
    (u<uid>-<stamp>-<hex>.jsonl), "month" (an older version's shared
    YYYY-MM.jsonl), or None: no history file."""
    if not name.endswith(".jsonl"):
        return None
    stem = name[:-6]
    if len(stem) == 7 and stem[:4].isdigit() and stem[4] == "-" and stem[5:].isdigit():
        return "month"
    if not stem.startswith("u"):
        return None
    uid, sep, rest = stem[1:].partition("." if "." in stem else "-")
    if not uid.isdigit() or len(uid) > 10:
        return None
    if not sep:
        return "spool"
    if sep == "." and len(rest) == 16 and _hex(rest):
        return "spool"
    stamp, dash, token = rest.partition("-")
    if sep == "-" and dash and len(stamp) == 15 and stamp[8] == "T" and (stamp[:8] + stamp[9:]).isdigit() \
            and _hex(token):
        return "segment"
    return None


def _hex(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdef" for c in text)


def segment_files(state_dir: str) -> list[str]:
    """The segments (older versions' months and each user's), oldest
    written first."""
    return [f.path for f in reversed(history_files(state_dir)) if not f.spool]


def append(state_dir: str, record: dict[str, object]) -> None:
    """Add a finished run's record to our own spool; failures are ignored
    (a run's result never depends on its history line)."""
    from ..statefile import StateFileError, make_dirs

    line = to_json(record).encode() + b"\n"
    hdir = segments_dir(state_dir)
    try:
        make_dirs(hdir, state_dir)
        fd, path = _own_spool(hdir)
        try:
            os.write(fd, line)
            if os.fstat(fd).st_size > SPOOL_BYTES:
                _move_on(fd, path)
        finally:
            os.close(fd)
    except (OSError, StateFileError):
        pass


def _own_spool(hdir: str) -> tuple[int, str]:
    """Our spool, open for appending: u<uid>.jsonl, or if that name is
    someone else's (taken first) a u<uid>.<random>.jsonl of ours."""
    from ..statefile import StateFileError, open_state, share_created

    uid = os.getuid()
    path = os.path.join(hdir, f"u{uid}.jsonl")  # spool_path's
    fd, created = -1, False
    for _ in range(10):
        try:
            fd, created = open_state(path, os.O_WRONLY | os.O_APPEND, create=True)
        except FileNotFoundError:
            continue  # made and moved on by another run of ours between two looks: again
        except (PermissionError, StateFileError):
            pass
        break
    if fd >= 0:
        st = os.fstat(fd)
        if st.st_uid == uid and st.st_nlink == 1:
            if created:
                share_created(fd, hdir, writable=False)
            return fd, path
        os.close(fd)
    prefix = f"u{uid}."
    with os.scandir(hdir) as it:
        for _, e in zip(range(MAX_ENTRIES), it):
            if e.name.startswith(prefix) and _file_kind(e.name) == "spool":
                st = e.stat(follow_symlinks=False)
                if st.st_uid == uid and st.st_nlink == 1:
                    fd, _ = open_state(e.path, os.O_WRONLY | os.O_APPEND)
                    return fd, e.path
    path = os.path.join(hdir, f"{prefix}{os.urandom(8).hex()}.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    share_created(fd, hdir, writable=False)
    return fd, path


def _move_on(fd: int, path: str) -> None:
    """Rename our full spool to a segment (if the file at its name is
    still the one we wrote to: another run of ours may have moved it)."""
    import time

    st = os.fstat(fd)
    try:
        now = os.stat(path)
    except OSError:
        return
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        return
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    os.rename(path, os.path.join(os.path.dirname(path), f"u{os.getuid()}-{stamp}-{os.urandom(4).hex()}.jsonl"))


def prune(state_dir: str, retention_s: float, now: float) -> list[str]:
    """Delete the segments last written before the retention window (ours:
    in a shared dir, nobody else's can be). The ones deleted."""
    import calendar

    cutoff = now - retention_s
    uid = os.getuid()
    gone = []
    for f in history_files(state_dir):
        if f.spool:
            continue
        name = os.path.basename(f.path)
        if f.owner is None:  # an older version's month: by the month's end
            year, month = int(name[:4]), int(name[5:7])
            old = calendar.timegm((year + month // 12, month % 12 + 1, 1, 0, 0, 0)) < cutoff
        else:
            old = f.owner == uid and f.mtime < cutoff
        if old:
            try:
                os.unlink(f.path)
                gone.append(f.path)
            except OSError:
                pass
    return gone


def recent(state_dir: str, n: int = 10, notes: list[str] | None = None) -> list[dict[str, object]]:
    """The last `n` records, oldest first, read backwards from the files
    written last: each owner's files (ours first), at most TAIL_WINDOW of
    each owner's and RECENT_BUDGET in all, so that nobody's planted or
    grown files crowd out the others'. Within an owner's files, one last
    written before the n-th newest run found there holds none newer: the
    reading of that owner's stops there."""
    from ..statefile import StateFileError, open_state

    if n <= 0:
        return []
    found: list[tuple[float, int, dict[str, object]]] = []  # (ended, order read, record)
    owners: dict[int | None, list[HistoryFile]] = {}
    for f in sorted(history_files(state_dir, notes), key=lambda f: -f.mtime):
        owners.setdefault(f.owner, []).append(f)
    me = os.getuid()
    budget = RECENT_BUDGET
    for owner in sorted(owners, key=lambda o: o != me):
        if budget <= 0:
            if notes is not None:
                notes.append(f"the newest runs of user {_user_name(owner) if owner is not None else '?'} "
                             "and others were not read (the history read for this is bounded)")
            break
        own_budget = min(TAIL_WINDOW, budget)
        own_found: list[float] = []
        for f in owners[owner]:
            if own_budget <= 0 or len(own_found) >= n and f.mtime < sorted(own_found)[-n]:
                break
            try:
                fd, _ = open_state(f.path, os.O_RDONLY)
            except (OSError, StateFileError):
                continue
            try:
                window = min(os.fstat(fd).st_size, own_budget)
                own_budget -= window
                budget -= window
                lines = _tail_lines(fd, n, window=window)
            except OSError:
                lines = []
            finally:
                os.close(fd)
            last = 0.0
            for line in lines:
                rec = parse_line(line, f.owner)
                if rec is not None:
                    last = ended(rec) or last  # a line that does not say: where it stands in its file
                    found.append((last, len(found), rec))
                    own_found.append(last)
    found.sort(key=lambda x: x[:2])
    return [rec for _, _, rec in found[-n:]]


def ended(rec: dict[str, object]) -> float:
    """When a record's run ended (0 if it does not say)."""
    phases = rec.get("phases")
    end = phases.get("ended") if isinstance(phases, dict) else None
    return float(end) if is_number(end) else 0.0  # type: ignore[arg-type]


def once_each(records: list[dict[str, object]]) -> list[dict[str, object]]:
    """Each run once, as its later line says (a Slurm relay's word after its
    node's): what `slotq history` shows. Lines without a run id are kept."""
    def key(r: dict[str, object]) -> tuple[object, object, object]:
        return r.get("run_id"), r.get("uid"), r.get("recorded_by")  # another user's line never hides the run's own

    later: dict[tuple[object, object, object], int] = {}
    for i, r in enumerate(records):
        k = key(r)
        if r.get("run_id") is not None and (r.get("relay") or not records[later.get(k, i)].get("relay")):
            later[k] = i  # a relay's line is never replaced by its node's
    return [r for i, r in enumerate(records) if r.get("run_id") is None or later[key(r)] == i]


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


def parse_line(line: bytes, writer: int | None = None) -> dict[str, object] | None:
    """One history line, cleaned; None if it is too long or not a JSON
    object (a corrupt or hand-written line). `writer`: the uid that owns
    the file it was read from (None: a shared file of older versions); a
    line about someone else's run says who wrote it (`recorded_by`)."""
    if len(line) > MAX_LINE:
        return None
    try:
        rec = from_json(line.decode("utf-8", "replace"))
    except ValueError:
        return None
    return attributed(clean_record(rec), writer) if isinstance(rec, dict) else None


SHARED_WRITER = "a shared file"  # `recorded_by` of a line in an older version's shared file: anyone's word


def attributed(rec: dict[str, object], writer: int | None) -> dict[str, object]:
    """A cleaned record with who wrote it, where that is not the run's own
    user: `recorded_by`, from the owner of its file (never its own word);
    a line of an older version's shared file (`writer` None), which any
    member could have written, is nobody's own."""
    rec.pop("recorded_by", None)
    if writer is None:
        rec["recorded_by"] = SHARED_WRITER
    elif rec.get("uid") != writer:
        rec["recorded_by"] = _user_name(writer)
    return rec


def own(rec: dict[str, object], uid: int | None = None) -> bool:
    """Is `rec` (attributed) a line of our own (or `uid`'s) about a run of
    our own: in a file we own, saying it is ours? Only such a line says how
    one of our runs ended; any other naming its run id is someone's claim."""
    return rec.get("uid") == (os.getuid() if uid is None else uid) and not rec.get("recorded_by")


_TEXT = ("run_id", "label", "class", "pool", "slot", "host", "outcome", "message")
_NUMBERS = ("waited_s", "ran_s", "kept", "budget")  # kept: a kept run's lease, seconds (None: not a kept run)


def clean_record(rec: dict[str, object]) -> dict[str, object]:
    """A history record with the types readers rely on: text fields are
    str or None, durations numbers or None, exit_code int or None, phases a
    dict of numbers or None, and `blame` from the outcome. Anything else
    (a corrupt or hand-written line) becomes None, never a crash. Older
    lines' names (`cls`, `phases.queued`) are read as today's."""
    from ..outcome import Outcome

    out = dict(rec)
    uid = out.get("uid")
    if not (isinstance(uid, int) and not isinstance(uid, bool) and 0 <= uid < 1 << 32):
        uid = out["uid"] = None
    # The run's user by its uid, never by a name the line gives (anyone can
    # write "user": "alice" into a line of their own).
    out["user"] = _user_name(uid) if uid is not None else None
    if "class" not in out and "cls" in out:
        out["class"] = out.pop("cls")
    for k in _TEXT:
        v = out.get(k)
        out[k] = valid_text(v) if isinstance(v, str) else None  # a non-UTF-8 label must not stop the index
    for k in _NUMBERS:
        v = out.get(k)
        out[k] = v if is_number(v) else None
    ticket = out.get("ticket")
    out["ticket"] = ticket if isinstance(ticket, int) and not isinstance(ticket, bool) and 0 <= ticket < 1 << 63 \
        else None
    code = out.get("exit_code")
    # An exit status or a negative signal number: 32 bits at most (a longer
    # one would not fit the index's SQLite INTEGER).
    if out.get("relay") is not True:  # a Slurm relay's line (transports/slurm/) says so; no other
        out.pop("relay", None)
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
        from ..procinfo import user_name

        _names[uid] = user_name(uid)
    return _names[uid]


def run_record(*, run_id: object, label: object, cls: object, host: object, pool: object, slot: object,
               ticket: object, budget: object, kept: object, outcome: str, exit_code: int | None, message: str,
               phases: dict[str, float | None], uid: int | None = None) -> dict[str, object]:
    """A history line: the run record's fields a host writes (record.LINE_KEYS,
    its `exit_code` the command's own) and its writer's uid. Every field is
    asked for, by every path that writes one (the runner, the keeper, a
    buried ticket, a healed orphan, Slurm's relay and sentinel): None where
    the path does not know it."""
    uid = os.getuid() if uid is None else uid  # the name is looked up by readers (clean_record): not a run's cost
    return {
        "run_id": run_id, "uid": uid, "label": label, "class": cls, "pool": pool,
        "slot": slot, "host": host, "ticket": ticket, "budget": budget, "kept": kept,
        "outcome": outcome, "exit_code": exit_code, "message": message,
        "phases": {k: phases.get(k) for k in PHASES},
        "waited_s": record.waited_s(phases), "ran_s": record.ran_s(phases),
    }
