"""What a host's queue looks like right now: pools, slots and their holders,
tickets in order with their wait so far, machine load, recent history."""

from __future__ import annotations

import os
import stat

from .. import history, procinfo
from ..config import HostConfig
from ..durations import format_duration
from ..records import printable
from ..statefile import StateFileError, kind, open_state
from . import orphans
from .claim import CLAIM_WINDOW
from .line import MAX_PER_OWNER, ignored, list_tickets, pool_dir, probe, read_info, remove_stale_temps, scan
from .proclocks import describe_holders, held_by_owner, holder_pids, owners
from .slot import read_slot, slot_name, slot_path

Table = dict[tuple[int, int], list[int]]


def load() -> dict[str, object]:
    try:
        l1, l5, l15 = os.getloadavg()
    except OSError:
        l1 = l5 = l15 = 0.0
    return {"load1": round(l1, 2), "load5": round(l5, 2), "load15": round(l15, 2),
            "cores": os.cpu_count() or 1}


def holders(state_dir: str, pool: str, count: int, now: float,
            locked: set[tuple[int, int]] | None = None, table: Table | None = None) -> list[dict[str, object]]:
    """One entry per slot of `pool`: held or free, and the holder record.
    `table`, `locked`: the kernel's lock table (proclocks.owners(), and
    its keys as a set); read if not given.

    The phase shown is the truth about the holder's processes, not just what
    its record says: `running` (or `prepare`) only while its runner lives,
    `stopping` while only its keeper does (it is ending the command),
    `orphaned` when both are gone and the command still holds the slot --
    then with the orphan's pids and user. Nothing is signalled here."""
    if table is None:
        table = owners()
    if locked is None:
        locked = None if table is None else set(table)
    out: list[dict[str, object]] = []
    for i in range(count):
        entry: dict[str, object] = {"slot": slot_name(pool, i), "held": False}
        path = slot_path(state_dir, pool, i)
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                raise StateFileError(f"slot file {path} is {kind(st.st_mode)}, not a regular file: "
                                     "no run can take this slot", path)
        except FileNotFoundError:
            pass
        except StateFileError as e:
            entry["error"] = str(e)
            out.append(entry)
            continue
        try:
            held, info = read_slot(state_dir, pool, i, locked)
        except StateFileError as e:
            entry["error"] = str(e)
            out.append(entry)
            continue
        entry["held"] = held
        if held:
            # Who, from the kernel: the processes holding the lock and their
            # user -- not a label anyone could have written.
            _lock_holders(entry, slot_path(state_dir, pool, i), table)
        if held and not info:
            entry["phase"] = "no record"
        lock_pids = entry.get("lock_pids")
        state = None
        if held and info:
            state = orphans.holder_state(info, lock_pids if isinstance(lock_pids, list) else None)
        if state == "starting":
            entry["phase"] = state  # the record is the previous holder's: nothing of it is shown
        elif held and info:
            entry.update({k: info.get(k) for k in ("run_id", "label", "pid", "pid_start", "keeper", "cmd", "since",
                                                   "budget")})
            _kept(entry, info)
            entry["class"] = info.get("cls")
            entry["phase"] = state
            since = info.get("since")
            if isinstance(since, (int, float)):
                entry["held_s"] = round(max(0.0, now - since), 3)
            if state == "orphaned":
                procs = orphans.orphan_processes(info)
                entry["orphan_pids"] = sorted(procs)
                entry["orphan_user"] = ", ".join(sorted({procinfo.user_name(u) for u in procs.values()})) or None
        out.append(entry)
    return out


def _kept_note(entry: dict[str, object]) -> str:
    kept, also = entry.get("kept"), entry.get("also_waiting_on")
    note = f" [kept: its caller may be away, lease {format_duration(float(kept['lease_s']))}]" \
        if isinstance(kept, dict) else ""
    if isinstance(also, list) and also:
        from ..records import printable

        note += f" [also waiting on {printable(', '.join(also), 300)}: the first slot it gets is the one it takes]"
    return note


