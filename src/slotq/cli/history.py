"""`slotq history`: finished runs on this host, sacct-like."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Callable

from slotq.cli.args import SLURM_RUNS_HERE, FLAG, Namespace, Opt, Parser, bounded_text, host_options, parse_window, \
    positive_int, reader_exits, window_options
from slotq.outcome import Outcome
from slotq.record import from_history
from slotq.spec import MAX_TEXT
from slotq.errors import UsageError

if TYPE_CHECKING:
    from slotq.config import HostConfig

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
          "[--limit N] [--json] [--host HOST,...]",
    description="Every finished run on this host in a time window, oldest first: run id, user, class, slot, "
                "when it was submitted, how long it waited and ran, outcome, whom it blames, exit code and "
                "label. Runs cancelled or gone while waiting in line are included, with their wait. Kept for "
                "the host config's [history] retention (default 180d). With --host, the hosts' own histories, "
                "over ssh.",
    epilog=reader_exits("a host (--host) could not be asked (the others are still listed)"),
    hints={"--slurm": SLURM_RUNS_HERE},
    options=[
        *window_options(),
        Opt("--user", metavar="U[,U...]", convert=_names("user"), help="only these users' runs"),
        # --label "$L" with L unset must not list every run
        Opt("--label", metavar="TEXT", convert=bounded_text(MAX_TEXT["label"], blank="label"),
            help="only runs whose label contains TEXT; with * ? or [...] a shell-style pattern the whole label "
                 "matches (as cancel --label)"),
        Opt("--outcome", metavar="O[,O...]", convert=_names("outcome"), suggest=tuple(sorted(Outcome._members)),
            help="only runs that ended so (passed, failed, exec_timeout, ...)"),
        Opt("--class", dest="cls", metavar="C[,C...]", convert=_names("class"), help="only runs of these classes"),
        Opt("--limit", metavar="N", convert=_at_least_one, help="only the newest N of them"),
        Opt("--json", kind=FLAG, help="machine-readable output (a list of runs, the fields of `run --json`)"),
        *host_options("HOST's history", "several: their runs in one list, with a HOST column"),
    ],
)


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    from slotq.config import HostConfig, state_dir_to_read

    since, until = parse_window(opts)
    for name in opts.outcome or ():
        try:
            Outcome(name)
        except ValueError:
            raise UsageError(f"--outcome {name!r} is not an outcome slotq knows "
                             f"({', '.join(sorted(Outcome._members))})") from None
    if opts.host:
        return _remote(opts, since, until)
    state_dir = state_dir_to_read()
    config = HostConfig.load(state_dir=state_dir)
    runs, skipped = query(state_dir, config, since=since, until=until, user=opts.user,
                          label=opts.label, outcome=opts.outcome, cls=opts.cls, limit=opts.limit)
    if opts.json:
        json.dump([from_history(r) for r in runs], sys.stdout, indent=2)  # the run record (record.py)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(format_runs(runs))
    if skipped:
        sys.stderr.write(f"slotq history: {skipped} corrupt line(s) in the history were skipped\n")
    return 0


def _remote(opts: Namespace, since: float, until: float) -> int:
    """--host: each host's runs (its own `slotq history`, the same filters),
    merged oldest first. A host that cannot be asked does not hide the
    others: its error is said after them, exit 121."""
    from slotq.errors import HostUnavailable

    filters = ["--since", repr(since), "--until", repr(until)]
    for flag, value in (("--user", opts.user), ("--outcome", opts.outcome), ("--class", opts.cls)):
        if value:
            filters += [flag, ",".join(value)]
    if opts.label is not None:
        filters += ["--label", opts.label]
    if opts.limit is not None:
        filters += ["--limit", str(opts.limit)]
    by_host, unreachable = remote_runs(opts, filters)
    runs = sorted((r for _, host_runs in by_host for r in host_runs), key=ended)
    if opts.limit is not None:
        runs = runs[-opts.limit:]
    if opts.json:
        json.dump([from_history(r) for r in runs], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_runs(runs, with_host=len(opts.host.split(",")) > 1))
    sys.stdout.flush()
    for line in unreachable:
        sys.stderr.write(f"slotq history: error: {line}\n")
    return HostUnavailable.exit_code if unreachable else 0


def remote_runs(opts: Namespace, filters: list[str]) -> tuple[list[tuple[str, list[dict[str, object]]]], list[str]]:
    """Each host in --host that answered with its runs (`history --json
    FILTERS` there), and the errors of those that could not be asked."""
    from slotq.errors import HostUnavailable
    from slotq.transports.ssh import SshHost

    by_host: list[tuple[str, list[dict[str, object]]]] = []
    unreachable: list[str] = []
    for name in opts.host.split(","):
        try:
            by_host.append((name, SshHost(name, config=opts.ssh_config, options=opts.ssh_option,
                                          remote_slotq=opts.remote_slotq).history(filters)))
        except HostUnavailable as e:
            unreachable.append(str(e))
    return by_host, unreachable


def ended(run: dict[str, object]) -> float:
    """When a run ended (0 if unknown): the order of a list of hosts' runs."""
    phases = run["phases"]
    at = phases.get("ended") if isinstance(phases, dict) else None
    return float(at) if isinstance(at, (int, float)) else 0.0


