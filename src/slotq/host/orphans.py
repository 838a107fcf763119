"""A run's processes when its supervision is gone.

The keeper (process.py) ends the command whatever happens to the runner.
This module covers the cases where the keeper itself is gone:

- the runner is alive and sees its keeper die (OOM killer, a stray
  `kill -9`): it finds the command's processes and ends them itself;
- runner and keeper are both gone but the slot is still held: the holder
  is an orphaned command. The head of the line finds it through the slot's
  holder record and ends it if it belongs to the same user; `slotq status`
  names it.

A process is identified by pid *and* start time (clock ticks since boot,
/proc/<pid>/stat), never by pid alone: a reused pid is another process.
A run's processes are found two ways, either of which suffices:
- its session: the command starts in a session of its own, and the kernel
  never reuses a pid while it still names a session, so members of session
  <leader> are the command's own (descendants that called setsid again
  leave it);
- the run's marker in the environment (`SLOTQ_RUN_ID=<id>`), which every
  descendant inherits unless it clears its environment.
Not by an open descriptor on the slot file: the keepers of the runs waiting
for that slot have one too. The marker needs read access to
/proc/<pid>/environ: our own processes (or everyone's, as root); sessions
are visible to all. A descendant that both left the session and cleared its
environment is not found (it still holds the slot, so nothing overlaps; the
slot is then shown as held with no live slotq process).

What may be killed is never decided by a file. In a shared state dir any
member of the group can write a slot's holder record, so the record is a
hint that can only hold a heal back, never set one off (`orphan_in_slot`):
the kernel must say that the slot's lock is held through descriptors of
processes of our own uid (/proc/<pid>/fdinfo), those processes must carry
one run's marker in their own environment, and the nearest ancestor of
theirs outside that run must not be a live keeper (a keeper names itself
`slotq-keeper`, which only its own user can do). The run id, session and
processes ended all come from there; the record gives the label.
"""

from __future__ import annotations

import os
import time

from ..procinfo import KEEPER_NAME, alive, start_ticks, stat_fields, uid_of
from ..records import is_pid
from ..spec import is_run_id

MAX_ANCESTORS = 256


def _ancestors(limit: int = 4096) -> set[tuple[int, int]]:
    """(pid, start ticks) of this process and each of its ancestors."""
    out: set[tuple[int, int]] = set()
    pid = os.getpid()
    while pid > 1 and len(out) < limit:
        fields = stat_fields(pid)
        if fields is None:
            break
        out.add((pid, int(fields[19])))
        pid = int(fields[1])
    return out


def nested_in(state_dir: str, pool: str, count: int, run_id: str) -> tuple[int, dict[str, object]] | None:
    """The slot of `pool` that run `run_id` holds here (its index and holder
    record, for display), if this process runs inside that run: one of our
    ancestors holds the slot's lock, as the kernel says -- through a
    descriptor of its own (/proc/PID/fdinfo: the run's command inherits
    the lock), or as the process that took it (/proc/locks: the keeper, the
    runner). A process that merely carries the run's marker in its
    environment (one that outlived its run, or any other) is not inside it,
    and a holder record, which anyone in the group may write, never says
    so (issue 65: a forged record naming a run's command refused the runs
    nested in it). Reads the slots without locking them: no side effects
    on the line."""
    from .proclocks import owners, pids_on
    from .slot import read_slot, slot_path

    table = owners()
    locked = None if table is None else set(table)
    ancestors: list[int] | None = None
    for index in range(count):
        is_held, info = read_slot(state_dir, pool, index, locked)
        if not is_held:
            continue
        if ancestors is None:
            ancestors = [pid for pid, _ in _ancestors() if _ours(pid)]
        path = slot_path(state_dir, pool, index)
        holders = set(pids_on(path, table) or [])
        if holders.intersection(ancestors) or any(_holds_lock_on(pid, path) for pid in ancestors):
            if info is None or info.get("run_id") != run_id:
                info = {"run_id": run_id, "label": "its command just started"}  # the record is still the last one's
            return index, info
    return None


