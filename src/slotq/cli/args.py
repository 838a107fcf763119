"""Argument parsing shared by `run` and `host run`: one-line errors, durations."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from slotq.durations import parse_duration
from slotq.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slotq.transport import SshTransport


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line and a UsageError (exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def duration(what: str, allow_zero: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            return parse_duration(text, allow_zero=allow_zero)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = what  # argparse names the type in its message
    return parse


def split_command(args: list[str]) -> tuple[list[str], list[str] | None]:
    """Options before `--`, the command after it (None if no `--`)."""
    if "--" in args:
        i = args.index("--")
        return args[:i], args[i + 1 :]
    return args, None


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--class", dest="cls", default="shared", metavar="CLASS",
                   help="run class; the host maps it to a pool (default: shared; landing has its own slot)")
    p.add_argument("--budget", type=duration("--budget"), metavar="D",
                   help="how long the command may run once it has started (default: the host's, 60m); "
                        "time spent waiting in line never counts")
    p.add_argument("--prepare", metavar="CMD",
                   help="shell command run after the slot is acquired, before the command (its own limit)")
    p.add_argument("--prepare-timeout", type=duration("--prepare-timeout"), metavar="D",
                   help="limit for --prepare (default: the host's, 10m)")
    p.add_argument("--kill-grace", type=duration("--kill-grace", allow_zero=True), metavar="D",
                   help="TERM -> KILL grace when the command is stopped (default: 10s)")
    p.add_argument("--label", metavar="TEXT", help="how this run is shown to others (default: user: command)")
    p.add_argument("--report-every", type=duration("--report-every"), default=30.0, metavar="D",
                   help="queue status interval while waiting (default: 30s)")


def require_command(p: argparse.ArgumentParser, command: list[str] | None) -> list[str]:
    if not command:
        raise UsageError(f"no command given: write it after `--`, e.g. `{p.prog} -- pytest -q`")
    if command[0] == "":
        raise UsageError("the command name is empty")
    return command


def add_host_options(p: argparse.ArgumentParser) -> None:
    import os

    p.add_argument("--host", metavar="HOST[,HOST...]",
                   help="run on HOST over ssh (an alias from your ssh config, or user@host); "
                        "several: the one with the shortest expected wait")
    p.add_argument("--ssh-config", default=os.environ.get("SLOTQ_SSH_CONFIG"), metavar="FILE",
                   help="ssh config file (default: $SLOTQ_SSH_CONFIG, else ssh's own)")
    p.add_argument("--ssh-option", action="append", default=[], metavar="OPT",
                   help="extra ssh -o option, e.g. --ssh-option Port=2222 (repeatable)")
    p.add_argument("--remote-slotq", default=os.environ.get("SLOTQ_REMOTE_SLOTQ", "slotq"), metavar="CMD",
                   help="how to run slotq on the host, a shell fragment "
                        "(default: $SLOTQ_REMOTE_SLOTQ, else slotq)")


def ssh_transport(opts: argparse.Namespace, host: str, sync: str = "rsync") -> "SshTransport":
    from slotq.transport import SshTransport

    return SshTransport(host, config=opts.ssh_config, options=opts.ssh_option,
                        remote_slotq=opts.remote_slotq, sync=sync)