def _kept(entry: dict[str, object], info: dict[str, object]) -> None:
    """A kept run (host/kept.py) says its lease, a late-bound run
    (transports/bound.py) the other hosts it waits on: shown, never acted
    on."""
    lease, bind = info.get("kept"), info.get("bind")
    if isinstance(lease, (int, float)) and not isinstance(lease, bool) and 0 < lease < 1e9:
        entry["kept"] = {"lease_s": float(lease)}
    if isinstance(bind, list):
        entry["also_waiting_on"] = [str(h)[:255] for h in bind[:64]]


def _lock_holders(entry: dict[str, object], path: str, table: Table | None) -> None:
    if table is None:
        return
    try:
        st = os.stat(path)
    except OSError:
        return
    pids = holder_pids(st.st_dev, st.st_ino, table)
    if pids:
        entry["lock_pids"] = pids
        uids = sorted({u for u in (procinfo.uid_of(p) for p in pids) if u is not None})
        entry["user"] = ", ".join(procinfo.user_name(u) for u in uids)
        if len(uids) == 1:
            entry["uid"] = uids[0]
        entry["lock_holders"] = describe_holders(st.st_dev, st.st_ino, table)


def waiting(state_dir: str, pool: str, now: float, table: Table | None = None,
            foreign: list[dict[str, object]] | None = None) -> list[dict[str, object]]:
    """Live tickets of `pool` in line order (dead ones are skipped). Each
    names its user: the ticket file's owner, set by the kernel. `table`:
    the kernel's lock table; a ticket locked there only by another user
    than its owner is no place in line: it goes to `foreign` instead."""
    pdir = pool_dir(state_dir, pool)
    remove_stale_temps(pdir)
    out: list[dict[str, object]] = []
    entries = scan(pdir)
    if table is not None:
        # Tickets whose holder died and nobody has looked at since (the last
        # in a line): removed, with their run's history line (ticket.bury).
        for e in entries:
            if (e.dev, e.ino) not in table:
                probe(e.path)
        uids: dict[int, int | None] = {}
        live = [e for e in entries if (e.dev, e.ino) in table]
        entries = [e for e in live if held_by_owner(table, (e.dev, e.ino), e.uid, uids)]
        if foreign is not None:
            foreign += [{"seq": e.seq, "user": procinfo.user_name(e.uid), "path": e.path,
                         "held_by": describe_holders(e.dev, e.ino, table)} for e in live if e not in entries]
    for e in entries:
        info = read_info(e.path)  # read first: a dead ticket is removed by probe
        if table is None and not probe(e.path):
            continue
        entry: dict[str, object] = {"seq": e.seq, "user": procinfo.user_name(e.uid), "uid": e.uid,
                                    "ticket_age_s": round(max(0.0, now - e.ctime_ns / 1e9), 3)}
        if e.forged:
            entry["forged"] = True
        if info:
            entry.update({k: info.get(k) for k in ("run_id", "label", "pid", "since", "budget")})
            entry["class"] = info.get("cls")
            _kept(entry, info)
            from .away import is_away

            if is_away(info.get("pid")):
                entry["away"] = True  # a shell until shortly before its turn (host/away.py)
            since = info.get("since")
            if isinstance(since, (int, float)) and not isinstance(since, bool):
                entry["waited_s"] = round(max(0.0, now - since), 3)
        else:
            entry["no_record"] = True
        out.append(entry)
    return out


