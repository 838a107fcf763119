"""`slotq history`: finished runs on this host, sacct-like."""

from __future__ import annotations

import json
import sys
import time
from typing import Callable

from slotq.cli.args import FLAG, Opt, Parser, bounded_text, parse_window, positive_int, window_options
from slotq.spec import MAX_TEXT
from slotq.errors import UsageError

MAX_NAMES = 100


def _names(what: str) -> Callable[[str], list[str]]:
    """A converter for `a,b,c` (sacct's lists): the names, blanks dropped;
    an error if none is left (`--user "$U"` with U unset must not list
    nothing, or everything)."""
    def convert(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        if not names:
            raise ValueError(f"no {what} named")
        if len(names) > MAX_NAMES:
            raise ValueError(f"more than {MAX_NAMES} {what}s")
        return names
    return convert


def _at_least_one(text: str) -> int:
    n = positive_int(text)
    if n < 1:
        raise ValueError("must be at least 1")
    return n


PARSER = Parser(
    prog="slotq history",
    usage="slotq history [--since T] [--until T] [--user U,...] [--label TEXT] [--outcome O,...] [--class C,...] "
          "[--limit N] [--json]",
    description="Every finished run on this host in a time window, oldest first: run id, user, class, slot, "
                "when it was submitted, how long it waited and ran, outcome, whom it blames, exit code and "
                "label. Runs cancelled or gone while waiting in line are included, with their wait. Kept for "
                "the host config's [history] retention (default 180d).",
    options=[
        *window_options(),
        Opt("--user", metavar="U[,U...]", convert=_names("user"), help="only these users' runs"),
        # --label "$L" with L unset must not list every run
        Opt("--label", metavar="TEXT", convert=bounded_text(MAX_TEXT["label"], blank="label"),
            help="only runs whose label contains TEXT"),
        Opt("--outcome", metavar="O[,O...]", convert=_names("outcome"),
            help="only runs that ended so (passed, failed, exec_timeout, ...)"),
        Opt("--class", dest="cls", metavar="C[,C...]", convert=_names("class"), help="only runs of these classes"),
        Opt("--limit", metavar="N", convert=_at_least_one, help="only the newest N of them"),
        Opt("--json", kind=FLAG, help="machine-readable output (a list of runs, the fields of `run --json`)"),
    ],
)


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    from slotq.config import HostConfig, state_dir_from_env
    from slotq.outcome import Outcome

    since, until = parse_window(opts)
    for name in opts.outcome or ():
        try:
            Outcome(name)
        except ValueError:
            raise UsageError(f"--outcome {name!r} is not an outcome slotq knows "
                             f"({', '.join(sorted(Outcome._members))})") from None
    state_dir = state_dir_from_env()
    config = HostConfig.load(state_dir=state_dir)
    runs, skipped = query(state_dir, config.retention, since=since, until=until, user=opts.user,
                          label=opts.label, outcome=opts.outcome, cls=opts.cls, limit=opts.limit)
    if opts.json:
        json.dump(runs, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(format_runs(runs))
    if skipped:
        sys.stderr.write(f"slotq history: {skipped} corrupt line(s) in the history were skipped\n")
    return 0


def query(state_dir: str, retention: float, **filters: object) -> tuple[list[dict[str, object]], int]:
    """Catch the index up and query it; StateDirError if it cannot be."""
    import sqlite3

    from slotq.errors import StateDirError
    from slotq.historydb import Index

    try:
        index = Index(state_dir, retention)
        if index.unkept is not None:
            sys.stderr.write(f"slotq: note: the history index cannot be kept ({index.unkept}); reading the "
                             "history without it (set SLOTQ_LEDGER or XDG_STATE_HOME to a writable place)\n")
        try:
            index.catch_up()
            return index.query(**filters), index.skipped  # type: ignore[arg-type]
        finally:
            index.close()
    except (OSError, sqlite3.Error) as e:
        raise StateDirError(f"cannot read the run history of {state_dir}: {e}", state_dir) from None


def format_runs(runs: list[dict[str, object]]) -> str:
    from slotq.durations import format_duration
    from slotq.records import printable

    def dur(v: object) -> str:
        return format_duration(float(v)) if isinstance(v, (int, float)) else "-"

    def when(v: object) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v)) if isinstance(v, (int, float)) else "-"

    header = ("RUN_ID", "USER", "CLASS", "SLOT", "SUBMITTED", "WAITED", "RAN", "OUTCOME", "BLAME", "EXIT", "LABEL")
    rows = [header]
    for r in runs:
        ph: dict[str, object] = r["phases"]  # type: ignore[assignment]
        rows.append((printable(r["run_id"] or "-", 16), printable(r["user"] or "-", 16),
                     printable(r["class"] or "-", 20), printable(r["slot"] or "-", 24),
                     when(ph.get("submitted") or ph.get("started") or ph.get("ended")), dur(r["waited_s"]),
                     dur(r["ran_s"]), printable(r["outcome"] or "-", 16), printable(r["blame"] or "-", 16),
                     "-" if r["exit_code"] is None else str(r["exit_code"]), printable(r["label"] or "", 60)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"{len(runs)} run(s)")
    return "\n".join(lines) + "\n"
