"""A line as its waiting runs report it, shared by one user's waiting runs.

Every waiting run reports every 30 s how many are ahead and who holds the
slot. Worked out afresh, that reads the kernel's lock table (/proc/locks:
two entries per waiter) and lists every ticket: with a thousand in line,
33 reports a second at 5-15 ms each kept the machine a quarter busy while
nothing moved. So a run that works the line out writes what it found to
its user's own file in the state dir, and a run of that user NEAR or more
places from the head uses a view at most MAX_AGE old. Nearer the head,
where the numbers change fastest and the head heals orphaned holders, the
view is always fresh. (A run that came to the head within a view's few
seconds reports its old place once; its next report -- and the healing a
report at the head does -- is worked out afresh: nobody behind it writes a
view that puts it NEAR or more from the head.)

The file is trusted only as the host config cache is: this user's own
regular file, writable by nobody else, read with limits -- a first line
of JSON (at most MAX_HEADER bytes: when, the slots as `status.holders`
gave them, and the typical runs -- the pool's, its labels' and users' --
as the writer last read them from the history, for the ETA), then the live tickets' numbers in line order,
separated by spaces (at most MAX_VIEW bytes in all). Anything else is no
view: the run works the line out itself. (The typical run spares every
run far back its own read of the history for its first ETA: at N=300
that read was half of all the CPU a line burnt in its first 30 s.)
"""

from __future__ import annotations

import os

NEAR = 8  # this close to the head (or closer), a run works its line out afresh
MAX_AGE = 5.0  # seconds a view is used for
MAX_HEADER = 64 * 1024
MAX_VIEW = 4 * 1024 * 1024  # a line of ~200,000 tickets
MAX_KINDS = 64  # labels and users with a typical run of their own (history/eta.py: at most 2 * 50 // 3)

_DIGITS = b"0123456789"

# What a report says of each slot: what a waiting run's status line shows
# (client.waitlines.format_queued, status.describe_orphan) and its ETA uses. The
# rest of a holder record stays in `slotq status`: every field here is
# written, read and parsed again by each report of a long line.
REPORTED = frozenset(("slot", "held", "error", "label", "user", "held_s", "budget", "phase", "lock_holders",
                      "run_id", "pid", "orphan_pids", "orphan_user"))

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..history.eta import Basis as Typical  # the typical runs: (seconds, how many runs, when read, kinds)
    from .hostqueue import Waiter


def survey(state_dir: str, pool: str, waiter: Waiter | Onlooker, now: float,
           heal: Callable[[dict[tuple[int, int], list[int]] | None], list[str]], typical: Typical | None = None
           ) -> tuple[int, int, list[dict[str, object]], list[str], Typical | None]:
    """The line as `waiter`'s status report tells it: (ahead, waiting,
    slots, notes, the typical run shared with it). NEAR or more from the
    head, from this user's view; else afresh -- the kernel's lock table
    read once -- and shared as the view, with our `typical`. At the head,
    `heal(table)` first ends orphaned holders; what it did are the
    notes."""
    from .status import holders
    from .proclocks import owners

    view = read(state_dir, pool, waiter.ticket.seq, now)
    if view is not None and view[0] >= NEAR:
        ahead, total, slots, shared = view
        return ahead, total, slots, [], shared
    table = owners()
    locked = None if table is None else set(table)
    ahead, total, live = waiter.line(table)
    notes = heal(table) if ahead == 0 else []
    if notes:  # a holder was ended: the table is stale
        table = locked = None
    slots = [{k: v for k, v in s.items() if k in REPORTED}
             for s in holders(state_dir, pool, waiter.slot_count, now, locked, table)]
    if total > NEAR:  # someone may be far enough back to use it
        write(state_dir, pool, live, slots, now, typical)
    return ahead, total, slots, notes, None


def report(state_dir: str, pool: str, waiter: Waiter | Onlooker, now: float,
           heal: Callable[[dict[tuple[int, int], list[int]] | None], list[str]], typical: Typical | None,
           with_eta: bool) -> tuple[dict[str, object], Typical | None]:
    """What `waiter`'s `queued` event says besides its wait: its place in
    `pool`'s line, the holders, the orphaned holders `heal` ended (`survey`),
    the machine's load and, `with_eta`, the expected wait from the pool's
    `typical` run -- returned as well, brought up to date, for the next
    report."""
    from ..history import eta
    from .status import load

    ahead, total, slots, healed, shared = survey(state_dir, pool, waiter, now, heal, typical)
    fields: dict[str, object] = {}
    if with_eta:
        # The ETA from the second report on: the first comes the moment
        # a run must wait, often for a slot that frees in milliseconds,
        # and reading the history then would cost every short wait (and
        # the hand-over it competes with for the CPU) a few ms. (Not
        # "after 50 ms of waiting": on a busy machine the first report
        # itself comes later than that -- 200 callers at once paid ~20 ms
        # of CPU each for ETAs nobody saw.)
        typical = eta.basis(state_dir, pool, now, typical, shared)
        fields = eta.report_fields(slots, ahead, typical)
    from .drain import read as read_drain

    drain = read_drain(state_dir, pool)
    if drain is not None:  # no ETA: the wait lasts until the owner resumes the pool
        fields = {"drained": drain.as_json()}
    return {"ahead": ahead, "position": ahead + 1, "waiting": total, "pool": pool, "holders": slots,
            "notes": healed, **fields, **load()}, typical


