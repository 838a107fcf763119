"""`slotq host run`: the host runner, as transports launch it.

It reads the caller's channel on stdin and writes the framed stream on
stdout; stdin closing means the caller is gone.
"""

from __future__ import annotations

import os

from slotq.cli.args import Parser, add_run_options, require_command, split_command
from slotq.errors import UsageError


def main(args: list[str]) -> int:
    if not args or args[0] != "run":
        raise UsageError("usage: slotq host run [options] -- CMD [ARGS...]")
    opts_args, command = split_command(args[1:])
    p = Parser(prog="slotq host run", description="Host side of one run: queue, slot, command, "
               "framed stream on stdout. Used by transports, not by people.")
    add_run_options(p)
    p.add_argument("--run-id", metavar="ID")
    p.add_argument("--cwd", metavar="DIR", help="work dir of the command (default: the current one)")
    opts = p.parse_args(opts_args)
    command = require_command(p, command)
    from slotq.config import HostConfig, state_dir_from_env
    from slotq.runner import HostRunner
    from slotq.spec import RunSpec

    state_dir = state_dir_from_env()
    config = HostConfig.load(state_dir=state_dir)
    spec = RunSpec(command, cls=opts.cls, budget=opts.budget, prepare=opts.prepare,
                   prepare_timeout=opts.prepare_timeout, label=opts.label, report_every=opts.report_every,
                   kill_grace=opts.kill_grace, cwd=opts.cwd or os.getcwd(), run_id=opts.run_id)
    HostRunner(spec, state_dir=state_dir, config=config, in_fd=0, out_fd=1).run()
    return 0
