"""`slotq metrics [--textfile DIR]`: the host's state in Prometheus's text
format, computed on demand (no daemon): per pool its slots, the busy ones,
the runs waiting, the oldest wait and whether it is drained; from the
history (its SQLite index, caught up: history/index.py) the runs by pool,
outcome and blame, and histograms of the waits and of the commands' run
times. `--textfile DIR` writes it atomically for node_exporter's textfile
collector (docs/operating.md has the cron line and the systemd timer)."""

from __future__ import annotations

import os
import sys

from slotq.cli.args import Opt, Parser

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slotq.config import HostConfig

PARSER = Parser(
    prog="slotq metrics", usage="slotq metrics [--textfile DIR]",
    description="Print this host's queue in the Prometheus text format: per pool slots, busy slots, runs "
                "waiting, the oldest wait, drained or not; from the run history, runs by outcome and blame "
                "(counters over the history kept) and wait and run time histograms. "
                "Exit codes: 0 done, 64 bad arguments, 73 the state dir or history cannot be read, "
                "74 the textfile cannot be written.",
    options=[
        Opt("--textfile", metavar="DIR", help="write DIR/slotq.prom atomically instead (node_exporter's "
                                              "--collector.textfile.directory)"),
    ],
)

FILE = "slotq.prom"
# Seconds: a wait of a hand-over to one of an afternoon; a run of a lint to a
# long test suite.
WAIT_BUCKETS = (0.1, 1.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0)
RUN_BUCKETS = (1.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    from slotq.config import HostConfig, state_dir_to_read

    state_dir = state_dir_to_read()
    config = HostConfig.load(state_dir=state_dir)
    text = render(state_dir, config)
    if opts.textfile is None:
        sys.stdout.write(text)
        return 0
    return write_textfile(opts.textfile, text)


def render(state_dir: str, config: HostConfig) -> str:
    """The whole exposition: the host's pools now, then the history's."""
    import time

    from slotq import __version__

    out = Exposition()
    out.family("slotq_info", "gauge", "slotq on this host (always 1): its version")
    out.sample("slotq_info", {"version": __version__, "host": os.uname().nodename}, 1)
    _pools(out, state_dir, config, time.time())
    _history(out, state_dir, config)
    return out.text()


def _pools(out: Exposition, state_dir: str, config: HostConfig, now: float) -> None:
    from slotq.host.drain import read as read_drain
    from slotq.host.proclocks import owners
    from slotq.host.status import holders, waiting

    table = owners()
    rows = []
    for pool, count in config.pools.items():
        slots = holders(state_dir, pool, count, now, None, table)
        line = waiting(state_dir, pool, now, table)
        # The oldest wait by the kernel's clock (the ticket's making), not
        # by a time written in a ticket another user could set.
        oldest = max((float(w.get("ticket_age_s") or 0.0) for w in line), default=0.0)  # type: ignore[arg-type]
        rows.append((pool, count, sum(1 for s in slots if s.get("held")), len(line), oldest,
                     read_drain(state_dir, pool) is not None))
    for i, (name, kind, help_) in enumerate((
            ("slotq_pool_slots", "gauge", "slots of the pool"),
            ("slotq_pool_busy_slots", "gauge", "slots of the pool held now"),
            ("slotq_pool_waiting_runs", "gauge", "runs waiting in the pool's line now"),
            ("slotq_pool_oldest_wait_seconds", "gauge", "how long the longest-waiting run has waited (0: none)"),
            ("slotq_pool_drained", "gauge", "1 while the pool's owner has drained it (slotq host drain)"))):
        out.family(name, kind, help_)
        for row in rows:
            out.sample(name, {"pool": row[0]}, float(row[i + 1]))


def _history(out: Exposition, state_dir: str, config: HostConfig) -> None:
    import sqlite3

    from slotq.errors import StateDirError
    from slotq.history.index import Index

    try:
        index = Index(state_dir, config.retention)
        try:
            index.catch_up()
            counts = index.counts()
            waits = index.histogram("waited_s", WAIT_BUCKETS)
            ran = index.histogram("ran_s", RUN_BUCKETS)
        finally:
            index.close()
    except (OSError, sqlite3.Error) as e:
        raise StateDirError(f"cannot read the run history of {state_dir}: {e}", state_dir) from None
    out.family("slotq_runs_total", "counter", "runs ended, by pool, outcome and whom the outcome blames "
                                              "(over the history kept: older runs leave it)")
    for pool, outcome, blame, n in counts:
        out.sample("slotq_runs_total", {"pool": pool, "outcome": outcome, "blame": blame}, n)
    for name, help_, buckets, data in (
            ("slotq_wait_seconds", "how long ended runs waited in line", WAIT_BUCKETS, waits),
            ("slotq_run_seconds", "how long ended runs' commands ran", RUN_BUCKETS, ran)):
        out.family(name, "histogram", help_)
        for pool, (le, total, n) in data.items():
            for bound, count in zip(buckets, le):
                out.sample(name + "_bucket", {"pool": pool, "le": _number(bound)}, count)
            out.sample(name + "_bucket", {"pool": pool, "le": "+Inf"}, n)
            out.sample(name + "_sum", {"pool": pool}, total)
            out.sample(name + "_count", {"pool": pool}, n)


class Exposition:
    """Prometheus's text format (version 0.0.4): a family's HELP and TYPE,
    then its samples; label values escaped."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str) -> None:
        escaped = help_.replace("\\", "\\\\").replace("\n", "\\n")
        self.lines += [f"# HELP {name} {escaped}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, labels: dict[str, str], value: float) -> None:
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{body}}} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _escape(value: str) -> str:
    from slotq.records import printable

    return printable(value, 200).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def write_textfile(directory: str, text: str) -> int:
    """DIR/slotq.prom, replaced atomically (a temp name the collector
    ignores, then rename): a scrape never reads half a file."""
    from slotq.errors import OutputError

    path = os.path.join(directory, FILE)
    tmp = os.path.join(directory, f".{FILE}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, text.encode())
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        sys.stderr.write(f"slotq metrics: error: cannot write {path}: {e.strerror or e}\n")
        return OutputError.exit_code
    return 0
