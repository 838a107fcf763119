"""Expected waits: when will a place in line get a slot?

Deliberately simple and explainable. A run is assumed to take the typical
run time of runs like it: the median `ran_s` of the recent runs in the
history with its label (which is its command unless it was given one),
else of its user's, else of the pool's -- a label or a user with at least
MIN_KIND runs among the pool's last RECENT. What is known is said, and no
more: a run first in line with a slot free waits 0; with fewer than
MIN_RUNS runs of the pool there is no estimate (never a confident figure
from four 12 ms runs), but the budgets bound the wait -- each holder's
budget left, and each run ahead's budget -- as "at most"; and where a
budget is not known either, the wait is unknown. A held slot frees when its holder reaches its typical
time; a holder already past it is expected to run half as long again as
it has so far (never "free now": a run that outlived the typical one tends
to be a long one), and never more than its budget allows. The line ahead
takes the slots in order, each run for its typical time (one whose label
and user a report does not know: the pool's); we get the first slot that
frees after them. The explanation names the basis of each figure.
"""

from __future__ import annotations

from ..durations import format_duration, seconds_in

# No `statistics` here: a waiting run computes this, and `statistics` pulls
# in decimal, fractions, random and re -- about 1 MB more in every queued
# caller and its keeper (benchmarks/: memory per waiter).

DEFAULT_RUN = 60.0  # what a host choice assumes of a pool it knows nothing of (client/choose.py)
MIN_RUNS = 5  # runs a typical run is worked out from, at the least
MIN_KIND = 3  # runs of one label (or user) its own typical run is worked out from, at the least
RECENT = 50  # runs of the pool the typical run time is taken from
BASIS_MAX_AGE = 300.0  # a waiting run reads the history for its ETA at most this often

# The typical runs of a kind: "label:<label>" or "user:<name>" -> [seconds,
# how many runs]. Each has MIN_KIND runs or more of the last RECENT: at
# most RECENT // MIN_KIND of each.
Kinds = dict[str, list[float]]
# The pool's typical run as a waiting run keeps it: (seconds, how many runs
# it is from, when it was read, the typical runs of its kinds).
Basis = tuple[float, int, float, Kinds]


def typical_run(records: list[dict[str, object]], pool: str | None = None) -> tuple[float, int]:
    """(typical run time, how many runs it is from): the median `ran_s`
    of the last RECENT runs of `pool` (all pools if None, or if a record
    has no pool) that ran."""
    return _typical(_ran(records, pool))


def typical_runs(records: list[dict[str, object]], pool: str | None = None) -> tuple[float, int, Kinds]:
    """`typical_run`, and the typical run of each label and user with
    MIN_KIND runs or more among those runs."""
    from ..procinfo import user_name

    ran = _ran(records, pool)
    groups: dict[str, list[float]] = {}
    names: dict[int, str] = {}
    for r, seconds in ran:
        label, uid = r.get("label"), r.get("uid")
        if isinstance(label, str) and label:
            groups.setdefault(f"label:{label}", []).append(seconds)
        if isinstance(uid, int) and not isinstance(uid, bool):
            if uid not in names:
                names[uid] = user_name(uid)
            groups.setdefault(f"user:{names[uid]}", []).append(seconds)
    kinds = {k: [_median(v), len(v)] for k, v in groups.items() if len(v) >= MIN_KIND}
    return (*_typical(ran), kinds)


def _typical(ran: list[tuple[dict[str, object], float]]) -> tuple[float, int]:
    """(the median run time, how many runs) of `ran`; DEFAULT_RUN of none."""
    return (_median([s for _, s in ran]), len(ran)) if ran else (DEFAULT_RUN, 0)


def _ran(records: list[dict[str, object]], pool: str | None) -> list[tuple[dict[str, object], float]]:
    """(record, ran_s) of the last RECENT runs of `pool` that ran."""
    return [(r, float(r["ran_s"])) for r in records  # type: ignore[arg-type]
            if isinstance(r.get("ran_s"), (int, float)) and float(r["ran_s"]) > 0  # type: ignore[arg-type]
            and (pool is None or r.get("pool") in (pool, None))][-RECENT:]