def snapshot(state_dir: str, config: HostConfig, now: float, history_n: int = 10) -> dict[str, object]:
    pools: list[dict[str, object]] = []
    table = owners()
    locked = None if table is None else set(table)
    warnings = list(config.warnings)
    foreign: list[dict[str, object]] = []
    from .drain import read as read_drain

    for pool, count in config.pools.items():
        drain = read_drain(state_dir, pool)
        pools.append({
            "pool": pool,
            "slots": holders(state_dir, pool, count, now, locked, table),
            "waiting": waiting(state_dir, pool, now, table, foreign),
            "classes": sorted(c for c, p in config.classes.items() if p == pool),
            "drained": drain.as_json() if drain is not None else None,
        })
    warnings += problems(state_dir, config, pools, table)
    warnings += [f"ignored: ticket {f['seq']} of user {f['user']} ({f['path']}) is locked by {f['held_by']}, "
                 "not by its owner (a run that died, its ticket locked since by someone else): no place in line"
                 for f in foreign]
    from ..history.eta import RECENT, pool_etas

    records = history.once_each(history.recent(state_dir, max(history_n, RECENT * len(pools))))
    for p in pools:
        p["eta"] = pool_etas(p, records)
    return {
        "host": os.uname().nodename,
        "state_dir": state_dir,
        "at": now,
        **load(),
        "pools": pools,
        "warnings": warnings,
        "history": records[-history_n:] if history_n > 0 else [],
    }


def problems(state_dir: str, config: HostConfig, pools: list[dict[str, object]], table: Table | None) -> list[str]:
    """What is wrong with the state dir, in one line each: a ticket counter
    held, tickets out of order, odd files, and a directory
    several users share that `slotq host init` did not set up."""
    out: list[str] = []
    seq = os.path.join(state_dir, "seq")
    try:
        st = os.lstat(seq)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        out.append(f"the ticket counter {seq} is not a regular file: no run can join the line")
    elif st is not None:
        who = describe_holders(st.st_dev, st.st_ino, table) if table is not None else ""
        if who:
            out.append(f"the ticket counter {seq} is locked by {who}: new runs cannot join the line while "
                       "it is held (honest runs hold it for microseconds)")
    hist = os.path.join(state_dir, "history.jsonl")
    try:
        hst = os.lstat(hist)
        if not stat.S_ISREG(hst.st_mode):
            out.append(f"state file {hist} is {kind(hst.st_mode)}, not a regular file: runs are not recorded "
                       "(remove it; `slotq host init` makes a proper one)")
        elif hst.st_size > history.SPOOL_LIMIT:
            out.append(f"the history spool {hist} has grown to {hst.st_size >> 20} MiB (slotq moves it on at "
                       f"{history.SPOOL_BYTES >> 20} MiB): someone wrote to it by hand; only its end is read")
    except OSError:
        pass
    for p in pools:
        for s in p["slots"]:  # type: ignore[attr-defined]
            if s.get("error"):
                out.append(str(s["error"]))
            elif s.get("held") and s.get("phase") == "no record":
                out.append(f"{s['slot']} is held with no slotq record by {s.get('lock_holders') or '?'}")
        if table is not None:
            for owner, names in ignored(pool_dir(state_dir, str(p["pool"])), set(table)).items():
                user = procinfo.user_name(owner)
                first = next((e for e in names if e is not None), None)
                if len(names) == 1 and first is not None:
                    what = f"{first.path}, a ticket name of user {user} that nobody holds"
                else:
                    what = (f"{len(names)} ticket names of user {user} that nobody holds (or past the first "
                            f"{MAX_PER_OWNER} of theirs) in pool {p['pool']}"
                            + (f", the first {first.path}" if first is not None else ""))
                out.append(f"ignored: {what}: no place in line, and they move no ticket number (only their "
                           "owner or root can remove them)")
        head = p["waiting"][0] if p["waiting"] else None  # type: ignore[index]
        free = any(not s.get("held") for s in p["slots"])  # type: ignore[attr-defined]
        if head is not None and free and float(head.get("ticket_age_s") or 0) > CLAIM_WINDOW:
            out.append(f"ticket {head['seq']} of user {head.get('user')} is at the head of pool {p['pool']}'s line "
                       f"and leaves a free slot untaken: the runs behind it pass it over after "
                       f"{CLAIM_WINDOW:g} s (its place is kept for when it claims one)")
        for w in p["waiting"]:  # type: ignore[attr-defined]
            if w.get("forged"):
                out.append(f"ticket {w['seq']} of user {w.get('user')} in pool {p['pool']} was renamed or "
                           "numbered out of order: it is placed at the back of the line")
            elif w.get("no_record"):
                out.append(f"ticket {w['seq']} in pool {p['pool']} is held by user {w.get('user')} with no "
                           "readable slotq record")
    out += setup_problems(state_dir)
    return out


