"""Several hosts: pick the one with the shortest expected wait.

The estimate is deliberately simple and explainable: every run is assumed
to take the host's typical run time (the median of its recent runs, or a
default), held slots free up when their holder reaches it (half a typical
run more if it is already past it), and the waiting line takes slots in
order before us. Ties go to the host with fewer busy slots and waiters,
then to the order given.
"""

from __future__ import annotations

import heapq
import statistics

from .durations import format_duration

DEFAULT_RUN = 60.0


def expected_wait(snapshot: dict[str, object], cls: str, default_run: float = DEFAULT_RUN) -> tuple[float, str]:
    """(seconds, why) for a new run of class `cls` on the host whose
    `slotq status --json` is `snapshot`; inf if the host has no such class."""
    pools = snapshot.get("pools")
    pool = None
    if isinstance(pools, list):
        pool = next((p for p in pools if isinstance(p, dict) and cls in (p.get("classes") or [])), None)
    if pool is None:
        return float("inf"), f"no class {cls!r} there"
    runs = [h.get("ran_s") for h in snapshot.get("history") or [] if isinstance(h, dict)]  # type: ignore[attr-defined]
    ran = [float(r) for r in runs if isinstance(r, (int, float)) and r > 0]
    typical = statistics.median(ran) if ran else default_run
    slots = [s for s in pool.get("slots") or [] if isinstance(s, dict)]
    if not slots:
        return float("inf"), "no slots"
    free_at = sorted(0.0 if not s.get("held") else _remaining(float(s.get("held_s") or 0), typical)
                     for s in slots)
    waiting = len(pool.get("waiting") or [])
    for _ in range(waiting):
        t = heapq.heappop(free_at)
        heapq.heappush(free_at, t + typical)
    busy = sum(1 for s in slots if s.get("held"))
    why = (f"{busy} of {len(slots)} slot(s) busy, {waiting} waiting, "
           f"typical run {format_duration(typical)}{'' if ran else ' (assumed)'}")
    return free_at[0], why


def _remaining(held: float, typical: float) -> float:
    """A busy slot frees at the typical run's end; one already past it is
    still busy, so it gets half a typical run more (never "free now")."""
    return typical - held if held < typical else typical / 2


def describe_choice(ranked: list[tuple[float, str, str]]) -> str:
    """One line: the chosen host and why, then the others."""
    best_wait, best, why = ranked[0]
    line = f"slotq: chose host {best}: expected wait {format_duration(best_wait)} ({why})"
    others = [f"{h}: {'unavailable' if w == float('inf') else '~' + format_duration(w)} ({y})"
              for w, h, y in ranked[1:]]
    return line + ("; " + "; ".join(others) if others else "")


def rank_hosts(hosts: list[str], cls: str, fetch: "Fetch") -> list[tuple[float, str, str]]:
    """Ask every host for its status at once; (expected wait, host, why),
    best first (ties keep the order given)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(host: str) -> tuple[float, int, str, str]:
        try:
            snap = fetch(host)
        except Exception as e:  # unreachable, no slotq, bad answer
            return float("inf"), 0, host, str(e)
        wait, why = expected_wait(snap, cls)
        return wait, _crowd(snap, cls), host, why

    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        results = list(pool.map(one, hosts))
    order = {h: i for i, h in enumerate(hosts)}
    results.sort(key=lambda r: (r[0], r[1], order[r[2]]))
    return [(wait, host, why) for wait, _, host, why in results]


def _crowd(snapshot: dict[str, object], cls: str) -> int:
    """Busy slots + waiters in the pool of `cls`: the tie-breaker."""
    for p in snapshot.get("pools") or []:  # type: ignore[attr-defined]
        if isinstance(p, dict) and cls in (p.get("classes") or []):
            return sum(1 for s in p.get("slots") or [] if s.get("held")) + len(p.get("waiting") or [])
    return 0


TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Fetch = Callable[[str], dict[str, object]]
