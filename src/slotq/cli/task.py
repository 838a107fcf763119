"""`slotq task`: run a job under a budget that waits recorded in the ledger extend."""

from __future__ import annotations

import sys

from slotq.cli.args import FLAG, JsonResult, Opt, Parser, check_dir, duration

EPILOG = """\
When the budget runs out, slotq looks up the waits recorded under --credit-dir
(and below it) since the task started:
  waits not yet credited  -> the budget is extended by them (each wait once)
  a wait still in progress -> look again after --recheck
  nothing new             -> the command's group is ended: budget_exhausted (119)
--deadline is a delivery deadline that nothing extends: deadline (118).
Otherwise the command's own exit code; cancelled (Ctrl-C) 130; bad arguments 64.
"""


PARSER = Parser(
    prog="slotq task", usage="slotq task --budget D [options] -- CMD [ARGS...]", command="required",
    description="Run CMD (in its own process group) under a budget that is extended by the time its work "
                "spent waiting in slotq queues, never by more than that.",
    epilog=EPILOG,
    options=[
        Opt("--budget", metavar="D", convert=duration(), required=True, help="the job's budget, before credits"),
        Opt("--deadline", metavar="D", convert=duration(), help="delivery deadline from now; never extended"),
        Opt("--credit-dir", metavar="DIR", default=".",
            help="whose waits count: runs with this --credit-dir or below it (default: .)"),
        Opt("--credit", metavar="MODE", default="union", choices=("union", "sum"),
            help="union: overlapping waits count once (default); sum: each wait counts"),
        Opt("--recheck", metavar="D", convert=duration(), default=60.0,
            help="while a wait is in progress, look again after D (default: 60s)"),
        Opt("--kill-grace", metavar="D", convert=duration(allow_zero=True), default=10.0,
            help="TERM -> KILL grace when the job is ended (default: 10s)"),
        Opt("--json", metavar="FILE", help="write the result as JSON to FILE (- for stdout)"),
        Opt("-q", "--quiet", kind=FLAG, help="no status lines on stderr, but for the one line of an ending "
                                             "slotq decided (budget exhausted, deadline...) or of a "
                                             "command that could not be started"),
    ],
)


def main(args: list[str]) -> int:
    opts, command = PARSER.parse(args)
    check_dir("--credit-dir", opts.credit_dir)
    from slotq.config import ledger_path

    ledger_path()  # the waits it credits: a bad $SLOTQ_LEDGER is said before the job starts
    json_result = JsonResult(opts.json)
    from slotq.client.deadline import Deadline
    from slotq.client.task import describe_extension, run_task

    def say(line: str) -> None:
        if not opts.quiet:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    try:
        deadline = Deadline(opts.budget, deadline=opts.deadline, credit_dir=opts.credit_dir, credit=opts.credit,
                            recheck=opts.recheck, on_extend=lambda ext: say(describe_extension(ext)))
        result = run_task(command, deadline, grace=opts.kill_grace, say=say)
        final = f"slotq task: {result.outcome.value} after {result.elapsed:.1f}s — {result.message}"
        if opts.quiet and result.said_when_quiet:
            sys.stderr.write(final + "\n")
        else:
            say(final)
        json_result.write(result.to_json)
    finally:
        json_result.discard()
    return result.exit_code