def setup_problems(state_dir: str) -> list[str]:
    """A state dir that several users share must be made by `slotq host
    init` (see the README): sticky directories, and files nobody but root
    can replace. Say what is missing, if it is shared."""
    try:
        top = os.stat(state_dir)
    except OSError:
        return []
    shared_mode = bool(top.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
    dirs = [state_dir, os.path.join(state_dir, "slots"), os.path.join(state_dir, "tickets")]
    uids: set[int] = {top.st_uid}
    for d in dirs[1:]:
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        uids.add(e.stat(follow_symlinks=False).st_uid)
                    except OSError:
                        pass
        except OSError:
            pass
    if not shared_mode and len(uids) <= 1:
        return []  # private: one user's
    missing = []
    for d in dirs:
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            missing.append(f"{d} is writable by others but not sticky (anyone can delete or replace "
                           "another user's files there)")
    try:
        with os.scandir(dirs[1]) as it:
            foreign = sorted(e.name for e in it if e.stat(follow_symlinks=False).st_uid not in (0, top.st_uid))
    except OSError:
        foreign = []
    if foreign:
        missing.append(f"slot files not made by `slotq host init`: {', '.join(foreign[:5])}")
    if not missing:
        return []
    return [f"state dir {state_dir} is shared by several users but not set up for it "
            f"(run `slotq host init --shared {state_dir} --group GROUP` as root): " + "; ".join(missing)]


def describe_orphan(s: dict[str, object]) -> str:
    """One line for a slot held by an orphaned command."""
    return printable(_describe_orphan(s), 500)


def _describe_orphan(s: dict[str, object]) -> str:
    pids: list[object] = s.get("orphan_pids") or []  # type: ignore[assignment]
    if not pids:
        return (f"{s.get('slot')} held by processes with no live slotq runner or keeper (run {s.get('run_id')}, "
                f"runner pid {s.get('pid')} gone)")
    return (f"{s.get('slot')} held by orphaned processes of user {s.get('orphan_user') or '?'} "
            f"(pids {', '.join(map(str, pids))}): runner pid {s.get('pid')} and its keeper are gone")


def _bar(held: float, budget: object, width: int = 20) -> str:
    """`[#######-------------]`: the time held against the budget."""
    if not isinstance(budget, (int, float)) or budget <= 0:
        return ""
    n = min(width, int(width * held / budget))
    return "[" + "#" * n + "-" * (width - n) + "] "


_COLORS = {"passed": "32", "failed": "31", "exec_timeout": "33", "idle_timeout": "33", "unavailable": "35",
           "backstop": "35", "cancelled": "2", "caller_gone": "2"}


def _eta_words(eta: object) -> str:
    from ..history.eta import eta_words

    return eta_words(eta.get("s"), eta.get("at_most_s")) if isinstance(eta, dict) else "unknown"


def format_snapshot(snap: dict[str, object], bars: bool = False, color: bool = False) -> str:
    """The status as text. `bars`: each holder's time against its budget
    as a bar (the live view); `color`: outcomes in colour (a terminal,
    without NO_COLOR)."""
    name, reached_as = printable(snap["host"], 200), snap.get("reached_as")
    if isinstance(reached_as, str) and reached_as != name:  # a remote host: the name you gave, and its own
        name = f"{printable(reached_as, 200)} ({name})"
    lines = [f"host {name}  load {snap['load1']}/{snap['cores']} cores  state {printable(snap['state_dir'], 4096)}"]
    for p in snap["pools"]:  # type: ignore[attr-defined]
        lines.append(f"pool {p['pool']} ({len(p['slots'])} slot(s); classes: {', '.join(p['classes'])})")
        drained = p.get("drained")
        if isinstance(drained, dict):
            from .drain import describe

            lines.append(f"  {describe(None, drained)}: no new command starts; running ones finish, "
                         "waiting ones keep their places")
        for s in p["slots"]:
            if s["held"]:
                held = format_duration(float(s.get("held_s") or 0))
                budget = s.get("budget")
                b = f", budget {format_duration(float(budget))}" if isinstance(budget, (int, float)) else ""
                if s.get("phase") == "no record":
                    lines.append(f"  {s['slot']}: held with no slotq record by {s.get('lock_holders') or '?'}")
                    continue
                if s.get("phase") == "starting":
                    lines.append(f"  {s['slot']}: just taken by {s.get('lock_holders') or '?'} (starting)")
                    continue
                lines.append(f"  {s['slot']}: {printable(s.get('label') or '?')} (user {s.get('user') or '?'}, "
                             f"run {printable(s.get('run_id'))}, pid {s.get('pid')}, "
                             f"{printable(s.get('phase') or '?')}, held {held}{b})" + _kept_note(s))
                if bars and isinstance(budget, (int, float)):
                    lines.append(f"    {_bar(float(s.get('held_s') or 0), budget)}{held} of "
                                 f"{format_duration(float(budget))}")
                if s.get("phase") == "orphaned":
                    lines.append("    " + describe_orphan(s))
            elif s.get("error"):
                lines.append(f"  {s['slot']}: unusable ({printable(s['error'])})")
            else:
                lines.append(f"  {s['slot']}: free")
        if p["waiting"]:
            for n, w in enumerate(p["waiting"], 1):
                eta = w.get("eta") or {}
                lines.append(f"  waiting {n}: {printable(w.get('label') or '?')} (user {w.get('user') or '?'}, "
                             f"run {printable(w.get('run_id'))}, pid {printable(w.get('pid'))}, "
                             f"waited {format_duration(float(w.get('waited_s') or 0))}, "
                             f"expected wait {_eta_words(eta)})"
                             + (" [waiting away: a shell until shortly before its turn]" if w.get("away") else "")
                             + _kept_note(w)
                             + (" [out of order: placed last]" if w.get("forged") else ""))
        else:
            lines.append("  nobody waiting")
        eta = p.get("eta")
        if isinstance(drained, dict):
            lines.append("  a new run would wait until the pool is resumed")
        elif isinstance(eta, dict):
            lines.append("  a new run would start at once (a slot is free)" if eta.get("s") == 0 else
                         f"  a new run would wait {_eta_words(eta)} ({printable(eta.get('how'), 300)})")
    hist = snap.get("history") or []
    if hist:
        lines.append("recent runs:")
        for h in hist:  # type: ignore[attr-defined]
            outcome = f"{printable(h.get('outcome') or '?', 20):14}"
            if color and h.get("outcome") in _COLORS:
                outcome = f"\x1b[{_COLORS[str(h.get('outcome'))]}m{outcome}\x1b[0m"
            lines.append(f"  {outcome} "
                         f"waited {format_duration(float(h.get('waited_s') or 0)):>7} "
                         f"ran {format_duration(float(h.get('ran_s') or 0)):>7}  {printable(h.get('label') or '')}"
                         + (f" (recorded by {printable(h['recorded_by'], 64)})" if h.get("recorded_by") else ""))
    for w in snap.get("warnings") or []:  # type: ignore[attr-defined]
        lines.append(f"warning: {printable(w, 1000)}")
    return "\n".join(lines)