def _ours(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def _holds_lock_on(pid: int, path: str) -> bool:
    """Does process `pid` (ours) hold a flock on the file at `path` through
    a descriptor of its own? (fdinfo lists the locks taken through that
    open file.)"""
    try:
        st = os.stat(path)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds[:4096]:
        try:
            at = os.stat(f"/proc/{pid}/fd/{fd}")
            if (at.st_dev, at.st_ino) != (st.st_dev, st.st_ino):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as f:
                if b"FLOCK" in f.read(65536):
                    return True
        except OSError:
            continue
    return False


def run_processes(*, session: int | None = None, session_start: int | None = None,
                  marker: str | None = None) -> dict[int, int]:
    """pid -> uid of the live processes of one run: members of `session`
    (if its leader is gone or is the one that started at `session_start`)
    and processes whose environment carries `SLOTQ_RUN_ID=<marker>`.
    Never ourselves."""
    if session is not None and session_start is not None:
        leader = start_ticks(session)
        if leader is not None and leader != session_start:
            session = None  # impossible while members exist; be safe anyway
    me = os.getpid()
    found: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me:
            continue
        fields = stat_fields(name)
        if fields is None or fields[0] == b"Z":
            continue
        if (session is not None and int(fields[3]) == session) or (marker and run_marker(pid) == marker):
            uid = uid_of(pid)
            if uid is not None:
                found[pid] = uid
    return found


def holder_state(info: dict[str, object], lock_pids: list[int] | None = None) -> str:
    """What a slot's holder record means now: its recorded phase (`running`,
    `prepare`, `stopping`) while its runner lives; `stopping` while only its
    keeper lives (it ends the command); `orphaned` when both are gone.

    `lock_pids`: who took the slot's lock, from the kernel (proclocks). A
    live one that the record names neither as runner nor as keeper is a
    new holder between taking the slot and writing its record (a few ms
    at every hand-over): `starting` -- the record is the previous
    holder's, and its runner and keeper being gone says nothing."""
    if lock_pids and new_taker(info, lock_pids):
        return "starting"
    if alive(info.get("pid"), info.get("pid_start")):
        phase = info.get("phase")
        return phase if isinstance(phase, str) else "running"
    if alive(info.get("keeper"), info.get("keeper_start")):
        return "stopping"
    return "orphaned"


def new_taker(info: dict[str, object], lock_pids: list[int]) -> bool:
    """Did a live process that `info` does not name take the lock?"""
    named = {info.get("pid"), info.get("keeper")}
    return any(p > 0 and p not in named and start_ticks(p) is not None for p in lock_pids)


def lock_holders(path: str) -> dict[int, int]:
    """pid -> uid of the processes that hold the flock of the file at `path`
    through a descriptor of their own -- the kernel's word
    (/proc/<pid>/fdinfo lists a lock on the descriptor that shares its open
    file; a waiter's own descriptor on the same file shows none). Only the
    processes whose descriptors we may read are seen: our own (everyone's,
    as root)."""
    try:
        st = os.stat(path)
    except OSError:
        return {}
    key = (st.st_dev, st.st_ino)
    found: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue  # gone, or not ours to look into
        for fd in fds:
            try:
                target = os.stat(f"/proc/{name}/fd/{fd}")
                if (target.st_dev, target.st_ino) != key:
                    continue
                with open(f"/proc/{name}/fdinfo/{fd}", "rb") as f:
                    fdinfo = f.read(1 << 16)
            except OSError:
                continue
            if any(line.startswith(b"lock:") and b" FLOCK " in line and b"->" not in line
                   for line in fdinfo.splitlines()):
                uid = uid_of(int(name))
                if uid is not None:
                    found[int(name)] = uid
                break
    return found


def run_marker(pid: int) -> str | None:
    """The run id in `pid`'s own environment (SLOTQ_RUN_ID), if we may read
    it: an orphan's run told by the kernel, not by a record."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read(1 << 20)
    except OSError:
        return None
    for var in env.split(b"\0"):
        if var.startswith(b"SLOTQ_RUN_ID="):
            value = var[len(b"SLOTQ_RUN_ID="):].decode("ascii", "replace")
            return value if is_run_id(value) else None
    return None


def _parent(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[1]) if fields is not None else None


def _is_keeper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read(64).strip() == KEEPER_NAME and uid_of(pid) == os.getuid()
    except OSError:
        return False


def supervised(pid: int, run_id: str) -> bool:
    """Does a live keeper of ours watch over `pid`, a process of run
    `run_id`? Its keeper is the nearest ancestor outside the run (a child
    subreaper: every process of the run stays below it while it lives).
    Once the keeper is gone they are init's, or a subreaper's above it."""
    for _ in range(MAX_ANCESTORS):
        parent = _parent(pid)
        if parent is None or parent <= 1:
            return False
        if run_marker(parent) != run_id:
            return _is_keeper(parent)
        pid = parent
    return True  # a chain past the limit: not proven unwatched


def orphan_in_slot(path: str) -> tuple[str, dict[int, int], int | None] | None:
    """The orphaned run holding the slot file at `path`, from the kernel
    alone: (its run id, its lock holders (pid -> uid), the session they
    are in). None unless the lock is held only by processes of ours, all
    of one run (their own SLOTQ_RUN_ID), none of them watched by a live
    keeper -- whatever the slot's record says."""
    holders, markers = {}, set()
    for pid, owner in lock_holders(path).items():
        marker = run_marker(pid)
        if marker is None and start_ticks(pid) is None:
            continue  # gone since the scan (a command's short-lived child): it holds nothing now
        holders[pid] = owner
        markers.add(marker)
    uid = os.getuid()
    if not holders or any(u != uid for u in holders.values()) or len(markers) != 1:
        return None
    run_id = markers.pop()
    if run_id is None or any(supervised(pid, run_id) for pid in holders):
        return None
    sessions = set()
    for pid in holders:
        fields = stat_fields(pid)
        if fields is not None:
            sessions.add(int(fields[3]))
    return run_id, holders, sessions.pop() if len(sessions) == 1 else None


def end_orphan(state_dir: str, info: dict[str, object], grace: float, by: str,
               lock_pids: list[int] | None = None, path: str | None = None) -> list[int]:
    """If the slot at `path`, whose record is `info`, is held by an orphan
    -- runner and keeper gone -- whose processes are all our user's: end
    them (TERM, the run's grace, KILL) and write the run's history line
    (caller_gone). Returns the pids ended; [] if it is not an orphan, or
    not ours to end. The record only holds back (`holder_state` must say
    orphaned too); what is ended is the kernel's word (`orphan_in_slot`).
    `lock_pids` as for holder_state."""
    if path is None or holder_state(info, lock_pids) != "orphaned":
        return []
    evidence = orphan_in_slot(path)
    if evidence is None:
        return []
    run_id, holders, session = evidence
    uid = os.getuid()
    if info.get("run_id") != run_id:
        info = {"run_id": run_id}  # the record is not this run's (stale, or written by someone else)

    def find() -> dict[int, int]:
        procs = run_processes(session=session, marker=run_id)
        procs.update((p, u) for p, u in holders.items() if start_ticks(p) is not None)
        return {p: u for p, u in procs.items() if u == uid}

    procs = find()
    if not procs:
        return []
    g = info.get("grace")
    if isinstance(g, (int, float)) and not isinstance(g, bool) and 0 <= g <= 3600:
        grace = float(g)
    from .. import history
    from .terminate import end_processes

    # The line first: we may be killed while the processes get their grace
    # (a waiting run does this, and waiting runs get killed), and then
    # nobody would write it -- the slot is free, no orphan is left to find.
    # Should we die before the end, the next head ends them and writes the
    # line again: the history keeps one per run id.
    since = info.get("since")
    since = since if isinstance(since, (int, float)) else None
    pool, _, index = os.path.basename(path).rpartition(".")  # slots/<pool>.<n>
    history.append(state_dir, history.run_record(
        run_id=run_id, label=info.get("label"), cls=info.get("cls"), host=info.get("host"), pool=pool or None,
        slot=f"{pool}#{index}" if pool and index.isdigit() else None, ticket=info.get("ticket"),
        budget=info.get("budget"), kept=info.get("kept"), outcome="caller_gone", exit_code=None, uid=uid,
        message=f"runner and keeper gone; its orphaned command (pids {', '.join(map(str, sorted(procs)))}) "
                f"was ended by {by}",
        phases={"slot": since, "started": since, "ended": time.time()}))
    return end_processes(find, grace)


def heal_slots(state_dir: str, pool: str, count: int, grace: float, healed: set[str], by: str,
               table: dict[tuple[int, int], list[int]] | None = None) -> list[str]:
    """End the orphaned holders of `pool`'s slots that are ours to end
    (end_orphan), each once: `healed` holds the run ids already ended and
    gains the new ones. Returns what was done, one line each. `table`: the
    kernel's lock table (proclocks.owners()), read here if not given."""
    from .proclocks import owners, pids_on
    from .slot import read_slot, slot_path

    if table is None:
        table = owners()
    locked = None if table is None else set(table)
    done: list[str] = []
    for i in range(count):
        is_held, info = read_slot(state_dir, pool, i, locked)
        if not is_held or not info or str(info.get("run_id")) in healed:
            continue
        path = slot_path(state_dir, pool, i)
        ended = end_orphan(state_dir, info, grace, by=by, lock_pids=pids_on(path, table), path=path)
        if ended:
            healed.add(str(info.get("run_id")))
            done.append(f"ended the orphaned command of run {info.get('run_id')} on {pool}#{i} (pids "
                        f"{', '.join(map(str, ended))}): its runner and keeper were gone")
    return done


def end_lost(session: int | None, session_start: int | None, marker: str, grace: float) -> list[int]:
    """A keeper was killed: end its command's processes -- the session it
    led, and anything that carries the run's marker -- (TERM, grace, KILL).
    They are not the caller's children, and they hold the slot until they
    are gone. Returns the pids ended."""
    from .terminate import end_processes

    return end_processes(lambda: run_processes(session=session, session_start=session_start, marker=marker),
                         grace)


def orphan_processes(info: dict[str, object]) -> dict[int, int]:
    """The processes of an orphaned holder (pid -> uid), from its record:
    the command's session and the run's marker."""
    cmd = info.get("cmd")
    cmd_start = info.get("cmd_start")
    run_id = info.get("run_id")
    marker = run_id if isinstance(run_id, str) and is_run_id(run_id) else None
    if marker is None:
        return {}  # a record anyone could have written names no processes of ours
    session = cmd if isinstance(cmd, int) and not isinstance(cmd, bool) and cmd > 1 else None
    # The record is only a hint (in a shared state dir others can write the
    # slot file): a session counts only if its leader carries the run's
    # marker, so a forged record cannot point at someone's login session.
    if session is not None and run_marker(session) != marker:
        session = None
    return run_processes(session=session, session_start=cmd_start if isinstance(cmd_start, int) else None,
                         marker=marker)
