"""`slotq report --html FILE`: a timeline page of this host's runs."""

from __future__ import annotations

import os
import time

from slotq.cli.args import Opt, Parser
from slotq.errors import UsageError

PARSER = Parser(
    prog="slotq report", usage="slotq report --html FILE [--since T] [--until T]",
    description="Write one self-contained HTML page (no network needed to view it) of the runs on this host "
                "in a time window: a lane per slot with each run as a bar coloured by outcome (hover for "
                "label, user, waited, ran, exit), each run's wait before it, the queue length over time, and "
                "per pool the p50/p95 wait, utilisation per slot and runs per outcome.",
    options=[
        Opt("--html", metavar="FILE", required=True, help="where to write the page"),
        Opt("--since", metavar="T", default="24h",
            help="window start: a duration ago (2h, 7d), an ISO time or epoch seconds (default: 24h)"),
        Opt("--until", metavar="T", help="window end (default: now)"),
    ],
)


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    from slotq.cli.args import JsonResult
    from slotq.cli.history import query
    from slotq.config import HostConfig, state_dir_from_env
    from slotq.durations import parse_when
    from slotq.report import build, render_html

    now = time.time()
    try:
        since = parse_when(opts.since, now, what="--since")
        until = parse_when(opts.until, now, what="--until") if opts.until else now
    except ValueError as e:
        raise UsageError(str(e)) from None
    if until <= since:
        raise UsageError("--until is not after --since")
    out = JsonResult(opts.html, "--html")  # checked now: a bad path is a usage error before any work; written whole
    try:
        state_dir = state_dir_from_env()
        runs, _ = query(state_dir, HostConfig.load(state_dir=state_dir).retention, since=since, until=until)
        page = render_html(build(runs, since, until, os.uname().nodename))
        out.write(lambda: page)
    finally:
        out.discard()
    return 0