class Onlooker:
    """A run's place in line as one who is not its runner sees it: the
    attacher of a kept run whose process waits away (host/away.py) or
    quietly says nothing (host/follow.py). What `survey` and `report` need
    of a waiter: its ticket (`seq`, `path`), the pool's slots, `line`."""

    def __init__(self, state_dir: str, pool: str, seq: int, slot_count: int) -> None:
        from .line import TICKET_SUFFIX, pool_dir

        self.pdir = pool_dir(state_dir, pool)
        self.seq = seq
        self.path = os.path.join(self.pdir, f"{seq:016d}{TICKET_SUFFIX}")
        self.slot_count = slot_count
        self.ticket = self

    def line(self, table: dict[tuple[int, int], list[int]] | None = None) -> tuple[int, int, list[int]]:
        from .line import place

        return place(self.pdir, self.path, table)


def view_path(state_dir: str, pool: str) -> str:
    # One per user and pool, in the user's private state: a view another user
    # wrote is not trusted, and a name in the state dir could be taken first.
    from ..config import private_state_path

    return private_state_path(state_dir, "line-view", pool)


def read(state_dir: str, pool: str, seq: int, now: float
         ) -> tuple[int, int, list[dict[str, object]], Typical | None] | None:
    """(ahead, waiting, slots, typical run) for ticket `seq` from this
    user's view of `pool`, if there is one at most MAX_AGE old that has
    `seq` in it; else None. The typical run is None if the view has none
    (or a malformed one)."""
    from ..records import from_json
    from ..statefile import read_private

    raw = read_private(view_path(state_dir, pool), MAX_VIEW)
    if raw is None:
        return None
    header, nl, tail = raw.partition(b"\n")
    if not nl or len(header) > MAX_HEADER:
        return None
    try:
        head = from_json(header.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(head, dict):
        return None
    at, slots = head.get("at"), head.get("slots")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not isinstance(slots, list):
        return None
    if not now - MAX_AGE <= at <= now + 1.0 or not all(isinstance(s, dict) for s in slots):
        return None
    if tail.translate(None, _DIGITS + b" \n"):
        return None  # not numbers and spaces
    live = tail.split()
    try:
        ahead = live.index(b"%d" % seq)
    except ValueError:
        return None  # not in it (joined since): work it out
    for s in slots:
        held = s.get("held_s")
        if isinstance(held, (int, float)) and not isinstance(held, bool):
            s["held_s"] = round(held + max(0.0, now - at), 3)
    return ahead, len(live), slots, _typical(head.get("typical"))


def _typical(value: object) -> Typical | None:
    """[seconds > 0, runs >= 0, when read, (the kinds' typical runs)] -- or
    None."""
    if not isinstance(value, list) or len(value) not in (3, 4):
        return None
    seconds, runs, when = value[:3]
    if any(isinstance(v, bool) for v in value) or not isinstance(runs, int) or runs < 0:
        return None
    if not isinstance(seconds, (int, float)) or not 0 < seconds < 1e9 or not isinstance(when, (int, float)):
        return None
    kinds = _kinds(value[3] if len(value) == 4 else {})
    return None if kinds is None else (float(seconds), runs, float(when), kinds)


def _kinds(value: object) -> dict[str, list[float]] | None:
    """{"label:..." or "user:...": [seconds > 0, runs > 0]}, of at most
    MAX_KINDS -- or None."""
    if not isinstance(value, dict) or len(value) > MAX_KINDS:
        return None
    for key, typical in value.items():
        if not key.startswith(("label:", "user:")) or not isinstance(typical, list) or len(typical) != 2:
            return None
        seconds, runs = typical
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < 1e9 \
                or isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            return None
    return value


def write(state_dir: str, pool: str, live: list[int], slots: list[dict[str, object]], now: float,
          typical: Typical | None = None) -> None:
    """Share a line just worked out with this user's other waiting runs
    (best effort: a view that cannot be written is simply not shared)."""
    from ..records import to_json
    from ..statefile import write_private

    try:
        header = to_json({"at": now, "slots": slots, **({"typical": list(typical)} if typical else {})})
    except (TypeError, ValueError):
        return
    data = b"%s\n%s\n" % (header.encode(), " ".join(map(str, live)).encode())
    if len(header) > MAX_HEADER or len(data) > MAX_VIEW:
        return
    from ..statefile import make_private_dirs

    path = view_path(state_dir, pool)
    try:
        make_private_dirs(os.path.dirname(path))
    except OSError:
        return
    write_private(path, data)
