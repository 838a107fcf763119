"""Expected waits: when will a place in line get a slot?

Deliberately simple and explainable. Every run is assumed to take the
pool's typical run time: the median `ran_s` of its recent runs in the
history. With fewer than MIN_RUNS of them the typical run is not known,
and neither is the wait: "unknown", never a confident figure from four
12 ms runs. A held slot frees when its
holder reaches that time; a holder already past it is expected to run
half as long again as it has so far (never "free now": a run that outlived
the typical one tends to be a long one), and never more than its budget
allows. The line
ahead takes the slots in order, each for a typical run; we get the first
slot that frees after them.
"""

from __future__ import annotations

from ..durations import format_duration, seconds_in

# No `statistics` here: a waiting run computes this, and `statistics` pulls
# in decimal, fractions, random and re -- about 1 MB more in every queued
# caller and its keeper (benchmarks/: memory per waiter).

DEFAULT_RUN = 60.0  # what a host choice assumes of a pool it knows nothing of (client/choose.py)
MIN_RUNS = 5  # runs a typical run is worked out from, at the least
RECENT = 50  # runs of the pool the typical run time is taken from
BASIS_MAX_AGE = 300.0  # a waiting run reads the history for its ETA at most this often

# The pool's typical run as a waiting run keeps it: (seconds, how many runs
# it is from, when it was read).
Basis = tuple[float, int, float]


def typical_run(records: list[dict[str, object]], pool: str | None = None) -> tuple[float, int]:
    """(typical run time, how many runs it is from): the median `ran_s`
    of the last RECENT runs of `pool` (all pools if None, or if a record
    has no pool) that ran."""
    ran = [float(r["ran_s"]) for r in records  # type: ignore[arg-type]
           if isinstance(r.get("ran_s"), (int, float)) and float(r["ran_s"]) > 0  # type: ignore[arg-type]
           and (pool is None or r.get("pool") in (pool, None))][-RECENT:]
    return (_median(ran), len(ran)) if ran else (DEFAULT_RUN, 0)


def basis(state_dir: str, pool: str, now: float, kept: Basis | None, shared: Basis | None) -> Basis:
    """The typical run a waiting run's report uses: the one it `kept`
    while at most BASIS_MAX_AGE old; else the one a run nearer the head
    `shared` in the line view (lineview.py), if that is; else read from the
    history now."""
    if kept is not None and now - kept[2] <= BASIS_MAX_AGE:
        return kept
    if shared is not None and 0 <= now - shared[2] <= BASIS_MAX_AGE:
        return shared
    from .. import history

    return (*typical_run(history.once_each(history.recent(state_dir, 2 * RECENT)), pool), now)


def report_fields(slots: list[dict[str, object]], ahead: int, basis: Basis) -> dict[str, object]:
    """A `queued` report's ETA: `eta_s` (left out if unknown: a client of
    any version reads that as no estimate) and how it was worked out."""
    typical, runs, _ = basis
    eta_s = _eta(slots, ahead, typical, runs)
    return {**({} if eta_s is None else {"eta_s": eta_s}), "eta_how": explain(slots, ahead, typical, runs)}


def _eta(slots: list[dict[str, object]], ahead: int, typical: float, runs: int) -> float | None:
    """The expected wait, rounded; None if the typical run is not known."""
    if runs < MIN_RUNS:
        return None
    expected = expected_wait(slots, ahead, typical)
    return round(expected, 1) if expected < 1e9 else 1e9


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def slot_free_in(held_s: float, typical: float, budget: float | None = None) -> float:
    """Seconds until a slot held for `held_s` frees."""
    left = typical - held_s if held_s < typical else held_s / 2
    if budget is not None and budget > 0:
        left = min(left, max(0.0, budget - held_s))
    return max(0.0, left)


def expected_wait(slots: list[dict[str, object]], ahead: int, typical: float) -> float:
    """Seconds until the run with `ahead` runs before it gets a slot.
    `slots`: status entries (`held`, `held_s`, `budget`)."""
    free_at = sorted(0.0 if not s.get("held") else
                     slot_free_in(seconds_in(s.get("held_s")), typical,
                                  seconds_in(s.get("budget")) if isinstance(s.get("budget"), (int, float)) else None)
                     for s in slots)
    if not free_at:
        return float("inf")
    for _ in range(ahead):  # each run ahead takes the slot that frees first
        free_at[0] += typical
        free_at.sort()
    return free_at[0]


def explain(slots: list[dict[str, object]], ahead: int, typical: float, runs: int) -> str:
    busy = sum(1 for s in slots if s.get("held"))
    if runs < MIN_RUNS:
        known = f"{runs} run(s) of this pool so far" if runs else "no runs of this pool yet"
        return f"{ahead} ahead, {busy} of {len(slots)} slot(s) busy, typical run unknown ({known}; {MIN_RUNS} needed)"
    return (f"{ahead} ahead, {busy} of {len(slots)} slot(s) busy, typical run {format_duration(typical)} "
            f"(median of the pool's last {runs} run(s))")


def pool_etas(pool: dict[str, object], records: list[dict[str, object]]) -> dict[str, object]:
    """For a pool of `status --json`: each waiter's `eta` and the pool's
    `eta` for a new run, each {"s": seconds, "how": why}."""
    typical, runs = typical_run(records, str(pool.get("pool")))
    slots = [s for s in pool.get("slots") or [] if isinstance(s, dict)]  # type: ignore[attr-defined]
    waiting = [w for w in pool.get("waiting") or [] if isinstance(w, dict)]  # type: ignore[attr-defined]
    for i, w in enumerate(waiting):
        w["eta"] = {"s": _eta(slots, i, typical, runs), "how": explain(slots, i, typical, runs)}
    return {"s": _eta(slots, len(waiting), typical, runs), "how": explain(slots, len(waiting), typical, runs),
            "typical_run_s": round(typical, 3) if runs >= MIN_RUNS else None}
