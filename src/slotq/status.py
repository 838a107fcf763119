"""What a host's queue looks like right now: pools, slots and their holders,
tickets in order with their wait so far, machine load, recent history."""

from __future__ import annotations

import os


from . import history, orphans
from .config import HostConfig
from .durations import format_duration
from .slot import read_slot, slot_name
from .proclocks import held as held_locks
from .ticket import list_tickets, live_tickets, pool_dir, probe, read_info, remove_stale_temps


def load() -> dict[str, object]:
    try:
        l1, l5, l15 = os.getloadavg()
    except OSError:
        l1 = l5 = l15 = 0.0
    return {"load1": round(l1, 2), "load5": round(l5, 2), "load15": round(l15, 2),
            "cores": os.cpu_count() or 1}


def holders(state_dir: str, pool: str, count: int, now: float,
            locked: set[tuple[int, int]] | None = None) -> list[dict[str, object]]:
    """One entry per slot of `pool`: held or free, and the holder record.
    `locked`: the kernel's lock table (proclocks.held()); read if not given.

    The phase shown is the truth about the holder's processes, not just what
    its record says: `running` (or `prepare`) only while its runner lives,
    `stopping` while only its keeper does (it is ending the command),
    `orphaned` when both are gone and the command still holds the slot --
    then with the orphan's pids and user. Nothing is signalled here."""
    if locked is None:
        locked = held_locks()
    out: list[dict[str, object]] = []
    for i in range(count):
        held, info = read_slot(state_dir, pool, i, locked)
        entry: dict[str, object] = {"slot": slot_name(pool, i), "held": held}
        if held and info:
            entry.update({k: info.get(k) for k in ("run_id", "label", "pid", "pid_start", "keeper", "cmd", "since",
                                                   "budget", "cls")})
            entry["phase"] = state = orphans.holder_state(info)
            since = info.get("since")
            if isinstance(since, (int, float)):
                entry["held_s"] = round(max(0.0, now - since), 3)
            if state == "orphaned":
                procs = orphans.orphan_processes(info)
                entry["orphan_pids"] = sorted(procs)
                entry["orphan_user"] = ", ".join(sorted({orphans.user_name(u) for u in procs.values()})) or None
        out.append(entry)
    return out


def waiting(state_dir: str, pool: str, now: float,
            locked: set[tuple[int, int]] | None = None) -> list[dict[str, object]]:
    """Live tickets of `pool`, earliest first (dead ones are skipped)."""
    pdir = pool_dir(state_dir, pool)
    remove_stale_temps(pdir)
    out: list[dict[str, object]] = []
    live = live_tickets(pdir, locked)
    if live is not None:
        # Tickets whose holder died and nobody has looked at since (the last
        # in a line): removed, with their run's history line (ticket.bury).
        listed = {path for _, path in live}
        for _, path in list_tickets(pdir):
            if path not in listed:
                probe(path)
    for seq, path in list_tickets(pdir) if live is None else live:
        info = read_info(path)  # read first: a dead ticket is removed by probe
        if live is None and not probe(path):
            continue
        entry: dict[str, object] = {"seq": seq}
        if info:
            entry.update({k: info.get(k) for k in ("run_id", "label", "pid", "since", "budget", "cls")})
            since = info.get("since")
            if isinstance(since, (int, float)):
                entry["waited_s"] = round(max(0.0, now - since), 3)
        out.append(entry)
    return out


def snapshot(state_dir: str, config: HostConfig, now: float, history_n: int = 10) -> dict[str, object]:
    pools = []
    locked = held_locks()
    for pool, count in config.pools.items():
        pools.append({
            "pool": pool,
            "slots": holders(state_dir, pool, count, now, locked),
            "waiting": waiting(state_dir, pool, now, locked),
            "classes": sorted(c for c, p in config.classes.items() if p == pool),
        })
    return {
        "host": os.uname().nodename,
        "state_dir": state_dir,
        "at": now,
        **load(),
        "pools": pools,
        "history": history.recent(state_dir, history_n),
    }


def describe_orphan(s: dict[str, object]) -> str:
    """One line for a slot held by an orphaned command."""
    pids: list[object] = s.get("orphan_pids") or []  # type: ignore[assignment]
    if not pids:
        return (f"{s.get('slot')} held by processes with no live slotq runner or keeper (run {s.get('run_id')}, "
                f"runner pid {s.get('pid')} gone)")
    return (f"{s.get('slot')} held by orphaned processes of user {s.get('orphan_user') or '?'} "
            f"(pids {', '.join(map(str, pids))}): runner pid {s.get('pid')} and its keeper are gone")


def format_snapshot(snap: dict[str, object]) -> str:
    lines = [f"host {snap['host']}  load {snap['load1']}/{snap['cores']} cores  state {snap['state_dir']}"]
    for p in snap["pools"]:  # type: ignore[attr-defined]
        lines.append(f"pool {p['pool']} ({len(p['slots'])} slot(s); classes: {', '.join(p['classes'])})")
        for s in p["slots"]:
            if s["held"]:
                held = format_duration(float(s.get("held_s") or 0))
                budget = s.get("budget")
                b = f", budget {format_duration(float(budget))}" if isinstance(budget, (int, float)) else ""
                lines.append(f"  {s['slot']}: {s.get('label') or '?'} (run {s.get('run_id')}, pid {s.get('pid')}, "
                             f"{s.get('phase') or '?'}, held {held}{b})")
                if s.get("phase") == "orphaned":
                    lines.append("    " + describe_orphan(s))
            else:
                lines.append(f"  {s['slot']}: free")
        if p["waiting"]:
            for n, w in enumerate(p["waiting"], 1):
                lines.append(f"  waiting {n}: {w.get('label') or '?'} (run {w.get('run_id')}, pid {w.get('pid')}, "
                             f"waited {format_duration(float(w.get('waited_s') or 0))})")
        else:
            lines.append("  nobody waiting")
    hist = snap.get("history") or []
    if hist:
        lines.append("recent runs:")
        for h in hist:  # type: ignore[attr-defined]
            lines.append(f"  {h.get('outcome', '?'):14} waited {format_duration(float(h.get('waited_s') or 0)):>7} "
                         f"ran {format_duration(float(h.get('ran_s') or 0)):>7}  {h.get('label', '')}")
    return "\n".join(lines)