def basis(state_dir: str, pool: str, now: float, kept: Basis | None, shared: Basis | None) -> Basis:
    """The typical runs a waiting run's report uses: the ones it `kept`
    while at most BASIS_MAX_AGE old; else the ones a run nearer the head
    `shared` in the line view (lineview.py), if that is; else read from the
    history now."""
    if kept is not None and now - kept[2] <= BASIS_MAX_AGE:
        return kept
    if shared is not None and 0 <= now - shared[2] <= BASIS_MAX_AGE:
        return shared
    from .. import history

    typical, runs, kinds = typical_runs(history.once_each(history.recent(state_dir, 2 * RECENT)), pool)
    return typical, runs, now, kinds


def report_fields(slots: list[dict[str, object]], ahead: int, basis: Basis) -> dict[str, object]:
    """A `queued` report's ETA: `eta_s` (left out if unknown: a client of
    any version reads that as no estimate), or else `eta_max_s` (a bound,
    from the budgets), and how it was worked out. The runs ahead are
    counted, not known: a bound needs none ahead."""
    typical, runs, _, kinds = basis
    eta_s, at_most, how = estimate(slots, [typical] * ahead, typical, runs, kinds, [None] * ahead)
    return {**({} if eta_s is None else {"eta_s": eta_s}), **({} if at_most is None else {"eta_max_s": at_most}),
            "eta_how": how}


def like(run: dict[str, object], typical: float, kinds: Kinds) -> tuple[float, str | None]:
    """The typical run of runs like `run` (a holder or a waiter, as status
    gives it: its label, its user): (seconds, the kind it is from), or the
    pool's `typical` and None."""
    for key in (f"label:{run.get('label')}", f"user:{run.get('user')}"):
        found = kinds.get(key)
        if found is not None:
            return found[0], key
    return typical, None


def estimate(slots: list[dict[str, object]], ahead: list[float], typical: float, runs: int, kinds: Kinds,
             budgets: list[float | None], ahead_like: int = 0) -> tuple[float | None, float | None, str]:
    """(expected wait, or None; else a bound on it, or None; how it was
    worked out) for a run with `ahead` before it (each its typical run,
    each its budget in `budgets`, None where not known)."""
    if not ahead and any(not s.get("held") and not s.get("error") for s in slots):
        return 0.0, None, "a slot is free"
    if runs >= MIN_RUNS:
        expected = expected_wait(slots, len(ahead), typical, kinds, ahead)
        return (round(expected, 1) if expected < 1e9 else 1e9), None, \
            explain(slots, len(ahead), typical, runs, kinds, ahead_like)
    unknown = f"typical run unknown until {MIN_RUNS} runs of this pool, {runs} so far"
    bound = budget_bound(slots, budgets)
    if bound is None:
        return None, None, unknown
    whose = "the holders' budgets left" + (" and the budgets of the runs ahead" if ahead else "")
    return None, round(bound, 1), f"{whose}; {unknown}"


def budget_bound(slots: list[dict[str, object]], budgets: list[float | None]) -> float | None:
    """The longest a run waits behind the holders of `slots` and the runs
    ahead with `budgets`, if each runs its whole budget (a held slot's
    budget less the time it is held); None where a budget it depends on is
    not known."""
    inf = float("inf")
    free_at = sorted(_budget_left(s) for s in slots if not s.get("error"))
    if not free_at:
        return None
    for budget in budgets:  # each run ahead takes the slot that frees first, for its whole budget
        free_at[0] += budget if budget is not None and budget > 0 else inf
        free_at.sort()
    return free_at[0] if free_at[0] < inf else None


def _budget_left(slot: dict[str, object]) -> float:
    """When a slot frees at the latest: now if free; a holder's budget
    less the time it has held it; infinity if its budget is not known."""
    if not slot.get("held"):
        return 0.0
    budget = slot.get("budget")
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or budget <= 0:
        return float("inf")
    return max(0.0, float(budget) - seconds_in(slot.get("held_s")))


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


