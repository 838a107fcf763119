"""Several hosts: pick the one with the shortest expected wait.

The expected wait is history/eta.py's (the typical run time from the host's recent
runs, holders' time left, the line ahead, the slots). Ties go to the host with fewer busy slots and waiters,
then to the order given.
"""

from __future__ import annotations

from ..durations import format_duration

DEFAULT_RUN = 60.0


def expected_wait(snapshot: dict[str, object], cls: str, default_run: float = DEFAULT_RUN) -> tuple[float, str]:
    """(seconds, why) for a new run of class `cls` on the host whose
    `slotq status --json` is `snapshot`; inf if the host has no such class.
    The estimate is history/eta.py's."""
    from ..history import eta

    pools = snapshot.get("pools")
    pool = None
    if isinstance(pools, list):
        pool = next((p for p in pools if isinstance(p, dict) and cls in (p.get("classes") or [])), None)
    if pool is None:
        return float("inf"), f"no class {cls!r} there"
    records = [h for h in snapshot.get("history") or [] if isinstance(h, dict)]  # type: ignore[attr-defined]
    typical, runs = eta.typical_run(records, str(pool.get("pool")))
    typical = typical if runs else default_run
    slots = [s for s in pool.get("slots") or [] if isinstance(s, dict)]
    if not slots:
        return float("inf"), "no slots"
    waiting = len(pool.get("waiting") or [])
    busy = sum(1 for s in slots if s.get("held"))
    why = (f"{busy} of {len(slots)} slot(s) busy, {waiting} waiting, "
           f"typical run {format_duration(typical)}{'' if runs else ' (assumed)'}")
    return eta.expected_wait(slots, waiting, typical), why


def describe_choice(ranked: list[tuple[float, str, str]], n: int = 1) -> str:
    """One line: the `n` chosen hosts and why, then the others."""
    def one(w: float, h: str, y: str) -> str:
        return f"{h}: {'unavailable' if w == float('inf') else '~' + format_duration(w)} ({y})"

    best_wait, best, why = ranked[0]
    if n == 1:
        line, sep = f"slotq: chose host {best}: expected wait {format_duration(best_wait)} ({why})", "; "
    else:
        line = (f"slotq: waiting on {', '.join(h for _, h, _ in ranked[:n])}, the first slot won taken: "
                + "; ".join(one(*r) for r in ranked[:n]))
        sep = "; not on "
    others = [one(*r) for r in ranked[n:]]
    return line + sep + "; ".join(others) if others else line


def rank_hosts(hosts: list[str], cls: str, fetch: "Fetch") -> list[tuple[float, str, str]]:
    """Ask every host for its status at once; (expected wait, host, why),
    best first (ties keep the order given)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(host: str) -> tuple[float, int, str, str]:
        try:
            snap = fetch(host)
        except Exception as e:  # unreachable, no slotq, bad answer
            return float("inf"), 0, host, str(e)
        try:
            wait, why = expected_wait(snap, cls)
            return wait, _crowd(snap, cls), host, why
        except (TypeError, ValueError, AttributeError, KeyError):  # JSON, but not a status we can read
            return float("inf"), 0, host, f"host {host}: unreadable status"

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
