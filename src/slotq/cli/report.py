"""`slotq report --html FILE`: a timeline page of this host's runs."""

from __future__ import annotations

import os
from slotq.cli.args import Opt, Parser, parse_window, window_options

PARSER = Parser(
    prog="slotq report", usage="slotq report --html FILE [--since T] [--until T]",
    description="Write one self-contained HTML page (no network needed to view it) of the runs on this host "
                "in a time window: a lane per slot with each run as a bar coloured by outcome (hover for "
                "label, user, waited, ran, exit), each run's wait before it, the queue length over time, and "
                "per pool the p50/p95 wait, utilisation per slot and runs per outcome.",
    options=[
        Opt("--html", metavar="FILE", required=True, help="where to write the page"),
        *window_options(),
    ],
)


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    from slotq.cli.args import JsonResult
    from slotq.cli.history import query
    from slotq.config import HostConfig, state_dir_from_env
    from slotq.report import build, render_html

    since, until = parse_window(opts)
    out = JsonResult(opts.html, "--html")  # checked now: a bad path is a usage error before any work; written whole
    try:
        state_dir = state_dir_from_env()
        runs, _ = query(state_dir, HostConfig.load(state_dir=state_dir).retention, since=since, until=until)
        page = render_html(build(runs, since, until, os.uname().nodename))
        out.write(lambda: page)
    finally:
        out.discard()
    return 0
