"""`slotq task`: run a job under a budget that waits recorded in the ledger extend."""

from __future__ import annotations

import argparse
import os
import sys

from slotq.cli.args import Parser, duration, require_command, split_command
from slotq.errors import UsageError

EPILOG = """\
When the budget runs out, slotq looks up the waits recorded under --credit-dir
(and below it) since the task started:
  waits not yet credited  -> the budget is extended by them (each wait once)
  a wait still in progress -> look again after --recheck
  nothing new             -> the command's group is ended: budget_exhausted (119)
--deadline is a delivery deadline that nothing extends: deadline (118).
Otherwise the command's own exit code; cancelled (Ctrl-C) 130; bad arguments 2.
"""


def main(args: list[str]) -> int:
    opts_args, command = split_command(args)
    p = Parser(prog="slotq task", usage="slotq task --budget D [options] -- CMD [ARGS...]",
               description="Run CMD (in its own process group) under a budget that is extended by the "
               "time its work spent waiting in slotq queues, never by more than that.",
               epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=duration("--budget"), required=True, metavar="D",
                   help="the job's budget, before credits")
    p.add_argument("--deadline", type=duration("--deadline"), metavar="D",
                   help="delivery deadline from now; never extended")
    p.add_argument("--credit-dir", default=".", metavar="DIR",
                   help="whose waits count: runs with this --credit-dir or below it (default: .)")
    p.add_argument("--credit", choices=("union", "sum"), default="union",
                   help="union: overlapping waits count once (default); sum: each wait counts")
    p.add_argument("--recheck", type=duration("--recheck"), default=60.0, metavar="D",
                   help="while a wait is in progress, look again after D (default: 60s)")
    p.add_argument("--kill-grace", type=duration("--kill-grace", allow_zero=True), default=10.0, metavar="D",
                   help="TERM -> KILL grace when the job is ended (default: 10s)")
    p.add_argument("--json", metavar="FILE", help="write the result as JSON to FILE (- for stdout)")
    p.add_argument("-q", "--quiet", action="store_true", help="no status lines on stderr")
    p.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    opts = p.parse_args(opts_args)
    if command is None:
        command = opts.command
    command = require_command(p, command)
    if not os.path.isdir(opts.credit_dir):
        raise UsageError(f"--credit-dir {opts.credit_dir}: no such directory")
    from slotq.deadline import Deadline
    from slotq.task import describe_extension, run_task

    def say(line: str) -> None:
        if not opts.quiet:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    deadline = Deadline(opts.budget, deadline=opts.deadline, credit_dir=opts.credit_dir, credit=opts.credit,
                        recheck=opts.recheck, on_extend=lambda ext: say(describe_extension(ext)))
    result = run_task(command, deadline, grace=opts.kill_grace, say=say)
    say(f"slotq task: {result.outcome.value} after {result.elapsed:.1f}s — {result.message}")
    if opts.json:
        text = result.to_json() + "\n"
        if opts.json == "-":
            sys.stdout.write(text)
        else:
            with open(opts.json, "w") as f:
                f.write(text)
    return result.exit_code
