"""`slotq mcp`: an MCP server over stdio, on the official `mcp` SDK (the
optional extra `slotq[mcp]`; nothing else of slotq imports it). Its tools
are in cli/mcptools.py; docs/mcp.md says what each takes and gives.

Each call runs in a worker thread of this process as `slotq run` would
(client/caller.call), the server's event loop free meanwhile: it turns the
run's status lines into progress notifications, and a cancelled call (the
client's `notifications/cancelled`, or its pipe closing) into an
`Interrupt` -- for a kept run, leaving it: it goes on, in its place."""

from __future__ import annotations

import os
import sys

from slotq.cli.args import FLAG, Opt, Parser, duration

ENV_ALLOW = "SLOTQ_MCP_ALLOW_DIRS"  # the allowed work dirs, ':'-separated (as --allow-dir)

PARSER = Parser(
    prog="slotq mcp", usage="slotq mcp [--allow-dir DIR]... [--host H | --slurm] [--class C] [--budget D] [--lease D]",
    description="Serve slotq to an agent's harness over the Model Context Protocol (stdio): tools run_command, "
                "attach_run, run_result, cancel_run and queue_status. A run that has not ended within a call's "
                "wait_for (default 50 s) is left in line, in its place, and attach_run comes back to it; a "
                "cancelled call leaves the run too. Needs the MCP SDK: pip install mcp (from a clone: pip install '.[mcp]'). See "
                "docs/mcp.md.",
    options=[
        Opt("--allow-dir", metavar="DIR", kind="append", default=[],
            help=f"runs may use DIR or a directory below it as their work dir (default: "
                 f"${ENV_ALLOW}, ':'-separated, else the directory the server starts in)"),
        Opt("--host", metavar="HOST", help="run on HOST over OpenSSH by default (default: this machine)"),
        Opt("--slurm", kind=FLAG, help="run on the Slurm cluster by default, as $SLOTQ_BACKEND=slurm does (a "
                                       "call's host still goes to that host)"),
        Opt("--class", dest="cls", metavar="CLASS", help="the runs' class by default (default: shared)"),
        Opt("--budget", metavar="D", convert=duration(), help="the runs' budget by default (default: the host's)"),
        Opt("--lease", metavar="D", convert=duration(minimum=1.0),
            help="how long a left run waits for an attach_run (default: 15m; 1s to 30d)"),
        Opt("--wait-for", metavar="D", convert=duration(allow_zero=True),
            help="how long a call blocks by default (default: 50s; a call's own wait_for wins)"),
        Opt("--check", kind=FLAG, help="only check that the server can start (the SDK, the dirs), then exit 0"),
    ],
)

EX_UNAVAILABLE = 69  # sysexits: the SDK is not installed


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    from slotq.cli.mcptools import WAIT_FOR, Settings
    from slotq.errors import UsageError

    if opts.slurm and opts.host:
        raise UsageError("--slurm and --host name two different places: choose one")
    if opts.slurm:
        os.environ["SLOTQ_BACKEND"] = "slurm"  # for this server's runs and the slotq commands it runs
    allowed = opts.allow_dir or [d for d in os.environ.get(ENV_ALLOW, "").split(":") if d] or [os.getcwd()]
    for d in allowed:
        if not os.path.isdir(d):
            raise UsageError(f"--allow-dir {d!r} is not a directory")
    settings = Settings(allowed, host=opts.host, cls=opts.cls, budget=opts.budget, lease=opts.lease,
                        wait_for=WAIT_FOR if opts.wait_for is None else opts.wait_for)
    import gc

    gc.enable()  # (the launcher starts without it: a server lives long)
    if sys.flags.no_site:  # the launcher's `python -S`: the SDK is in site-packages
        import site

        site.main()
    try:
        import mcp  # noqa: F401
    except ImportError:
        sys.stderr.write("slotq mcp: error: the MCP SDK is not installed: pip install mcp (into slotq's own "
                         "environment; from a clone: pip install '.[mcp]', or scripts/install --mcp)\n")
        return EX_UNAVAILABLE
    if opts.check:
        where = opts.host or ("the Slurm cluster" if opts.slurm else "this machine")
        sys.stdout.write(f"slotq mcp: ready: the MCP SDK {_sdk_version()} is installed; runs go to {where} and "
                         f"may use {', '.join(settings.allowed)} as their work dir\n")
        return 0
    from slotq.cli.mcpserver import serve

    return serve(settings)


def _sdk_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcp")
    except PackageNotFoundError:
        return "(version unknown)"
