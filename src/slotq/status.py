"""What a host's queue looks like right now: pools, slots and their holders,
tickets in order with their wait so far, machine load, recent history."""

from __future__ import annotations

import os


from . import history
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
    `locked`: the kernel's lock table (proclocks.held()); read if not given."""
    if locked is None:
        locked = held_locks()
    out: list[dict[str, object]] = []
    for i in range(count):
        held, info = read_slot(state_dir, pool, i, locked)
        entry: dict[str, object] = {"slot": slot_name(pool, i), "held": held}
        if held and info:
            entry.update({k: info.get(k) for k in ("run_id", "label", "pid", "phase", "since", "budget", "cls")})
            since = info.get("since")
            if isinstance(since, (int, float)):
                entry["held_s"] = round(max(0.0, now - since), 3)
        out.append(entry)
    return out


def waiting(state_dir: str, pool: str, now: float,
            locked: set[tuple[int, int]] | None = None) -> list[dict[str, object]]:
    """Live tickets of `pool`, earliest first (dead ones are skipped)."""
    pdir = pool_dir(state_dir, pool)
    remove_stale_temps(pdir)
    out: list[dict[str, object]] = []
    live = live_tickets(pdir, locked)
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


def format_snapshot(snap: dict[str, object]) -> str:
    lines = [f"host {snap['host']}  load {snap['load1']}/{snap['cores']} cores  state {snap['state_dir']}"]
    for p in snap["pools"]:  # type: ignore[attr-defined]
        lines.append(f"pool {p['pool']} ({len(p['slots'])} slot(s); classes: {', '.join(p['classes'])})")
        for s in p["slots"]:
            if s["held"]:
                held = format_duration(float(s.get("held_s") or 0))
                budget = s.get("budget")
                b = f", budget {format_duration(float(budget))}" if isinstance(budget, (int, float)) else ""
                lines.append(f"  {s['slot']}: {s.get('label') or '?'} (pid {s.get('pid')}, "
                             f"{s.get('phase') or '?'}, held {held}{b})")
            else:
                lines.append(f"  {s['slot']}: free")
        if p["waiting"]:
            for n, w in enumerate(p["waiting"], 1):
                lines.append(f"  waiting {n}: {w.get('label') or '?'} (pid {w.get('pid')}, "
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