def query(state_dir: str, config: HostConfig, **filters: object) -> tuple[list[dict[str, object]], int]:
    """Catch the index up and query it; StateDirError if it cannot be.
    First, the runs whose callers died in line with nobody behind them to
    notice (the last in a line) get their history lines (ticket.bury_dead):
    the history holds every run that has ended, as `slotq status` shows."""
    import sqlite3

    from slotq.errors import StateDirError
    from slotq.history.index import Index
    from slotq.host.line import bury_dead

    bury_dead(state_dir, config.pools)
    try:
        index = Index(state_dir, config.retention)
        if index.unkept is not None:
            sys.stderr.write(f"slotq: note: the history index cannot be kept ({index.unkept}); reading the "
                             "history without it (set SLOTQ_LEDGER or XDG_STATE_HOME to a writable place)\n")
        try:
            index.catch_up()
            for note in index.skipped_files:
                sys.stderr.write(f"slotq: warning: {note}\n")
            return index.query(**filters), index.skipped  # type: ignore[arg-type]
        finally:
            index.close()
    except (OSError, sqlite3.Error) as e:
        raise StateDirError(f"cannot read the run history of {state_dir}: {e}", state_dir) from None


def _command_code(r: dict[str, object]) -> str:
    """The command's own exit code: a history line's `exit_code`; a run
    record's (a newer host's, over ssh) `command_exit_code`."""
    code = r.get("command_exit_code") if "schema_version" in r else r.get("exit_code")
    return "-" if code is None else str(code)


def format_runs(runs: list[dict[str, object]], with_host: bool = False) -> str:
    from slotq.durations import format_duration
    from slotq.records import printable

    def dur(v: object) -> str:
        return format_duration(float(v)) if isinstance(v, (int, float)) else "-"

    def when(v: object) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v)) if isinstance(v, (int, float)) else "-"

    header = ("RUN_ID", *(("HOST",) if with_host else ()), "USER", "CLASS", "SLOT", "SUBMITTED", "WAITED", "RAN",
              "OUTCOME", "BLAME", "EXIT", "LABEL")
    rows = [header]
    for r in runs:
        ph: dict[str, object] = r["phases"] or {}  # type: ignore[assignment]
        host = (printable(r["host"] or "-", 32),) if with_host else ()
        user = printable(r["user"] or "-", 16)
        if r.get("recorded_by"):  # written by another user (a file of theirs): say so
            user += f" (by {printable(r['recorded_by'], 16)})"
        rows.append((printable(r["run_id"] or "-", 16), *host, user,
                     printable(r["class"] or "-", 20), printable(r["slot"] or "-", 24),
                     when(ph.get("submitted") or ph.get("started") or ph.get("ended")), dur(r["waited_s"]),
                     dur(r["ran_s"]), printable(r["outcome"] or "-", 16) + (" (kept)" if r.get("kept") else ""),
                     printable(r["blame"] or "-", 16),
                     _command_code(r), printable(r["label"] or "", 60)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"{len(runs)} run(s)")
    return "\n".join(lines) + "\n"
