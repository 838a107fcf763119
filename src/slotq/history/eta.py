"""Expected waits: when will a place in line get a slot?

Deliberately simple and explainable. A run is assumed to take the typical
run time of runs like it: the median `ran_s` of the recent runs in the
history with its label (which is its command unless it was given one),
else of its user's, else of the pool's -- a label or a user with at least
MIN_KIND runs among the pool's last RECENT. With fewer than MIN_RUNS runs
of the pool the wait is not known: "unknown", never a confident figure
from four 12 ms runs. A held slot frees when its holder reaches its typical
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
    any version reads that as no estimate) and how it was worked out."""
    typical, runs, _, kinds = basis
    eta_s = _eta(slots, [typical] * ahead, typical, runs, kinds)
    return {**({} if eta_s is None else {"eta_s": eta_s}),
            "eta_how": explain(slots, ahead, typical, runs, kinds)}


def like(run: dict[str, object], typical: float, kinds: Kinds) -> tuple[float, str | None]:
    """The typical run of runs like `run` (a holder or a waiter, as status
    gives it: its label, its user): (seconds, the kind it is from), or the
    pool's `typical` and None."""
    for key in (f"label:{run.get('label')}", f"user:{run.get('user')}"):
        found = kinds.get(key)
        if found is not None:
            return found[0], key
    return typical, None


def _eta(slots: list[dict[str, object]], ahead: list[float], typical: float, runs: int,
         kinds: Kinds) -> float | None:
    """The expected wait, rounded; None if the typical run is not known."""
    if runs < MIN_RUNS:
        return None
    expected = expected_wait(slots, len(ahead), typical, kinds, ahead)
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
    if runs < MIN_RUNS:
        known = f"{runs} run(s) of this pool so far" if runs else "no runs of this pool yet"
        return f"{ahead} ahead, {busy} of {len(slots)} slot(s) busy, typical run unknown ({known}; {MIN_RUNS} needed)"
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


def pool_etas(pool: dict[str, object], records: list[dict[str, object]]) -> dict[str, object]:
    """For a pool of `status --json`: each waiter's `eta` and the pool's
    `eta` for a new run, each {"s": seconds, "how": why}. Here the runs
    ahead are known by label and user: each counts as runs like it."""
    typical, runs, kinds = typical_runs(records, str(pool.get("pool")))
    slots = [s for s in pool.get("slots") or [] if isinstance(s, dict)]  # type: ignore[attr-defined]
    waiting = [w for w in pool.get("waiting") or [] if isinstance(w, dict)]  # type: ignore[attr-defined]
    own = [like(w, typical, kinds) for w in waiting]
    ahead_runs = [seconds for seconds, _ in own]
    mates = [0]
    for _, kind in own:
        mates.append(mates[-1] + (kind is not None))
    for i, w in enumerate(waiting):
        w["eta"] = {"s": _eta(slots, ahead_runs[:i], typical, runs, kinds),
                    "how": explain(slots, i, typical, runs, kinds, mates[i])}
    return {"s": _eta(slots, ahead_runs, typical, runs, kinds),
            "how": explain(slots, len(waiting), typical, runs, kinds, mates[-1]),
            "typical_run_s": round(typical, 3) if runs >= MIN_RUNS else None}