def expected_wait(slots: list[dict[str, object]], ahead: int, typical: float, kinds: Kinds | None = None,
                  ahead_runs: list[float] | None = None) -> float:
    """Seconds until the run with `ahead` runs before it gets a slot.
    `slots`: status entries (`held`, `held_s`, `budget`, `label`, `user`);
    each holder runs for the typical run of its `kinds`, each run ahead for
    its entry in `ahead_runs` (default: `typical`)."""
    kinds = kinds or {}
    free_at = sorted(0.0 if not s.get("held") else
                     slot_free_in(seconds_in(s.get("held_s")), like(s, typical, kinds)[0],
                                  seconds_in(s.get("budget")) if isinstance(s.get("budget"), (int, float)) else None)
                     for s in slots)
    if not free_at:
        return float("inf")
    for i in range(ahead):  # each run ahead takes the slot that frees first
        free_at[0] += ahead_runs[i] if ahead_runs is not None else typical
        free_at.sort()
    return free_at[0]


def explain(slots: list[dict[str, object]], ahead: int, typical: float, runs: int, kinds: Kinds | None = None,
            ahead_like: int = 0) -> str:
    """How the wait was worked out: the pool's typical run and what it is
    from, the holders' own where runs like them give one, and how many of
    the runs ahead (`ahead_like`) had one of their own."""
    busy = sum(1 for s in slots if s.get("held"))
    words = (f"{ahead} ahead, {busy} of {len(slots)} slot(s) busy, typical run {format_duration(typical)} "
             f"(median of the pool's last {runs} run(s))")
    kinds = kinds or {}
    for s in slots:
        seconds, kind = like(s, typical, kinds) if s.get("held") else (typical, None)
        if kind is not None:
            what = kind.partition(":")[0]
            words += (f"; {s.get('slot')}'s holder {format_duration(seconds)} (median of its {what}'s last "
                      f"{int(kinds[kind][1])} runs)")
    if ahead_like:
        words += f"; {ahead_like} of the runs ahead by runs like them"
    return words


def eta_words(eta_s: object, at_most: object) -> str:
    """An expected wait in words: "~1m30s more", "at most 9m50s" (a bound,
    from the budgets), "0 (a slot is free)" or "unknown"."""
    def number(x: object) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    if number(eta_s):
        return "0 (a slot is free)" if eta_s == 0 else f"~{format_duration(seconds_in(eta_s))} more"
    if number(at_most):
        return f"at most {format_duration(seconds_in(at_most))}"
    return "unknown"


def pool_etas(pool: dict[str, object], records: list[dict[str, object]]) -> dict[str, object]:
    """For a pool of `status --json`: each waiter's `eta` and the pool's
    `eta` for a new run, each {"s": seconds or None, "at_most_s": a bound
    or None, "how": why}. Here the runs ahead are known by label, user and
    budget: each counts as runs like it."""
    typical, runs, kinds = typical_runs(records, str(pool.get("pool")))
    slots = [s for s in pool.get("slots") or [] if isinstance(s, dict)]  # type: ignore[attr-defined]
    waiting = [w for w in pool.get("waiting") or [] if isinstance(w, dict)]  # type: ignore[attr-defined]
    own = [like(w, typical, kinds) for w in waiting]
    ahead_runs = [seconds for seconds, _ in own]
    mates = [0]
    for _, kind in own:
        mates.append(mates[-1] + (kind is not None))
    budgets = [float(b) if isinstance(b := w.get("budget"), (int, float)) and not isinstance(b, bool) else None
               for w in waiting]

    def eta_of(i: int) -> dict[str, object]:
        s, at_most, how = estimate(slots, ahead_runs[:i], typical, runs, kinds, budgets[:i], mates[i])
        return {"s": s, "at_most_s": at_most, "how": how}

    for i, w in enumerate(waiting):
        w["eta"] = eta_of(i)
    return {**eta_of(len(waiting)), "typical_run_s": round(typical, 3) if runs >= MIN_RUNS else None}
