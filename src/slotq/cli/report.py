"""`slotq report --html FILE`: a timeline page of this host's runs."""

from __future__ import annotations

import os
import sys
import time

from slotq.cli.args import (SLURM_RUNS_HERE, Namespace, Opt, Parser, host_options, parse_window, reader_exits,
                            window_options)

PARSER = Parser(
    prog="slotq report", usage="slotq report --html FILE [--since T] [--until T] [--host HOST,...]",
    description="Write one self-contained HTML page (no network needed to view it) of the runs on this host "
                "in a time window: a lane per slot with each run as a bar coloured by outcome (hover for "
                "label, user, waited, ran, exit), each run's wait before it, the queue length over time, and "
                "per pool the p50/p95 wait, utilisation per slot and runs per outcome. With --host, the hosts' own "
                "runs, over ssh.",
    epilog=reader_exits("a host (--host) could not be asked (the page shows the others)",
                        bad="bad arguments (an --html file that cannot be written too)"),
    hints={"--slurm": SLURM_RUNS_HERE},
    options=[
        Opt("--html", metavar="FILE", required=True, help="where to write the page"),
        *window_options(),
        *host_options("HOST's runs", "several: one page, a lane per host and slot"),
    ],
)


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    from slotq.cli.args import JsonResult
    from slotq.cli.history import query
    from slotq.config import HostConfig, state_dir_to_read
    from slotq.errors import HostUnavailable
    from slotq.history.report import build, render_html

    since, until = parse_window(opts)
    out = JsonResult(opts.html, "--html")  # checked now: a bad path is a usage error before any work; written whole
    unreachable: list[str] = []
    try:
        if opts.host:
            runs, unreachable = _remote(opts, since, until)
            name = opts.host.replace(",", ", ")
        else:
            state_dir = state_dir_to_read()
            runs, _ = query(state_dir, HostConfig.load(state_dir=state_dir), since=since, until=until)
            name = os.uname().nodename
        if unreachable and not runs:
            raise HostUnavailable("; ".join(unreachable), host=opts.host)  # no page of nothing
        page = render_html(build(runs, since, until, name))
        if not out.write(lambda one_line: page):
            from slotq.errors import OutputError

            return OutputError.exit_code  # (said, naming the file)
    finally:
        out.discard()
    # What was written: a window with no runs in it is then no mystery.
    span = " to ".join(time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) for t in (since, until))
    from slotq.records import printable

    where = "stdout" if opts.html == "-" else printable(opts.html, 500)
    sys.stderr.write(f"slotq report: wrote {where}: {len(runs)} run(s) from {span}\n")
    for line in unreachable:
        sys.stderr.write(f"slotq report: error: {line} (the page shows the other hosts)\n")
    return HostUnavailable.exit_code if unreachable else 0


def _remote(opts: Namespace, since: float, until: float) -> tuple[list[dict[str, object]], list[str]]:
    """The runs of each host in --host, oldest first; with several, each
    slot and pool named after its host (`ci1:shared#0`): a lane each. (A
    Slurm job's slot is not: its lanes are named after its host already.)"""
    from slotq.cli.history import ended, remote_runs

    by_host, unreachable = remote_runs(opts, ["--since", repr(since), "--until", repr(until)])
    several = len(opts.host.split(",")) > 1
    runs = []
    for host, host_runs in by_host:
        for r in host_runs:
            if several:
                for key in ("slot", "pool", "class"):
                    if r[key] and not (key == "slot" and str(r[key]).startswith("slurm job ")):
                        r[key] = f"{host}:{r[key]}"
            runs.append(r)
    return sorted(runs, key=ended), unreachable
